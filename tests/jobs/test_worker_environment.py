"""A job worker's environment is an allow-list: the runtime's settings and the one secret the job needs (a judge key
only when the admin declared that variable), never a credential of the server; the sign-in service gets its own
secrets and the database, but no hub token."""
from __future__ import annotations


import pytest

from trainer_core.auth import access
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs.launcher import WorkerLauncher
from trainer_core.specs.model_source import ModelSource

BASE = ModelSource(model=BUNDLED_MODEL)
# What a dashboard's environment may hold besides the runtime's settings: none of it is any worker's business.
FOREIGN_SECRETS = {"DATABASE_URL": "postgresql://studio:db-password@db/studio", "PGPASSWORD": "pg-password",
                   "AWS_SECRET_ACCESS_KEY": "aws-secret", "AWS_ACCESS_KEY_ID": "aws-id", "OPENAI_API_KEY": "sk-openai",
                   "HUGGING_FACE_HUB_TOKEN": "hf-legacy", "HF_API_TOKEN": "hf-api", "STUDIO_PASSWORD": "studio-pw",
                   "HF_TOKEN": "hf-server-token", "WANDB_API_KEY": "wandb-server-key", "JUDGE_API_KEY": "sk-judge",
                   "FINETUNE_STUDIO_PASSWORD": "shared-pw", "FINETUNE_STUDIO_SESSION_KEY": "session-key",
                   "FINETUNE_STUDIO_TOKEN": "cli-token", "FINETUNE_STUDIO_TEST_POSTGRES_URL": "postgresql://u:p@h/d",
                   "GITHUB_TOKEN": "ghp", "MY_SERVICE_PASSWORD": "x"}
RUNTIME = {"PATH": "/usr/bin:/bin", "HOME": "/home/studio", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "OMP_NUM_THREADS": "4", "HF_HOME": "/cache/hf", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "NCCL_DEBUG": "WARN", "TMPDIR": "/tmp", "FINETUNE_STUDIO_STOP_TIMEOUT": "30",
           "FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE": "0"}


@pytest.fixture
def server_env(home, monkeypatch):
    for name, value in {**FOREIGN_SECRETS, **RUNTIME}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(access, "secrets_files", lambda: [])


def worker_env(cfg, tmp_path) -> dict[str, str]:
    return WorkerLauncher().environment(tmp_path, cfg, 1)


def leaked(env: dict[str, str]) -> list[str]:
    return sorted(name for name, value in FOREIGN_SECRETS.items() if env.get(name) == value or value in env.values())


# ====================================================================== the worker's environment
def test_a_worker_gets_the_runtime_settings_and_no_credential_of_the_server(server_env, tmp_path):
    train = worker_env(TrainConfig(model_name=BUNDLED_MODEL), tmp_path)
    assert leaked(train) == []
    assert {k: train[k] for k in RUNTIME if k != "PATH"} == {k: v for k, v in RUNTIME.items() if k != "PATH"}
    serve_like = worker_env(EvalSpec(source=BASE, data="x.jsonl"), tmp_path)  # no judge: nothing secret
    assert leaked(serve_like) == []


def test_each_job_gets_only_the_secret_it_needs(server_env, tmp_path, monkeypatch):
    # A run given an HF token (the form or the CLI) gets that one, as before; nobody else's.
    train = worker_env(TrainConfig(model_name=BUNDLED_MODEL, hf_token="hf-of-this-run"), tmp_path)
    assert train["HF_TOKEN"] == "hf-of-this-run" and leaked(train) == []
    push = worker_env(ExportSpec(source=BASE, push_repo_id="me/model"), tmp_path)  # a hub push needs the token
    assert leaked(push) == ["HF_TOKEN"]
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", "JUDGE_API_KEY")
    judged = EvalSpec(source=BASE, data="x.jsonl", metrics=["judge"], judge_url="https://judge.example/v1",
                      judge_model="m", judge_key_env="JUDGE_API_KEY")
    assert leaked(worker_env(judged, tmp_path)) == ["JUDGE_API_KEY"]
    assert leaked(worker_env(EvalSpec(**{**judged.to_dict(), "source": BASE, "metrics": ["exact"]}), tmp_path)) == []


@pytest.mark.parametrize("name", ["HUGGING_FACE_HUB_TOKEN", "DATABASE_URL", "PGPASSWORD", "AWS_SECRET_ACCESS_KEY",
                                  "OPENAI_API_KEY", "HF_API_TOKEN", "STUDIO_PASSWORD", "HF_TOKEN"])
def test_a_judge_key_is_only_a_variable_the_admin_declared(server_env, tmp_path, monkeypatch, name):
    grab = EvalSpec(source=BASE, data="x.jsonl", metrics=["judge"], judge_url="https://judge.example/v1",
                    judge_model="m", judge_key_env=name)
    problems = [e.message for e in grab._judge_errors() if e.field == "judge_key_env"]
    assert len(problems) == 1 and name in problems[0] and "FINETUNE_STUDIO_JUDGE_KEY_ENVS" in problems[0]
    assert FOREIGN_SECRETS[name] not in worker_env(grab, tmp_path).values()  # a hand-written job.json neither


def test_a_declared_judge_key_is_accepted_and_a_server_secret_never_is(server_env, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", "OPENAI_API_KEY, FINETUNE_STUDIO_PASSWORD")
    judged = EvalSpec(source=BASE, data="x.jsonl", metrics=["judge"], judge_url="https://judge.example/v1",
                      judge_model="m", judge_key_env="OPENAI_API_KEY")
    assert [e for e in judged._judge_errors() if e.field == "judge_key_env"] == []
    assert worker_env(judged, tmp_path)["OPENAI_API_KEY"] == "sk-openai"
    server = EvalSpec(**{**judged.to_dict(), "source": BASE, "judge_key_env": "FINETUNE_STUDIO_PASSWORD"})
    assert [e.field for e in server._judge_errors() if e.field != "judge_url"] == ["judge_key_env"]  # declared or not
    assert "shared-pw" not in worker_env(server, tmp_path).values()


def test_the_sign_in_service_gets_its_secrets_and_the_database_but_no_hub_token(server_env, monkeypatch, tmp_path):
    from gateway import __main__ as gateway_main

    spawned = {}

    def spawn(self, name, cmd, env):
        spawned[name] = env
        raise KeyboardInterrupt  # enough: the sign-in service is the first child

    monkeypatch.setattr(gateway_main, "nginx_binary", lambda: "/bin/true")  # `nginx -t` passes
    monkeypatch.setattr(gateway_main.Share, "_spawn", spawn)
    share = gateway_main.Share(0, env={**FOREIGN_SECRETS, **RUNTIME, "FINETUNE_STUDIO_HOME": str(tmp_path)})
    with pytest.raises(KeyboardInterrupt):
        share.start()
    env = spawned["sign-in"]
    assert leaked(env) == ["DATABASE_URL", "FINETUNE_STUDIO_PASSWORD", "FINETUNE_STUDIO_SESSION_KEY",
                           "FINETUNE_STUDIO_TEST_POSTGRES_URL", "PGPASSWORD"]
