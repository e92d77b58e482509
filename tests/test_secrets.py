"""Secrets (HF token, W&B key) reach the worker through its environment and nowhere else: not argv, not the
database, not any file in the run folder (config, events, logs, checkpoints, adapter), not exported YAML,
not error messages, not the server's own output. Real runs on the tiny model, through the orchestrator
(the form's path) and through the CLI (the environment's path).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest
import yaml

from db.store import Store
from tests.support import MODELS_CACHE, ROOT
from trainer_core.host import hardware
from trainer_core.protocol import paths
from trainer_core.config import SECRET_FIELDS, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import RunStatus

HF_SECRET = "hf_SeCrEt_9f8e7d6c5b4a3210"
WB_SECRET = "wandbkey_0123456789abcdef0123456789abcdef"
# The server's own secrets: set in the server's environment by every test here; no child may see them.
SERVER_SECRETS = {"FINETUNE_STUDIO_PASSWORD": "pw-Server-Only-5e4d3c2b1a",
                  "FINETUNE_STUDIO_OIDC_CLIENT_SECRET": "oidc-ClientSecret-a1b2c3d4e5f6",
                  "FINETUNE_STUDIO_SESSION_KEY": "sessionkey-Zz9Yy8Xx7Ww6Vv5",
                  "FINETUNE_STUDIO_TOKEN": "fts_tokenid_ApiTokenSecret1234567890",
                  # what Streamlit puts in its own environment when secrets.toml holds the password
                  "studio_password": "pw-FromSecretsToml-0f1e2d3c"}
SECRETS = (HF_SECRET, WB_SECRET, *SERVER_SECRETS.values())


def needles() -> list[bytes]:
    """Each secret whole and its distinctive halves (a truncated or split print is still a leak)."""
    out = []
    for secret in SECRETS:
        half = len(secret) // 2
        out += [secret.encode(), secret[:half].encode(), secret[half:].encode()]
    return out


def leaks_in(data: bytes | str) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    return [n.decode() for n in needles() if n in raw]


def files_with_secrets(root: Path) -> dict[str, list[str]]:
    """Every regular file under ``root`` (database, WAL, events, logs, checkpoints, weights) that holds a secret."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            hits = leaks_in(path.read_bytes())
            if hits:
                found[str(path)] = hits
    return found


def _studio_env(mp: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mp.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "home"))
    mp.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    mp.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
    mp.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.delenv("DATABASE_URL", raising=False)
    mp.delenv("HF_TOKEN", raising=False)  # the server's own secrets are not the run's
    mp.delenv("WANDB_API_KEY", raising=False)
    for name, value in SERVER_SECRETS.items():
        mp.setenv(name, value)
    hardware.cuda_available.cache_clear()


@pytest.fixture
def studio_env(tmp_path, monkeypatch):
    _studio_env(monkeypatch, tmp_path)
    yield tmp_path / "home"
    hardware.cuda_available.cache_clear()


def worker_processes(under: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "trainer_core.worker" in cmd and any(arg.startswith(str(under)) for arg in cmd):
            found.append(proc)
    return found


def inspect_worker(proc: psutil.Process) -> tuple[list[str], bytes]:
    """argv of the worker and of its children, and the worker's environment block."""
    argv = list(proc.cmdline())
    for child in proc.children(recursive=True):
        try:
            argv += child.cmdline()
        except psutil.NoSuchProcess:
            pass
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
    return argv, environ


def secret_config(tiny_model: Path, **values) -> TrainConfig:
    base = {"model_name": str(tiny_model), "max_steps": 4, "batch_size": 2, "max_seq_length": 64,
            "warmup_steps": 0, "save_steps": 2, "eval_fraction": 0.1, "eval_steps": 2, "hf_token": HF_SECRET,
            "wandb_token": WB_SECRET, "enable_wandb": False}
    return TrainConfig(**{**base, **values})


# ====================================================================== fast checks
def test_trust_remote_code_is_off_by_default(home):
    assert TrainConfig().trust_remote_code is False
    assert TrainConfig.from_dict({}).trust_remote_code is False
    assert TrainConfig.from_yaml("").trust_remote_code is False
    assert yaml.safe_load(TrainConfig().to_yaml())["trust_remote_code"] is False
    for preset in sorted((ROOT / "presets").glob("*.yaml")):
        assert yaml.safe_load(preset.read_text()).get("trust_remote_code", False) is False, preset


def test_every_export_of_a_config_drops_the_secrets(home):
    cfg = TrainConfig(hf_token=HF_SECRET, wandb_token=WB_SECRET)
    assert set(SECRET_FIELDS) == {"hf_token", "wandb_token"}
    assert cfg.secrets() == {"hf_token": HF_SECRET, "wandb_token": WB_SECRET}
    public = cfg.to_public_dict()
    assert not set(SECRET_FIELDS) & set(public)
    assert leaks_in(cfg.to_yaml()) == [] and leaks_in(json.dumps(public)) == []
    assert leaks_in(repr(cfg.without_secrets())) == []
    assert TrainConfig.from_yaml(cfg.to_yaml()).secrets() == {}  # a round trip through YAML brings none back
    assert cfg.hf_token == HF_SECRET  # exporting did not blank the caller's object


# ====================================================================== real runs (slow)
@pytest.mark.train
def test_form_path_keeps_secrets_out_of_argv_database_files_and_logs(studio_env, tiny_model, capfd):
    home = studio_env
    cfg = secret_config(tiny_model)
    assert cfg.validate() == []
    orch = Orchestrator()
    try:
        run_id = orch.start(cfg)
        run_dir = paths.run_dir(run_id)
        worker = psutil.Process(orch.get_run(run_id).pid)
        argv, environ = inspect_worker(worker)  # while it loads the model: it lives for seconds yet
        snap = orch.wait(run_id, timeout=300, interval=0.2)
        assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{orch.log_tail(run_id)}"

        assert argv[-1] == str(run_dir) and leaks_in(" ".join(argv)) == []
        # The environment is the documented channel: both secrets are there, under their own names only.
        assert f"HF_TOKEN={HF_SECRET}".encode() in environ.split(b"\0")
        assert f"WANDB_API_KEY={WB_SECRET}".encode() in environ.split(b"\0")
        # ... and nothing of the server's: not the password, OIDC client secret, session key or API token.
        assert [name for name in SERVER_SECRETS if name.encode() in environ] == []
        assert leaks_in(environ.replace(HF_SECRET.encode(), b"").replace(WB_SECRET.encode(), b"")) == []

        run = orch.get_run(run_id)
        exported = {"run_config": json.dumps(orch.run_config(run_id)), "config_json": run.config_json,
                    "row": json.dumps(asdict(run)), "events": json.dumps([asdict(e) for e in orch.events(run_id)]),
                    "metrics": orch.metrics(run_id).to_json(), "log_tail": orch.log_tail(run_id, 10_000),
                    "snapshot": repr(orch.snapshot(run_id)),
                    "yaml": TrainConfig.from_dict(orch.run_config(run_id)).to_yaml()}
    finally:
        orch.close()
    Store().engine.dispose()  # let SQLite fold the WAL back; the WAL file is searched too if it stays
    assert {name: leaks_in(text) for name, text in exported.items() if leaks_in(text)} == {}

    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    assert saved == ["checkpoint-2", "checkpoint-4"]  # the search below covers real checkpoints ...
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()  # ... and the adapter
    assert {"config.yaml", "events.jsonl", "worker.log"} <= {p.name for p in run_dir.iterdir()}
    assert (home / "studio.db").exists()
    assert files_with_secrets(home) == {}
    out, err = capfd.readouterr()  # the pump's and orchestrator's own output in this process
    assert leaks_in(out + err) == []


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory, tiny_model):
    """One run that fails with the token inside the exception text (a model type named like it).

    Module-scoped: two tests read it."""
    tmp_path = tmp_path_factory.mktemp("failed-run")
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model, broken)
    (broken / "config.json").write_text(json.dumps({"model_type": f"arch-{HF_SECRET}"}))
    with pytest.MonkeyPatch.context() as mp:
        _studio_env(mp, tmp_path)
        orch = Orchestrator()
        try:
            run_id = orch.start(secret_config(broken, save_steps=0, eval_fraction=0.0))
            snap = orch.wait(run_id, timeout=300, interval=0.2)
        finally:
            orch.close()
        run = Store().get_run(run_id)
        Store().engine.dispose()
        yield snap, run, tmp_path / "home"
    hardware.cuda_available.cache_clear()


@pytest.mark.train
def test_error_message_redacts_a_secret_the_worker_saw(failed_run):
    snap, run, _ = failed_run
    assert snap.status is RunStatus.FAILED
    assert "arch-***" in run.error  # the message still says what went wrong, with the secret masked
    assert leaks_in(run.error) == [] and leaks_in(snap.error or "") == []
    assert leaks_in(json.dumps({k: v for k, v in asdict(run).items() if k != "log_tail"})) == []  # the row, apart from the log tail


@pytest.mark.train
def test_worker_log_redacts_a_secret_printed_by_a_library(failed_run):
    _, run, home = failed_run
    assert leaks_in(run.log_tail) == []
    assert files_with_secrets(home) == {}


@pytest.mark.train
def test_cli_path_takes_secrets_from_the_environment_only(studio_env, tmp_path, tiny_model):
    home = studio_env
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"run_name": "cli secrets", "model_name": str(tiny_model), "max_steps": 3,
                                      "batch_size": 2, "max_seq_length": 64, "save_steps": 2, "warmup_steps": 0}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_TOKEN": HF_SECRET, "WANDB_API_KEY": WB_SECRET}
    env.pop("FINETUNE_STUDIO_TOKEN")  # a token of a user who does not exist would be refused (exit 2)
    cli = subprocess.Popen([sys.executable, "-m", "trainer_core", "run", "--config", str(config)], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        workers: list[psutil.Process] = []
        while not workers and time.monotonic() < deadline and cli.poll() is None:
            workers = worker_processes(home)
            time.sleep(0.05)
        assert workers, "the CLI never started a worker"
        argv, environ = inspect_worker(workers[0])
        out, err = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, out + err
    assert "final status: completed" in out
    assert leaks_in(" ".join(argv)) == [] and leaks_in(" ".join(psutil.Process().cmdline())) == []
    assert f"HF_TOKEN={HF_SECRET}".encode() in environ.split(b"\0")
    assert f"WANDB_API_KEY={WB_SECRET}".encode() in environ.split(b"\0")
    assert [name for name in SERVER_SECRETS if name.encode() in environ] == []
    assert leaks_in(out + err) == []
    runs = Store().list_runs()
    assert [r.name for r in runs] == ["cli secrets"]
    assert leaks_in(json.dumps(asdict(Store().get_run(runs[0].id)))) == []  # the whole row, config included
    assert sorted(p.name for p in (paths.run_dir(runs[0].id) / "checkpoints").glob("checkpoint-*")) == [
        "checkpoint-2", "checkpoint-3"]  # every save_steps, and the last step
    Store().engine.dispose()
    assert files_with_secrets(home) == {}
