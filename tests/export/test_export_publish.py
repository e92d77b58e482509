"""Publishing an export's staging folder (fast: no model, the folder is laid out by hand)."""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

from trainer_core.export.spec import ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev
from trainer_core.worker.export import ExportWorker, Plan, Staged


def test_a_stopped_export_publishes_its_finished_files_but_never_its_scratch_folder(tmp_path):
    """Stop between two GGUF types: the merged weights and the f16 GGUF made only as steps (``.work``, as big as
    the model) were moved into the published folder, unlisted; only finished artifacts belong there."""
    job = tmp_path / "job"
    job.mkdir()
    spec = ExportSpec(source=ModelSource(run_id="20260103-100010-ffffff"), targets=["gguf"], quantizations=["q8_0"])
    resolved = SimpleNamespace(source=spec.source, served_name="m")
    plan = Plan(spec, resolved, final=job / "artifacts", staging=job / ".artifacts.tmp-1", base_dir="")
    (plan.staging / ".work" / "merged").mkdir(parents=True)
    (plan.staging / ".work" / "merged" / "model.safetensors").write_bytes(b"w" * 100)
    (plan.staging / ".work" / "f16.gguf").write_bytes(b"GGUF" * 10)
    (plan.staging / "m-q8_0.gguf").write_bytes(b"GGUF-q8")
    plan.staged.append(Staged("m-q8_0.gguf", "gguf", "q8_0"))

    worker = ExportWorker(job)
    worker.publish(plan)
    worker.events.close()

    assert sorted(p.name for p in plan.final.iterdir()) == ["m-q8_0.gguf"]
    rows = [e for e in ev.read_new(job / ev.LOG_NAME, 0)[0] if e.kind == "artifact"]
    assert [(r.path, r.sha256) for r in rows] == [
        (str(plan.final / "m-q8_0.gguf"), hashlib.sha256(b"GGUF-q8").hexdigest())]


def test_the_tools_an_export_runs_never_get_the_hub_token(tmp_path, monkeypatch, capsys):
    """llama-quantize ran with the worker's whole environment, HF_TOKEN included when the export pushes."""
    import sys

    monkeypatch.setenv("HF_TOKEN", "hf_push_secret_123")
    worker = ExportWorker(tmp_path)
    worker.run_tool([sys.executable, "-c", "import os; print('token:', os.environ.get('HF_TOKEN', 'none'))"],
                    "llama-quantize")
    worker.events.close()
    assert "token: none" in capsys.readouterr().out
