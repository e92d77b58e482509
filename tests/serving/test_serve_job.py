"""The serve job without a model: spec validation, the orchestrator's serving API over a scripted worker,
the serve_ready event in the pump, endpoint.json, the vLLM command line, a port in use, CLI errors."""
from __future__ import annotations

import json
import shutil
import socket
import time

import pytest

from db.entities import RunRecord
from tests.support import ROOT, FakeLauncher, wait_until
from trainer_core import __main__ as cli
from trainer_core.config import BUNDLED_MODEL, ConfigError, FieldError, TrainConfig
from trainer_core.jobs import pump
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.specs.model_source import ModelSource
from trainer_core.specs.jobspec import read_spec
from trainer_core.protocol import control
from trainer_core.protocol import events as ev
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.serving import endpoint as endpoint_file
from trainer_core.serving.spec import ServeSpec, hash_key, served_names, vllm_fits
from trainer_core.worker.serve import ServeWorker, public_host, vllm_command

BASE = ModelSource(model=BUNDLED_MODEL)
HASH = hash_key("k")


def fake_run(store, run_id: str, name: str, adapter: bool = True, steps: tuple[int, ...] = ()) -> None:
    """A training run on disk and in the database; its adapter is only an adapter_config.json (enough to
    resolve, not to load)."""
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True)
    write_kind(run_dir, JobKind.TRAIN)
    (run_dir / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name=name).to_yaml())
    if adapter:
        (run_dir / "adapter").mkdir()
        (run_dir / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 12}))
    for step in steps:
        folder = run_dir / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        (folder / "trainer_state.json").write_text("{}")
    store.create_run(RunRecord(id=run_id, name=name, status=RunStatus.COMPLETED, created_at=time.time(),
                               output_dir=str(run_dir)))


# ---------------------------------------------------------------- spec
def test_spec_validation_names_every_field(home, store):
    fake_run(store, "r1", "my run", steps=(10,))
    good = ServeSpec(sources=[BASE, ModelSource(run_id="r1"), ModelSource(run_id="r1", checkpoint=10)],
                     api_key_hash=HASH)
    assert good.validate() == [] and good.source == BASE
    bad = ServeSpec(sources=[BASE, BASE, ModelSource(run_id="r1", checkpoint=7)], host="not a host!", port=80,
                    api_key_hash="abc", idle_timeout_s=2, engine="tgi", purpose="fun")
    fields = [e.field for e in bad.validate()]
    assert fields == ["sources", "checkpoint", "host", "port", "api_key_hash", "idle_timeout_s", "purpose", "engine"]
    message = dict((e.field, e.message) for e in bad.validate())
    assert message["checkpoint"] == "run 'my run' has no checkpoint at step 7: its checkpoints are at steps 10"
    assert message["port"] == "0 (pick a free port) or a port from 1024 to 65535, not 80"
    assert ServeSpec(sources=[], api_key_hash=HASH).validate()[-1] == FieldError(
        "sources", "pick at least one model source to serve")
    for host in ("0.0.0.0", "::1", "localhost", "gpu-box.lan"):
        assert ServeSpec(sources=[BASE], host=host, api_key_hash=HASH, idle_timeout_s=0).validate() == []


def test_models_that_do_not_fit_free_memory_together_are_refused_with_the_figures(home, store, monkeypatch):
    from trainer_core.planning import memory

    fake_run(store, "r1", "my run", steps=(10,))
    monkeypatch.setattr(memory, "device_memory", lambda cfg: memory.DeviceMemory("cpu", "system RAM", 1.2, 8.0))
    one = ServeSpec(sources=[BASE], api_key_hash=HASH)
    assert one.validate() == []  # one 135M model in 32-bit: about 0.6 GB
    three = ServeSpec(sources=[BASE, ModelSource(run_id="r1"), ModelSource(run_id="r1", checkpoint=10)],
                      api_key_hash=HASH)
    [error] = three.validate()  # three copies side by side: about 1.9 GB
    assert error.field == "memory"
    assert error.message.startswith("3 models need about 1.9 GB to serve (0.40B parameters in 32-bit), but system "
                                    "RAM has 1.2 GB free: stop other jobs")
    assert error.message.endswith("or use fewer or smaller models")


def test_vllm_requested_without_cuda_is_refused(home):
    errors = ServeSpec(sources=[BASE], api_key_hash=HASH, engine="vllm").validate()
    assert [e.field for e in errors] == ["engine"] and "CUDA GPU and the vllm extra" in errors[0].message


def test_spec_roundtrip_through_job_json(home, store):
    fake_run(store, "r1", "my run")
    spec = ServeSpec(sources=[ModelSource(run_id="r1"), BASE], api_key_hash=HASH, port=8123, purpose="endpoint")
    folder = paths.run_dir("job")
    folder.mkdir(parents=True)
    write_kind(folder, JobKind.SERVE)
    from trainer_core.specs.jobspec import write_spec

    write_spec(folder, spec)
    back = read_spec(folder)
    assert back == spec and back.source == ModelSource(run_id="r1")


def test_served_names_are_unique_and_vllm_fit(home, store):
    fake_run(store, "r1", "Same Name")
    fake_run(store, "r2", "same name")
    resolved = ServeSpec(sources=[BASE, ModelSource(run_id="r1"), ModelSource(run_id="r2")]).resolved()
    assert served_names(resolved) == ["smollm2-135m-instruct", "same-name", "same-name-2"]
    assert vllm_fits(resolved) == ""


# ---------------------------------------------------------------- orchestrator
SCRIPTED_WORKER = """
import json, os, sys, time
from pathlib import Path
from trainer_core.protocol import control, events as ev
from trainer_core.serving import endpoint
run_dir = Path(sys.argv[1])
w = ev.EventWriter(run_dir / "events.jsonl")
w.emit(ev.StatusEvent(status="starting", phase="loading the models"))
endpoint.write(run_dir, "http://127.0.0.1:9/v1", [{"name": "m", "label": "M", "source_key": "base:x"}], "transformers", os.getpid())
w.emit(ev.ServeReadyEvent(url="http://127.0.0.1:9/v1", models={"m": "M"}, engine="transformers"))
while control.read(run_dir) is None:
    time.sleep(0.05)
endpoint.remove(run_dir)
w.emit(ev.CompleteEvent(status="stopped"))
w.close()
"""


@pytest.fixture
def serve_orch(home, store):
    launcher = FakeLauncher(SCRIPTED_WORKER)
    orch = Orchestrator(store=store, launcher=launcher)
    yield orch
    orch.close()
    launcher.kill_all()


def test_start_server_keeps_only_the_hash_and_finds_the_server(serve_orch, store):
    fake_run(store, "r1", "my run")
    sources = [BASE, ModelSource(run_id="r1")]
    job_id, key = serve_orch.start_server(sources)
    assert len(key) >= 40
    run = store.get_run(job_id)
    assert run.kind is JobKind.SERVE and run.name == "Playground · bundled:SmolLM2-135M-Instruct, r1"
    folder = paths.run_dir(job_id)
    on_disk = "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())
    assert key not in on_disk and key not in (run.config_json or "")
    assert read_spec(folder).api_key_hash == hash_key(key)
    assert serve_orch.server_key(job_id) == key
    wait_until(lambda: serve_orch.endpoint(job_id) is not None, what="the endpoint")
    endpoint = serve_orch.endpoint(job_id)
    assert endpoint.url == "http://127.0.0.1:9/v1" and endpoint.name_of("base:x") == "m"
    wait_until(lambda: store.get_run(job_id).status is RunStatus.RUNNING, what="running")
    assert store.get_run(job_id).phase == "serving at http://127.0.0.1:9/v1"
    assert any(e.message == "serving m at http://127.0.0.1:9/v1" for e in store.get_events(job_id))
    assert serve_orch.find_server(list(reversed(sources))) == job_id
    assert serve_orch.find_server([BASE]) is None
    serve_orch.stop(job_id)
    serve_orch.wait(job_id, timeout=20)
    assert store.get_run(job_id).status is RunStatus.STOPPED
    assert serve_orch.endpoint(job_id) is None and serve_orch.server_key(job_id) is None
    assert serve_orch.find_server(sources) is None


def test_endpoint_key_is_not_kept(serve_orch):
    job_id, key = serve_orch.start_server([BASE], purpose="endpoint", host="0.0.0.0", port=0)
    assert serve_orch.server_key(job_id) is None and key
    serve_orch.cancel(job_id)
    serve_orch.wait(job_id, timeout=20)


def test_start_server_refuses_bad_input(serve_orch, store):
    with pytest.raises(ConfigError) as caught:
        serve_orch.start_server([ModelSource(run_id="gone")], port=70000)
    assert [e.field for e in caught.value.errors] == ["run", "port"]
    assert store.list_runs() == []


def test_pump_records_serve_ready(tmp_path):
    tracker = pump.Tracker("j", tmp_path, LiveRun("j", "j", RunStatus.STARTING), 0, None, kind=JobKind.SERVE)
    pump.handle(tracker, ev.ServeReadyEvent(url="http://h:1/v1", models={"a": "A", "b": "B"}, engine="vllm", ts=5.0))
    snap = tracker.live.snapshot()
    assert snap.status is RunStatus.RUNNING and snap.phase == "serving at http://h:1/v1" and snap.engine == "vllm"
    assert tracker.run_values == {"status": "running", "phase": "serving at http://h:1/v1", "engine": "vllm"}
    assert tracker.timeline == [(5.0, "status", "serving a, b at http://h:1/v1")]
    line = ev.encode(ev.ServeReadyEvent(url="http://u:1/v1", models={"a": "A"}))  # an http(s) URL (issue 24)
    assert ev.decode(line).models == {"a": "A"}


def test_endpoint_file_roundtrip_and_junk(tmp_path):
    assert endpoint_file.read(tmp_path) is None
    endpoint_file.write(tmp_path, "http://x:1/v1", [{"name": "n", "label": "L", "source_key": "run:r"}], "transformers", 7)
    found = endpoint_file.read(tmp_path)
    assert found.url == "http://x:1/v1" and found.name_of("run:r") == "n" and found.name_of("run:s") is None
    (tmp_path / "endpoint.json").write_text("{not json")
    assert endpoint_file.read(tmp_path) is None
    endpoint_file.remove(tmp_path)
    endpoint_file.remove(tmp_path)


# ---------------------------------------------------------------- worker pieces without a model
def test_vllm_command_has_adapters_and_no_key(tmp_path):
    command = vllm_command("/models/base", "smollm2", [("tuned", tmp_path / "a"), ("step40", tmp_path / "b")],
                           "0.0.0.0", 8001, max_rank=12, vllm_bin="/venv/bin/vllm")
    assert command == ["/venv/bin/vllm", "serve", "/models/base", "--host", "0.0.0.0", "--port", "8001",
                       "--served-model-name", "smollm2", "--middleware", "trainer_core.serving.gate.KeyGate",
                       "--disable-uvicorn-access-log", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
                       "--lora-modules", f"tuned={tmp_path / 'a'}", f"step40={tmp_path / 'b'}"]
    assert "--api-key" not in command  # the gate checks the key's hash, read from a file named in its environment
    assert "--enable-lora" not in vllm_command("/m", "m", [], "127.0.0.1", 1, 0, "vllm")


def test_vllm_gets_the_runs_tool_template_and_the_hermes_parser(tmp_path):
    """vLLM renders every model it serves with one chat template and never reads an adapter's: a run trained with
    the Hermes tool template hands it that template (--chat-template) and vLLM's Hermes parser answers tool_calls."""
    from trainer_core.export import chat_templates, tool_templates
    from trainer_core.worker import serve_tools

    own = (ROOT / "tests" / "fixtures" / "chat_templates" / "smollm2.jinja").read_text()
    hermes = tool_templates.hermes_template(chat_templates.detect(own, "<|im_end|>"))
    base, tools_run, plain_run, job = (tmp_path / n for n in ("base", "tools", "plain", "job"))
    for folder, template in ((base, own), (tools_run, hermes), (plain_run, own)):
        folder.mkdir()
        (folder / "chat_template.jinja").write_text(template)
    (base / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    job.mkdir()
    args, warnings = serve_tools.vllm_tool_args(str(base), [("tuned", tools_run), ("plain", plain_run)], job)
    assert args == ["--chat-template", str(job / "chat_template.jinja"), "--enable-auto-tool-choice",
                    "--tool-call-parser", "hermes"] and warnings == []
    assert (job / "chat_template.jinja").read_text() == hermes
    command = vllm_command(str(base), "smollm2", [("tuned", tools_run)], "127.0.0.1", 8001, 8, "vllm", extra=args)
    assert command[-5:] == args
    # a run without tools, a base that is a hub id: nothing changes
    assert serve_tools.vllm_tool_args(str(base), [("plain", plain_run)], job) == ([], [])
    assert serve_tools.vllm_tool_args("HuggingFaceTB/SmolLM2-135M-Instruct", [], job) == ([], [])
    # a base whose own template asks for Hermes calls (Qwen2.5's do): the parser, with the base's template
    (base / "chat_template.jinja").write_text(hermes)
    assert serve_tools.vllm_tool_args(str(base), [], job)[0] == ["--enable-auto-tool-choice", "--tool-call-parser",
                                                                  "hermes"]
    # two adapters with templates of their own cannot share one server's: the base's, with a warning
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer_config.json").write_text(json.dumps({"chat_template": hermes.replace("# Tools", "# Functions")}))
    (base / "chat_template.jinja").write_text(own)
    args, warnings = serve_tools.vllm_tool_args(str(base), [("tuned", tools_run), ("other", other)], job)
    assert args == [] and warnings == [
        "the adapters other, tuned saved different chat templates, and vLLM renders every model it serves with one: "
        "they are served with the base model's. Serve them in separate jobs, or with engine: transformers"]


def test_public_host():
    assert public_host("0.0.0.0") == "127.0.0.1" and public_host("::") == "[::1]"
    assert public_host("10.0.0.2") == "10.0.0.2" and public_host("fe80::1") == "[fe80::1]"


def test_port_in_use_fails_the_job_with_a_clear_message(home, store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        orch = Orchestrator(store=store)  # the real worker: it fails at the bind, before loading anything
        try:
            job_id, _ = orch.start_server([BASE], port=port)
            orch.wait(job_id, timeout=60)
        finally:
            orch.close()
    run = store.get_run(job_id)
    assert run.status is RunStatus.FAILED
    assert run.error == f"port {port} is in use: pick another or 0 (a free port)"


# ---------------------------------------------------------------- CLI errors (nothing starts)
@pytest.fixture
def cli_runs(home):
    """Runs in the CLI's own database (the data root's), acting as the local user."""
    from db.store import Store

    runs = Store()
    fake_run(runs, "20260101-000000-aaaaaa", "done", steps=(10,))
    fake_run(runs, "20260101-000000-bbbbbb", "fresh", adapter=False)
    fake_run(runs, "20260101-000000-cccccc", "gone")
    shutil.rmtree(paths.run_dir("20260101-000000-cccccc"))
    yield runs
    runs.engine.dispose()


@pytest.mark.parametrize("argv,message", [
    (["chat", "nope", "--prompt", "hi"], "error: no run matches 'nope'"),
    (["chat", "fresh", "--prompt", "hi"], "error: run 'fresh' has no saved adapter yet"),
    (["chat", "done", "--checkpoint", "7", "--prompt", "hi"],
     "error: run 'done' has no checkpoint at step 7: its checkpoints are at steps 10"),
    (["chat", "gone"], "error: run 20260101-000000-cccccc: its folder"),
    (["chat", "done", "--temperature", "5", "--prompt", "hi"], "error: --temperature: a number at least 0"),
    (["chat", "done", "--max-new-tokens", "0", "--prompt", "hi"], "error: --max-new-tokens: a whole number"),
    (["serve", "done", "--port", "80"], "error: port: 0 (pick a free port) or a port from 1024 to 65535, not 80"),
    (["serve", "done", "--host", "bad host"], "error: host: 'bad host' is neither an IP address nor a host name"),
])
def test_cli_bad_input(cli_runs, capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert "Traceback" not in err
    assert {r.kind for r in cli_runs.list_runs()} == {JobKind.TRAIN}  # no serve job was recorded


@pytest.mark.parametrize("action,idle,expected", [
    (None, 6.0, (RunStatus.COMPLETED, "no request for 5 s")),
    (control.Action.STOP, 0.0, (RunStatus.STOPPED, "stopped on request")),
    (control.Action.CANCEL, 0.0, (RunStatus.CANCELLED, "cancelled")),
])
def test_the_watch_ends_the_server_on_request_or_idle(tmp_path, action, idle, expected):
    worker = ServeWorker(tmp_path)
    if action is not None:
        control.request(tmp_path, action)
    stopped = []
    worker.watch(ServeSpec(idle_timeout_s=5), lambda: idle, lambda: stopped.append(True))
    assert worker.end_reason == expected and stopped == [True]
    worker.events.close()
    assert [e.phase for e in ev.read_new(tmp_path / "events.jsonl", 0)[0]] == [f"shutting down: {expected[1]}"]


def test_the_watch_never_ends_an_idle_server_without_timeout(tmp_path):
    worker = ServeWorker(tmp_path)
    ticks = []

    class Clock:  # the watch's wait between checks: the third one brings a Stop request
        def wait(self, timeout):
            ticks.append(timeout)
            if len(ticks) == 3:
                control.request(tmp_path, control.Action.STOP)
            return False

    worker.done = Clock()
    worker.watch(ServeSpec(idle_timeout_s=0), lambda: 10_000.0, lambda: None)
    assert len(ticks) == 3  # two checks of an idle server (idle for hours) did not end it
    assert worker.end_reason == (RunStatus.STOPPED, "stopped on request")
    worker.events.close()


def test_short_prompts_skip_tokenizing_long_ones_do_not():
    from trainer_core.worker.serve import _surely_fits

    short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
    assert _surely_fits(short, 8192)
    assert not _surely_fits(short, 600)  # 2 bytes + allowances + 64 > 600: count the tokens
    assert not _surely_fits({"messages": [{"role": "user", "content": "é" * 4000}]}, 8192)  # 8,000 bytes
    assert _surely_fits({"prompt": "x" * 100}, 2048) and not _surely_fits({"prompt": "x" * 100}, 1024)
    assert not _surely_fits({"messages": ["not a message"]}, 8192) and not _surely_fits({}, 8192)
