"""Real training runs through the orchestrator, the worker subprocess, the event log and the database."""
from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.support import MODELS_CACHE, ROOT, run_python
from trainer_core.config import TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train



def wait_for_step(orch: Orchestrator, run_id: str, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = orch.snapshot(run_id)
        assert not snap.status.is_terminal(), f"run ended early: {snap.status} {snap.error}\n{orch.log_tail(run_id)}"
        if snap.step >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached; log:\n{orch.log_tail(run_id)}")


def test_bundled_model_lora_run_end_to_end(studio):
    cfg = TrainConfig(run_name="e2e bundled", max_steps=4, batch_size=2, max_seq_length=128, logging_steps=1,
                      eval_fraction=0.05, eval_steps=2, warmup_steps=0)
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    log = studio.log_tail(run_id, 200)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{log}"

    run = studio.get_run(run_id)
    adapter = Path(run.output_dir)
    assert adapter.name == "adapter"
    assert (adapter / "adapter_config.json").exists() and (adapter / "adapter_model.safetensors").exists()
    assert (adapter / "tokenizer.json").exists() or (adapter / "tokenizer_config.json").exists()
    assert run.steps_done == 4 and run.engine == "transformers"

    frame = studio.metrics(run_id)
    train = frame.dropna(subset=["loss"])
    assert list(train["step"]) == [1, 2, 3, 4]  # one row per logged step, no duplicates
    assert all(math.isfinite(v) for v in train["loss"])
    assert frame["eval_loss"].notna().sum() >= 2  # evaluated at steps 2 and 4
    assert run.final_loss == pytest.approx(train["loss"].iloc[-1])

    # the dashboard process never imported the ML stack
    assert "torch" not in sys.modules and "transformers" not in sys.modules

    # secrets never reached the run folder
    config_text = (Path(run.output_dir).parent / "config.yaml").read_text()
    assert "hf_token" not in config_text and "hf_token" not in run.config_json

    load = run_python(
        "import sys; from peft import PeftModel; from transformers import AutoModelForCausalLM;"
        "base = AutoModelForCausalLM.from_pretrained(sys.argv[1]);"
        "m = PeftModel.from_pretrained(base, sys.argv[2]); print(type(m).__name__)",
        str(MODELS_CACHE / "SmolLM2-135M-Instruct"), str(adapter))
    assert load.returncode == 0, load.stderr[-2000:]
    assert "PeftModel" in load.stdout


def test_second_run_queues_and_stop_saves_checkpoint_and_adapter(studio, tiny_model):
    cfg = TrainConfig(model_name=str(tiny_model), max_steps=400, batch_size=2, max_seq_length=64, warmup_steps=0)
    run_id = studio.start(cfg)
    queued = studio.start(cfg)
    assert studio.get_run(queued).status == RunStatus.QUEUED.value
    studio.remove_from_queue(queued)
    wait_for_step(studio, run_id, 3)
    studio.stop(run_id)
    snap = studio.wait(run_id, timeout=120)
    assert snap.status is RunStatus.STOPPED, f"{snap.error}\n{studio.log_tail(run_id)}"
    run_dir = Path(studio.get_run(run_id).output_dir).parent
    saved = list((run_dir / "checkpoints").glob("checkpoint-*"))
    assert len(saved) == 1 and (saved[0] / "trainer_state.json").exists()
    assert int(saved[0].name.split("-")[1]) < 400
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()
    kinds = [e.kind for e in studio.events(run_id)]
    assert "checkpoint" in kinds and "control" in kinds


def test_resume_continues_from_the_checkpoint_with_optimizer_and_schedule(studio, tiny_model):
    cfg = TrainConfig(run_name="to resume", model_name=str(tiny_model), max_steps=16, batch_size=2,
                      max_seq_length=64, warmup_steps=0, learning_rate=1e-3)
    old = studio.start(cfg)
    wait_for_step(studio, old, 4)
    studio.stop(old)
    assert studio.wait(old, timeout=120).status is RunStatus.STOPPED
    checkpoint = next((Path(studio.get_run(old).output_dir).parent / "checkpoints").glob("checkpoint-*"))
    stopped_at = int(checkpoint.name.split("-")[1])
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json"} <= {p.name for p in checkpoint.iterdir()}

    new = studio.resume(old)
    snap = studio.wait(new, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(new, 80)}"
    own = studio.metrics(new).dropna(subset=["loss"])
    assert list(own["step"]) == list(range(stopped_at + 1, 17))  # the step count continues
    joined = studio.metrics(new, lineage=True).dropna(subset=["loss"])
    assert list(joined["step"]) == list(range(1, 17))  # the two runs' charts join without a gap
    parent = studio.metrics(old).dropna(subset=["loss"])
    last_lr = parent[parent["step"] == stopped_at]["learning_rate"].iloc[0]
    first_lr = own["learning_rate"].iloc[0]
    assert first_lr < last_lr  # the linear schedule went on; a fresh scheduler would restart at 1e-3
    assert studio.get_run(new).parent_run_id == old


def test_cancel_saves_nothing_and_keeps_completed_checkpoints(studio, tiny_model):
    cfg = TrainConfig(model_name=str(tiny_model), max_steps=400, batch_size=2, max_seq_length=64, save_steps=2,
                      warmup_steps=0)
    run_id = studio.start(cfg)
    wait_for_step(studio, run_id, 5)
    run_dir = Path(studio.get_run(run_id).output_dir)
    studio.cancel(run_id)
    snap = studio.wait(run_id, timeout=120)
    assert snap.status is RunStatus.CANCELLED
    assert not (run_dir / "adapter").exists()
    assert len(list((run_dir / "checkpoints").glob("checkpoint-*"))) >= 2
    assert not list((run_dir / "checkpoints").glob("tmp-checkpoint-*"))


def test_worker_failure_is_reported_with_reason_and_log(studio, tmp_path, tiny_model):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model, broken)  # a real tokenizer, but weights of an architecture nobody knows
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    run_id = studio.start(TrainConfig(model_name=str(broken), max_steps=2))
    snap = studio.wait(run_id, timeout=180)
    assert snap.status is RunStatus.FAILED
    run = studio.get_run(run_id)
    assert "no-such-architecture" in run.error
    assert "Traceback" in run.log_tail


def test_cli_runs_a_yaml_config(tmp_path, tiny_model):
    config = tmp_path / "run.yaml"
    config.write_text(f"run_name: cli run\nmodel_name: {tiny_model}\nmax_steps: 3\nbatch_size: 2\nmax_seq_length: 64\n")
    env = {"FINETUNE_STUDIO_HOME": str(tmp_path / "home"), "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE),
           "FINETUNE_STUDIO_FORCE_CPU": "1", "FINETUNE_STUDIO_ALLOWED_ROOTS": f"{tmp_path}:{ROOT / '.test-cache'}",
           "HF_TOKEN": "hf_cli_secret_should_not_leak"}
    result = run_python("from trainer_core.__main__ import main; raise SystemExit(main())", "run", "--config",
                        str(config), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "final status: completed" in result.stdout
    listing = run_python("from trainer_core.__main__ import main; raise SystemExit(main())", "runs", env=env)
    assert "completed" in listing.stdout and "cli run" in listing.stdout
    home = tmp_path / "home"
    for path in home.rglob("*"):
        if path.is_file() and path.suffix in (".db", ".yaml", ".log", ".jsonl", ".json", ".db-wal"):
            assert b"hf_cli_secret_should_not_leak" not in path.read_bytes(), path
    bad = run_python("from trainer_core.__main__ import main; raise SystemExit(main())", "run", "--config",
                     str(config), "--set", "learning_rate=0", env=env)
    assert bad.returncode == 2 and "learning_rate" in bad.stderr
