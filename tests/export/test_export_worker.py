"""The export worker for real. Preflight stops a doomed export before anything long starts and before anything is
written; a GGUF that cannot be loaded back fails the export with nothing published; a QLoRA run merges into its
16-bit base without bitsandbytes; and, end to end on the bundled model through the orchestrator: merged + GGUF
q8_0, loaded back, answer greedily like the unmerged adapter, with artifact rows whose sha256 match the files."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from tests.support.lora_runs import lora_run
from tests.support import ROOT, run_python
from trainer_core.specs import jobspec
from trainer_core.config import promptsets
from trainer_core.config import BUNDLED_MODEL
from trainer_core.export import tools
from trainer_core.export.spec import ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind

pytestmark = [pytest.mark.subprocess,
              pytest.mark.skipif(tools.converter_script() is None, reason="llama.cpp's converter is not installed "
                                                                         "(make install)")]

# Each scenario runs the real worker (ExportWorker.run) on its own job folder in one process; a scenario may
# replace one function to play a fault the machine cannot produce on demand (a full disk, a broken converter).
SCENARIOS = textwrap.dedent("""
    import json, shutil, sys
    from pathlib import Path
    from trainer_core.worker import export

    scenario, job = sys.argv[1], Path(sys.argv[2])
    if scenario == "full-disk":
        real = shutil.disk_usage
        export.shutil.disk_usage = lambda path: real(path)._replace(free=100_000)
    elif scenario == "broken-gguf":
        def convert(self, script, model_dir, outtype, out):
            out.write_bytes(b"GGUF" + bytes(64))  # a converter that wrote a truncated file
        export.ExportWorker.convert = convert
    elif scenario in ("stop", "cancel"):  # Stop or Cancel arrives while the adapter is being zipped
        from trainer_core.protocol import control
        zip_weights = export.ExportWorker.zip_weights
        def zip_then_request(self, plan):
            zip_weights(self, plan)
            control.request(job, control.Action(scenario))
        export.ExportWorker.zip_weights = zip_then_request
    elif scenario == "qlora-merge":
        worker = export.ExportWorker(job)
        plan = worker.preflight(export.jobspec.read_spec(job))
        plan.staging.mkdir()
        worker.merge(plan)
        from safetensors import safe_open
        with safe_open(str(plan.merged_dir / "model.safetensors"), "pt") as fh:
            dtypes = sorted({str(fh.get_slice(k).get_dtype()) for k in fh.keys()})
        print(json.dumps({"bitsandbytes": "bitsandbytes" in sys.modules, "dtypes": dtypes}))
        sys.exit(0)
    sys.exit(export.ExportWorker(job).run())
""")


def run_scenario(name: str, job: Path, env: dict) -> tuple[int, list, str]:
    done = run_python(SCENARIOS, name, str(job), env=env, timeout=600)
    events = [ev.decode(line) for line in (job / ev.LOG_NAME).read_text().splitlines()] if \
        (job / ev.LOG_NAME).exists() else []
    return done.returncode, [e for e in events if e.kind != "heartbeat"], done.stdout + done.stderr


def new_job(name: str, spec: ExportSpec) -> Path:
    job = paths.run_dir(name)
    job.mkdir(parents=True)
    jobspec.write_spec(job, spec)
    write_kind(job, JobKind.EXPORT)
    return job


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.name == "artifacts")


@pytest.fixture
def tiny_env(home, tiny_model, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{home.parent}:{ROOT / '.test-cache'}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return {"FINETUNE_STUDIO_ALLOWED_ROOTS": f"{home.parent}:{ROOT / '.test-cache'}"}


def test_preflight_failures_and_an_unloadable_gguf_leave_nothing_behind(tiny_env, tiny_model):
    run = lora_run("20260103-100000-aaaaaa", str(tiny_model))
    source = ModelSource(run_id=run.name)

    job = new_job("20260103-100001-full00", ExportSpec(source=source, targets=["merged", "gguf"], verify=False))
    rc, events, _ = run_scenario("full-disk", job, tiny_env)
    assert rc == 1 and events[-1].kind == "error"
    assert events[-1].message.startswith("preflight found the export needs about ")
    assert "GB free: free some space, or choose another out_dir or fewer targets. Nothing was written." in \
        events[-1].message
    assert leftovers(job) == [] and [e.phase for e in events if e.kind == "status"] == ["preflight"]

    # Tokens added to the tokenizer without resizing the embedding, and no chat template: both named at once.
    adapter = run / "adapter"
    (adapter / "chat_template.jinja").unlink()
    config = json.loads((adapter / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config["extra_special_tokens"] = [f"<tool_{i}>" for i in range(3)]
    (adapter / "tokenizer_config.json").write_text(json.dumps(config))
    job = new_job("20260103-100002-vocab0", ExportSpec(source=source, targets=["merged"], verify=False))
    rc, events, _ = run_scenario("none", job, tiny_env)
    message = events[-1].message
    assert rc == 1 and message.startswith("preflight found the model has no chat template")
    assert "tokens but the model's embedding has 49,152 rows: tokens were added without resizing" in message
    assert leftovers(job) == []

    run = lora_run("20260103-100003-bbbbbb", str(tiny_model))
    job = new_job("20260103-100004-broken", ExportSpec(source=ModelSource(run_id=run.name), targets=["gguf"],
                                                       prompt_set="quick-check", max_new_tokens=2))
    rc, events, _ = run_scenario("broken-gguf", job, tiny_env)
    assert rc == 1 and events[-1].message.startswith("the GGUF export-test-bbbbbb-q8_0.gguf "
                                                     "cannot be loaded back (")
    assert events[-1].message.endswith("the export failed and nothing was published")
    assert leftovers(job) == [] and not [e for e in events if e.kind == "artifact"]


def test_stop_publishes_what_is_finished_and_cancel_publishes_nothing(tiny_env, tiny_model):
    run = lora_run("20260103-100010-ffffff", str(tiny_model))
    spec = ExportSpec(source=ModelSource(run_id=run.name), targets=["adapter", "merged"], verify=False)
    job = new_job("20260103-100011-stop00", spec)
    rc, events, _ = run_scenario("stop", job, tiny_env)
    assert rc == 0 and (events[-1].kind, events[-1].status) == ("complete", "stopped")
    assert sorted(p.name for p in (job / "artifacts").iterdir()) == ["README.md", "export-test-ffffff-adapter.zip"]
    assert [e.artifact for e in events if e.kind == "artifact"] == ["adapter", "card"]
    assert [p.name for p in job.iterdir() if p.name.startswith(".")] == []

    job = new_job("20260103-100012-cancel", spec)
    rc, events, _ = run_scenario("cancel", job, tiny_env)
    assert rc == 0 and (events[-1].kind, events[-1].status) == ("complete", "cancelled")
    assert leftovers(job) == [] and not [e for e in events if e.kind == "artifact"]


def test_a_push_without_the_hub_fails_before_anything_is_written_and_keeps_the_token_secret(tiny_env, tiny_model):
    run = lora_run("20260103-100005-cccccc", str(tiny_model))
    job = new_job("20260103-100006-push00", ExportSpec(source=ModelSource(run_id=run.name), targets=["adapter"],
                                                       push_repo_id="me/tone", verify=False))
    token = "hf_test_secret_0123456789"
    rc, events, output = run_scenario("none", job, {**tiny_env, "HF_TOKEN": token, "HF_HUB_OFFLINE": "1"})
    assert rc == 1 and events[-1].message == (
        "preflight found push_repo_id: the hub is switched off here (HF_HUB_OFFLINE is set): unset it, or leave "
        "the repo id empty and copy the artifacts yourself. Nothing was written.")
    assert leftovers(job) == []
    assert token not in (job / ev.LOG_NAME).read_text() + output + (job / jobspec.SPEC_FILE).read_text()


def test_a_qlora_adapter_merges_into_the_16_bit_base_without_bitsandbytes(tiny_env, tiny_model):
    run = lora_run("20260103-100007-dddddd", str(tiny_model), adapter="qlora")
    job = new_job("20260103-100008-qlora0", ExportSpec(source=ModelSource(run_id=run.name), targets=["merged"],
                                                       merged_dtype="bfloat16", verify=False))
    done = run_python(SCENARIOS, "qlora-merge", str(job), env=tiny_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"bitsandbytes": False, "dtypes": ["BF16"]}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_end_to_end_merged_and_gguf_answer_like_the_adapter(studio, capsys):
    """The bundled model with a LoRA adapter: export merged + GGUF q8_0 through the orchestrator, reload both,
    replay prompts greedily next to the unmerged adapter; every artifact row's sha256 is the file's."""
    run = lora_run("20260103-100009-eeeeee", BUNDLED_MODEL)
    promptsets.save("export-check", ["What is the capital of France?", "List three fruits."])
    job_id = studio.submit(ExportSpec(source=ModelSource(run_id=run.name), targets=["merged", "gguf"],
                                      quantizations=["q8_0"], prompt_set="export-check", max_new_tokens=12))
    snap = studio.wait(job_id, timeout=900)
    assert snap.status is RunStatus.COMPLETED, (snap.error, studio.log_tail(job_id))
    artifacts = {Path(a.path).name: a for a in studio.artifacts(source_run_id=run.name)}
    assert sorted(artifacts) == ["Modelfile", "README.md", "export-test-eeeeee-q8_0.gguf", "merged", "verify.json"]
    folder = paths.run_dir(job_id) / "artifacts"
    for name, row in artifacts.items():
        path = folder / name
        assert row.job_id == job_id and row.path == str(path)
        if path.is_dir():  # a folder: its manifest's sha256, and the manifest checks out file by file
            manifest = (path / "SHA256SUMS").read_text().splitlines()
            assert sorted(line.split("  ")[1] for line in manifest) == sorted(
                p.name for p in path.iterdir() if p.name != "SHA256SUMS")
            assert all(sha256(path / line.split("  ")[1]) == line.split("  ")[0] for line in manifest)
            assert row.sha256 == sha256(path / "SHA256SUMS")
            assert row.size == sum(p.stat().st_size for p in path.iterdir())
        else:
            assert (row.sha256, row.size) == (sha256(path), path.stat().st_size)
    verify = json.loads((folder / "verify.json").read_text())
    with capsys.disabled():
        print("\nexport verify agreement:", "; ".join(f"{v['format']} {v['identical']}/{v['total']}" for v in verify))
    assert [(v["format"], v["identical"], v["total"]) for v in verify[:2]] == [("merged", 2, 2), ("gguf q8_0", 2, 2)]
    timeline = [e.message for e in studio.events(job_id) if e.kind == "verify"]
    assert timeline[:2] == ["verify merged: 2/2 answers identical to the adapter's",
                            "verify gguf q8_0: 2/2 answers identical to the adapter's"]
    if importlib.util.find_spec("xllamacpp") is not None:  # the llamacpp extra: the GGUF run by llama.cpp too
        # llama.cpp multiplies q8_0 weights with q8_0-quantized activations: it may drift where transformers'
        # dequantized fp32 does not; drift must then be a warning naming the first difference.
        [llama] = verify[2:-1]
        assert (llama["format"], llama["total"]) == ("gguf q8_0 (llama.cpp)", 2)
        if llama["identical"] < 2:
            assert f"gguf q8_0 (llama.cpp) drifts from the adapter: {llama['identical']}/2 greedy answers identical; " \
                   f"first difference: {llama['first_difference']}" in snap.warnings
    else:
        assert len(verify) == 3
    # the GGUF's tokenizer.chat_template, read back: the run's (SmolLM2's own, which renders no tools)
    assert (verify[-1]["format"], verify[-1]["identical"], verify[-1]["total"]) == ("gguf q8_0 chat template", 1, 1)
    assert artifacts["Modelfile"].detail == "chatml" and "FROM ./export-test-eeeeee-q8_0.gguf" in \
        (folder / "Modelfile").read_text()
    card = (folder / "README.md").read_text()
    assert "| Final train loss | 1.6000 |" in card and "| gguf q8_0 | 2/2 | — |" in card and "hf_token" not in card
    assert not [p for p in paths.run_dir(job_id).iterdir() if p.name.startswith(".artifacts")]


def test_a_run_with_the_hermes_tool_template_exports_a_gguf_and_modelfile_that_take_tools(tiny_env, tiny_model):
    """The GGUF's tokenizer.chat_template is the run's tool template (read back with the gguf package, it renders a
    tool's schema, a call and its result), and the Modelfile's TEMPLATE renders the same conversation with tools, as
    Ollama would, exactly as that jinja template does."""
    from tests.support.go_template import ollama_render
    from trainer_core.export import chat_templates as ct, tool_templates as tt
    from trainer_core.worker import export_template_check

    run = lora_run("20260103-100013-tools0", str(tiny_model), tool_template=True)
    job = new_job("20260103-100014-tools1", ExportSpec(source=ModelSource(run_id=run.name), targets=["gguf"],
                                                       quantizations=["f16"], prompt_set="quick-check",
                                                       max_new_tokens=2))
    rc, events, output = run_scenario("none", job, tiny_env)
    assert rc == 0 and (events[-1].kind, events[-1].status) == ("complete", "completed"), output[-3000:]
    hermes = (run / "adapter" / "chat_template.jinja").read_text()
    detected = ct.detect(hermes, "<|im_end|>")
    assert "<tool_call>" in hermes and tt.hermes_tools(hermes, "<|im_end|>") == detected
    folder = job / "artifacts"
    gguf_template = export_template_check.read_template(folder / "export-test-tools0-f16.gguf")
    assert gguf_template == hermes
    checks = [e for e in events if e.kind == "verify" and e.format == "gguf f16 chat template"]
    assert [(c.identical, c.total, c.unit) for c in checks] == [(4, 4, "chat template checks passed")]
    [modelfile] = [e for e in events if e.kind == "artifact" and e.artifact == "modelfile"]
    assert modelfile.detail == "chatml with tools"
    text = (folder / "Modelfile").read_text()
    assert f'TEMPLATE """{tt.go_tool_template(detected)}"""' in text
    # What llama.cpp renders from the GGUF's template, and what Ollama renders from the Modelfile: the same prompt.
    tool = export_template_check.TOOL
    conversation = [*export_template_check.CONVERSATION, {"role": "assistant", "content": "4 degrees, clear."},
                    {"role": "user", "content": "And in Rome?"}]
    for messages in (conversation, [{"role": "system", "content": "Be brief."}, *conversation]):
        assert ollama_render(text, messages, [tool]) == ct.render_jinja(gguf_template, messages, "<|im_start|>",
                                                                        "<|im_end|>", tools=[tool])
