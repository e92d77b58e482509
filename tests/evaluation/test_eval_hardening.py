"""Issue 24, eval items: a worker's environment is an allow-list, a judge key must be declared by the admin,
judge URLs at loopback/private addresses are refused (resolved address, at validation and before every request,
no redirects, no response bodies in messages), hub:<id> is a hub id and nothing on disk, 0 samples is a failure
and a baseline is compared only on the same rows, dropped rows are reported, the CLI cancels the baseline it
queued, Stop while loading is Stopped and a deleted predictions file is noticed."""
from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from db.entities import RunRecord
from db.store import Store
from trainer_core.auth import access
from trainer_core.specs import jobspec
from trainer_core.config import BUNDLED_MODEL, FieldError, TrainConfig
from trainer_core.evaluation import endpoint
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation.judge import Judge, JudgeUnavailable
from trainer_core.evaluation.samples import Sample
from trainer_core.evaluation.spec import DEFAULT_RUBRIC, EvalSpec
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs import evals
from trainer_core.jobs.launcher import WorkerLauncher
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.worker import evaluate
from trainer_core.worker.evaluate import Evaluator, NothingToScore, Predictions

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


# ====================================================================== Security 1: the worker's environment
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


# ====================================================================== Security 3: the judge's address
@pytest.mark.parametrize("address, problem", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.1.2.3", "private"), ("192.168.0.5", "private"),
    ("172.16.0.1", "private"), ("fd00::1", "private"), ("224.0.0.1", "multicast"), ("100.64.0.1", "non-public"),
    ("8.8.8.8", None), ("2001:4860:4860::8888", None)])
def test_address_classes(address, problem):
    assert endpoint.address_problem(address) == problem


def fake_dns(monkeypatch, answers: dict[str, list[str]]) -> None:
    """Names resolve to ``answers`` (changeable while the test runs); addresses as themselves; others not at all."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                raise socket.gaierror(-2, "Name or service not known") from None
            return real(host, port, *args, **kwargs)  # the connection itself, to the checked address
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in answers[host]]

    monkeypatch.setattr(endpoint.socket, "getaddrinfo", getaddrinfo)


def judge_url_errors(url: str) -> list[FieldError]:
    spec = EvalSpec(source=BASE, data="x.jsonl", metrics=["judge"], judge_url=url, judge_model="m")
    return [e for e in spec._judge_errors() if e.field == "judge_url"]


def test_a_judge_url_at_a_private_address_is_refused_unless_the_admin_allows_it(monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", raising=False)
    fake_dns(monkeypatch, {"localhost": ["127.0.0.1"], "judge.internal": ["8.8.8.8", "10.0.0.7"],
                           "metadata.example": ["169.254.169.254"], "judge.example": ["8.8.8.8"]})
    assert judge_url_errors("http://localhost:8501/v1") == [FieldError(
        "judge_url", "the judge URL's host localhost resolves to 127.0.0.1, a loopback address: judges on this host "
                     "or a private network are refused unless the server's admin sets "
                     "FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE=1")]
    assert "10.0.0.7, a private address" in judge_url_errors("http://judge.internal/v1")[0].message  # any answer
    assert "169.254.169.254, a link-local address" in judge_url_errors("http://metadata.example/latest")[0].message
    assert "cannot be resolved" in judge_url_errors("https://nowhere.example/v1")[0].message
    assert judge_url_errors("https://judge.example/v1") == []
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    assert judge_url_errors("http://localhost:8501/v1") == []


@pytest.fixture
def stub():
    """A local HTTP server answering every POST with ``state['answer']`` = (status, headers, body)."""
    state = {"answer": (200, {}, json.dumps({"choices": [{"message": {"content": "8"}}]})), "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers["Content-Length"]))
            state["requests"].append({"path": self.path, "host": self.headers["Host"]})
            status, headers, body = state["answer"]
            data = body.encode()
            self.send_response(status)
            for name, value in {"Content-Length": str(len(data)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["port"] = server.server_address[1]
    state["url"] = f"http://127.0.0.1:{state['port']}/v1"
    yield state
    server.shutdown()
    server.server_close()


def test_the_worker_refuses_a_loopback_judge_by_default_and_sends_nothing(stub, monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", raising=False)
    judge = Judge(stub["url"], "m", DEFAULT_RUBRIC, api_key="sk-judge")
    with pytest.raises(JudgeUnavailable, match="127.0.0.1, a loopback address"):
        judge.score("q", "r", "a")
    judge.close()
    assert stub["requests"] == []


def test_the_address_is_checked_again_before_each_request_and_the_request_goes_to_it(stub, monkeypatch):
    """A name that resolved to a public address at validation and to loopback now (DNS rebinding) is refused;
    an allowed one is called at the checked address, with the original name in the Host header."""
    answers = {"judge.example": ["8.8.8.8"]}
    fake_dns(monkeypatch, answers)
    assert judge_url_errors(f"http://judge.example:{stub['port']}/v1") == []
    answers["judge.example"] = ["127.0.0.1"]
    judge = Judge(f"http://judge.example:{stub['port']}/v1", "m", DEFAULT_RUBRIC)
    with pytest.raises(JudgeUnavailable, match="resolves to 127.0.0.1"):
        judge.score("q", "r", "a")
    assert stub["requests"] == []
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    assert judge.score("q", "r", "a")[0] == 8.0
    judge.close()
    assert stub["requests"] == [{"path": "/v1/chat/completions", "host": f"judge.example:{stub['port']}"}]


def test_redirects_are_not_followed(stub, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    stub["answer"] = (307, {"Location": "http://169.254.169.254/latest/meta-data"}, "")
    judge = Judge(stub["url"], "m", DEFAULT_RUBRIC)
    with pytest.raises(JudgeUnavailable, match="answered HTTP 307, a redirect \\(not followed\\)"):
        judge.score("q", "r", "a")
    judge.close()
    assert len(stub["requests"]) == 1


@pytest.mark.parametrize("status", [200, 401, 500])
def test_a_response_body_is_never_quoted(stub, monkeypatch, tmp_path, status):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    stub["answer"] = (status, {"Content-Type": "text/html"}, "<h1>internal admin page: SECRET-CONTENT</h1>")
    judge = Judge(stub["url"], "m", DEFAULT_RUBRIC)
    worker = Evaluator(tmp_path)
    from trainer_core.evaluation.scoring import SampleScores

    assert worker.judge_one(judge, SampleScores(), "q", "r", "a") is None
    worker.events.close()
    logged, _ = ev.read_new(tmp_path / ev.LOG_NAME, 0)
    assert [e.kind for e in logged] == ["warning"]
    assert f"HTTP {status}" in logged[0].message and "SECRET-CONTENT" not in logged[0].message


# ====================================================================== Security 2: hub:<id> is a hub id
@pytest.mark.parametrize("data, message", [
    ("hub:/etc", "a hub dataset id looks like org/name"),
    ("hub:.", "a hub dataset id looks like org/name"),
    ("hub:../../x", "a hub dataset id looks like org/name"),
    ("hub:owner/..", "a hub dataset id looks like org/name"),
    ("hub:owner/.", "a hub dataset id looks like org/name"),
    ("hub:json", "'json' is a builtin loader of the datasets library, not a hub dataset: give your file or folder "
                 "as data, without hub:, instead"),
    ("hub:parquet", "'parquet' is a builtin loader of the datasets library, not a hub dataset: give your file or "
                    "folder as data, without hub:, instead"),
    ("hub:imagefolder", "'imagefolder' is a builtin loader of the datasets library, not a hub dataset: give your "
                        "file or folder as data, without hub:, instead"),
])
def test_hub_data_must_be_a_hub_dataset_id(home, data, message):
    assert [e for e in EvalSpec(source=BASE, data=data).validate() if e.field == "data"] == [FieldError("data", message)]
    with pytest.raises(eval_samples.DatasetError, match="hub"):  # the worker checks again before reading
        eval_samples.load_rows(EvalSpec(source=BASE, data=data))


def test_a_local_folder_given_as_a_hub_id_is_refused(home, tmp_path, monkeypatch):
    (tmp_path / "outside").mkdir()
    monkeypatch.chdir(tmp_path)  # a relative name datasets would read from the working folder
    assert [e.message for e in EvalSpec(source=BASE, data="hub:outside").validate() if e.field == "data"] == [
        "'outside' is a local file or folder, not a hub dataset: give the path as data, without hub:, instead"]
    assert [e for e in EvalSpec(source=BASE, data="hub:tatsu-lab/alpaca").validate() if e.field == "data"] == []


def test_a_test_file_linked_from_outside_the_allowed_folders_is_refused(home, tmp_path_factory, tmp_path):
    outside = tmp_path_factory.mktemp("outside") / "secret.jsonl"
    outside.write_text(json.dumps({"instruction": "q", "output": "a"}) + "\n")
    (tmp_path / "link.jsonl").symlink_to(outside)
    errors = [e for e in EvalSpec(source=BASE, data=str(tmp_path / "link.jsonl")).validate() if e.field == "data"]
    assert len(errors) == 1 and "outside the allowed folders" in errors[0].message


# ====================================================================== Wrong states 5: dropped rows are said
def test_rows_without_an_answer_are_reported_with_count_and_reason(home, tmp_path):
    rows = [{"instruction": "Add 2 and 3.", "output": "5"}, {"instruction": "Name a colour."},
            {"instruction": "Say hi", "output": "Hello"}, {"instruction": "Count", "input": "1 2"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples, warning = eval_samples.load_samples(EvalSpec(source=BASE, data=str(tmp_path / "t.jsonl")))
    assert [s.reference for s in samples] == ["5", "Hello"]
    assert warning == "Left out 2 of 4 test rows: missing output: 2"
    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    _, warning = eval_samples.load_samples(EvalSpec(source=BASE, data=str(tmp_path / "c.jsonl")))
    assert warning == "Left out 1 of 2 test rows: no assistant turn: 1"


# ====================================================================== Wrong states 4: 0 samples, same rows
class WordTokenizer:
    """One token per word of every turn, plus two for the generation prompt."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False, **_):
        ids = list(range(sum(len(m["content"].split()) for m in messages) + 2))
        return {"input_ids": ids} if return_dict else ids


def test_an_eval_where_no_row_fits_the_context_fails_with_the_fix(tmp_path):
    worker = Evaluator(tmp_path)
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=20))
    rows = [Sample(0, [{"role": "user", "content": "word " * 30}], "a")]
    with pytest.raises(NothingToScore) as raised:
        worker.fitting(rows, model, WordTokenizer(), EvalSpec(max_new_tokens=16))
    worker.events.close()
    assert str(raised.value) == ("none of the 1 test row(s) fits the model's context of 20 tokens with max_new_tokens "
                                 "16: shorten the rows, lower max_new_tokens, or evaluate a model with a longer "
                                 "context")


def add_eval(store: Store, job_id: str, source_key: str, metrics: dict | None, indices=(),
             status: RunStatus = RunStatus.COMPLETED) -> None:
    store.create_run(RunRecord(id=job_id, name=job_id, kind=JobKind.EVAL, status=RunStatus.QUEUED, model=source_key,
                               method="Evaluation", created_at=time.time()))
    store.save_eval_result(job_id, source_key=source_key, source_run_id="", base_model=BUNDLED_MODEL,
                           data_fingerprint="fp", settings_hash="sh", data_label="t.jsonl", metrics=metrics,
                           created_at=time.time())
    for index in indices:
        store.save_eval_sample(job_id, index, prompt="p", reference="r", answer="a")
    if status.is_terminal():
        store.finish_run(job_id, status)
    elif status is not RunStatus.QUEUED:
        store.update_run(job_id, status=status.value)


BASE_KEY = f"base:{BUNDLED_MODEL}"


@pytest.mark.parametrize("metrics, status, reusable", [
    ({"samples": 3, "partial": False}, RunStatus.COMPLETED, True),
    ({"samples": 0, "partial": False}, RunStatus.COMPLETED, False),  # from before 0 samples was a failure
    ({"partial": False}, RunStatus.COMPLETED, False),
    (None, RunStatus.QUEUED, True), (None, RunStatus.STARTING, True), (None, RunStatus.RUNNING, True),
    (None, RunStatus.STOPPING, False)])  # it ends stopped or cancelled, which never counts
def test_which_baselines_are_reused(home, metrics, status, reusable):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, metrics, status=status)
    assert evals.reusable(store.find_eval(BASE_KEY, "fp", "sh")) is reusable


def test_a_baseline_is_compared_only_on_the_rows_it_scored(home):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, {"samples": 2, "exact": 0.5}, indices=[0, 2])
    add_eval(store, "eval-same", "run:r", {"samples": 2, "exact": 1.0}, indices=[0, 2])
    add_eval(store, "eval-other", "run:r", {"samples": 2, "exact": 1.0}, indices=[0, 1])
    add_eval(store, "eval-more", "run:r", {"samples": 3, "exact": 1.0}, indices=[0, 1, 2])
    assert evals.baseline_of(store, store.eval_result("eval-same")).job_id == "base-1"
    assert evals.baseline_of(store, store.eval_result("eval-other")) is None
    assert evals.baseline_of(store, store.eval_result("eval-more")) is None


# ====================================================================== Wrong states 3: Ctrl-C cancels what it started
class CancellingOrch:
    """What ``evals.cancel`` uses of the orchestrator: its store and cancel (a queued job is removed)."""

    def __init__(self, store: Store):
        self.store = store

    def cancel(self, job_id, actor=None):
        self.store.finish_run(job_id, RunStatus.CANCELLED)


def test_cancelling_an_eval_cancels_the_baseline_it_queued(home):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, None, status=RunStatus.RUNNING)
    add_eval(store, "eval-1", "run:r", None, status=RunStatus.QUEUED)
    assert evals.cancel(CancellingOrch(store), evals.Started("eval-1", "base-1", True), None) == ["eval-1", "base-1"]
    assert [store.get_run(j).status for j in ("eval-1", "base-1")] == [RunStatus.CANCELLED] * 2


def test_a_baseline_another_eval_waits_for_or_not_ours_stays(home):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, None, status=RunStatus.RUNNING)
    add_eval(store, "eval-1", "run:r", None, status=RunStatus.QUEUED)
    add_eval(store, "eval-2", "run:r2", None, status=RunStatus.QUEUED)  # submitted later, found base-1: waits for it
    assert evals.cancel(CancellingOrch(store), evals.Started("eval-1", "base-1", True), None) == ["eval-1"]
    assert store.get_run("base-1").status is RunStatus.RUNNING
    add_eval(store, "eval-3", "run:r3", None, status=RunStatus.QUEUED)
    assert evals.cancel(CancellingOrch(store), evals.Started("eval-3", "base-1", False), None) == ["eval-3"]
    assert store.get_run("base-1").status is RunStatus.RUNNING


# ====================================================================== cosmetic truths
def test_the_cli_prints_the_rows_evaluated_and_the_baselines_progress(capsys):
    from trainer_core.cli import evaluate as cli

    def snap(status, step=0, total=200):
        return SimpleNamespace(status=status, step=step, total_steps=total, error="")

    class Orch:
        def snapshot(self, job_id):
            return snap(RunStatus.RUNNING, 4, 10)

        def wait(self, job_id, on_tick):
            for s in (snap(RunStatus.QUEUED), snap(RunStatus.STARTING), snap(RunStatus.RUNNING, 0, 200),
                      snap(RunStatus.RUNNING, 1, 3), snap(RunStatus.RUNNING, 1, 3), snap(RunStatus.RUNNING, 3, 3)):
                on_tick(s)
            return snap(RunStatus.FAILED)

        def eval_result(self, job_id):
            return None

    assert cli._follow(Orch(), evals.Started("e", "b", True), None, False) == 1
    assert capsys.readouterr().err.splitlines() == ["baseline: 4/10 samples", "1/3 samples", "3/3 samples",
                                                    "eval failed"]


def run_worker_until_loaded(tmp_path, monkeypatch, action: control.Action) -> list:
    tmp_path.mkdir()
    (tmp_path / "t.jsonl").write_text(json.dumps({"instruction": "q", "output": "a"}) + "\n")
    folder = tmp_path / "job"
    folder.mkdir()
    jobspec.write_spec(folder, EvalSpec(source=BASE, data=str(tmp_path / "t.jsonl")))
    write_kind(folder, JobKind.EVAL)

    def load(self, resolved):
        control.request(folder, action)  # the request arrives while the model loads
        return SimpleNamespace(config=SimpleNamespace()), WordTokenizer(), "cpu"

    monkeypatch.setattr(Evaluator, "begin", lambda self: None)  # no SIGTERM handler in the test process
    monkeypatch.setattr(Evaluator, "load", load)
    monkeypatch.setattr(evaluate.model_source, "resolve", lambda source: SimpleNamespace(label="m", base_model="m"))
    assert Evaluator(folder).run() == 0
    events, _ = ev.read_new(folder / ev.LOG_NAME, 0)
    return events


def test_stop_while_the_model_loads_is_stopped_and_cancel_is_cancelled(home, tmp_path, monkeypatch):
    stopped = run_worker_until_loaded(tmp_path / "a", monkeypatch, control.Action.STOP)
    assert [e.status for e in stopped if e.kind == "complete"] == ["stopped"]
    cancelled = run_worker_until_loaded(tmp_path / "b", monkeypatch, control.Action.CANCEL)
    assert [e.status for e in cancelled if e.kind == "complete"] == ["cancelled"]


def test_a_predictions_file_deleted_mid_run_is_noticed(tmp_path):
    warnings = []
    path = tmp_path / "predictions.jsonl"
    with Predictions(path, warnings.append) as out:
        out.write('{"index": 0}\n', 0)
        path.unlink()
        out.write('{"index": 1}\n', 1)
        out.write('{"index": 2}\n', 2)
    assert warnings == ["predictions.jsonl was deleted or replaced while the eval ran: started it again; the 1 "
                        "sample(s) scored before are in the job's events and the Evaluation tab, not in the new file"]
    assert path.read_text() == '{"index": 1}\n{"index": 2}\n'
