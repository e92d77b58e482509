"""Stop & save, resume, Cancel and db rebuild for the preference and RL methods (issue 19), on the tiny model
through the orchestrator: the lifecycle is generic (every TRL trainer is a transformers.Trainer), and this
proves it per method, open metrics (GRPO's rewards/<name>/mean, DPO's rewards/margins) included."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from db.store import Store
from tests.support import wait_for_step
from trainer_core.config import BUNDLED_PAIRS, TrainConfig
from trainer_core.jobs import rebuild
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train

STEPS = 40  # far more than the steps before Stop: the run is still training when the request arrives
KEYS = {"dpo": "rewards/margins", "kto": "kl", "grpo": "rewards/length/mean"}


def config(method: str, model: Path) -> TrainConfig:
    fields = {"local_datasets": [BUNDLED_PAIRS]} if method != "grpo" else {
        "grpo": {"num_generations": 2, "max_completion_length": 8, "max_prompt_length": 96,
                 "rewards": [{"type": "length", "target": 4}], "sample_every": 0}}
    return TrainConfig.from_dict({  # read as a YAML file is: a method's settings are its section
        "run_name": f"lifecycle {method}", "model_name": str(model), "method": method, "max_steps": STEPS,
        "batch_size": 2, "max_seq_length": 128, "warmup_steps": 0, "logging_steps": 1, "learning_rate": 1e-3,
        **fields})


def stop_resume_rebuild(studio, cfg: TrainConfig, key: str, steps: int, every_key: bool = False) -> Path:
    """Start ``cfg``, Stop it after step 2, resume it to ``steps`` and rebuild the database; checks the checkpoint
    Stop left, the step count of ``key`` going on from it with no step lost or repeated, and the metrics restored
    by the rebuild: ``key``'s, or (``every_key``) ``key`` and every open key of the runs. Returns the run folder."""
    old = studio.start(cfg)
    wait_for_step(studio, old, 2)
    studio.stop(old)
    snap = studio.wait(old, timeout=300)
    assert snap.status is RunStatus.STOPPED, f"{snap.error}\n{studio.log_tail(old, 60)}"
    run_dir = Path(studio.get_run(old).output_dir).parent
    [checkpoint] = (run_dir / "checkpoints").glob("checkpoint-*")
    stopped_at = int(checkpoint.name.split("-")[1])
    assert 2 <= stopped_at < steps

    new = studio.resume(old)
    snap = studio.wait(new, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(new, 60)}"
    own = studio.metrics(new, keys=[key]).dropna(subset=[key])
    assert list(own["step"]) == list(range(stopped_at + 1, steps + 1))  # the step count went on from the checkpoint
    joined = studio.metrics(new, lineage=True, keys=[key]).dropna(subset=[key])
    assert list(joined["step"]) == list(range(1, steps + 1))  # no step lost or duplicated across the two runs

    keys_before = {run: studio.metric_keys(run) for run in (old, new)}
    compared = {run: [key, *keys_before[run]] if every_key else [key] for run in (old, new)}
    before = {run: studio.metrics(run, keys=compared[run]) for run in (old, new)}
    url = studio.store.url
    studio.close()
    report = rebuild.rebuild(url)
    assert sorted(report.runs) == sorted([old, new])
    store = Store(url)
    for run in (old, new):
        assert store.metric_keys(run) == keys_before[run]
        pd.testing.assert_frame_equal(store.metrics_frame(run, keys=compared[run]), before[run])  # NaN gaps too
    assert store.get_run(new).parent_run_id == old
    store.engine.dispose()
    return run_dir


@pytest.mark.parametrize("method", sorted(KEYS))
def test_stop_saves_resume_continues_and_rebuild_restores_every_metric(method, studio, tiny_model):
    run_dir = stop_resume_rebuild(studio, config(method, tiny_model), KEYS[method], STEPS)
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()


def test_cancel_of_a_grpo_run_saves_nothing(studio, tiny_model):
    run_id = studio.start(config("grpo", tiny_model))
    wait_for_step(studio, run_id, 1)
    studio.cancel(run_id)
    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.CANCELLED, f"{snap.error}\n{studio.log_tail(run_id, 60)}"
    run_dir = paths.run_dir(run_id)
    assert run_dir.is_dir() and not (run_dir / "adapter").exists()
    assert list((run_dir / "checkpoints").glob("checkpoint-*")) == []  # an absent folder globs to nothing too
