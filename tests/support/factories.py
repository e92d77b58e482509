"""Runs made without training: a run's database row, its folder as a finished worker leaves it, a finished run with
its metrics, and a run the database says is active with nobody following it. One factory per shape; tests pass
what differs (the compare table's times, the playground's checkpoints) as arguments."""
from __future__ import annotations

import os
import time
from pathlib import Path

from db.entities import RunRecord
from db.store import Store
from trainer_core.config import TrainConfig
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind


def run_record(run_id: str = "r1", status: RunStatus = RunStatus.RUNNING, *, name: str | None = None,
               created_at: float = 100.0, **values) -> RunRecord:
    """A run's database row (not stored): named "run <id>" unless ``name`` says otherwise."""
    return RunRecord(id=run_id, name=f"run {run_id}" if name is None else name, status=status.value,
                     created_at=created_at, **values)


def stored_run(store: Store, run_id: str = "r1", status: RunStatus = RunStatus.RUNNING, **values) -> RunRecord:
    """``run_record`` created in ``store``."""
    return store.create_run(run_record(run_id, status, **values))


def run_folder(run_id: str, name: str = "", lora: bool = True, final: bool = True,
               steps: tuple[int, ...] = ()) -> Path:
    """A training run's folder as the worker leaves it: config.yaml, its job kind, the final adapter (LoRA) or model
    (full) when ``final``, and a checkpoint per step in ``steps``; the weight files are empty stand-ins."""
    folder = paths.run_dir(run_id)
    folder.mkdir(parents=True)
    write_kind(folder, JobKind.TRAIN)
    cfg = TrainConfig(run_name=name, adapter="lora" if lora else "full")
    (folder / "config.yaml").write_text(cfg.to_yaml())
    weights = "adapter_config.json" if lora else "config.json"
    if final:
        (folder / ("adapter" if lora else "model")).mkdir()
        (folder / ("adapter" if lora else "model") / weights).write_text("{}")
    for step in steps:
        checkpoint = folder / "checkpoints" / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / weights).write_text("{}")
        (checkpoint / "trainer_state.json").write_text("{}")
    return folder


def insert_finished_run(store: Store, run_id: str, name: str, losses: list[float | None],
                        status: RunStatus = RunStatus.COMPLETED, eval_losses: dict[int, float] | None = None,
                        output_dir: str | None = None, **values) -> None:
    """A finished run's row and its metrics (loss, learning rate, grad norm per step; eval losses at the steps
    given), stored as the pump stores them. ``output_dir`` defaults to a folder nobody made."""
    now = time.time()
    store.create_run(RunRecord(id=run_id, name=name, status=RunStatus.RUNNING.value, model="tiny-model",
                               dataset="demo.jsonl", method="LoRA", created_at=now - 60, started_at=now - 50,
                               total_steps=len(losses), config_json='{"learning_rate": 0.0002}'))
    rows = [{"step": i + 1, "loss": loss, "learning_rate": 2e-4 * (1 - i / len(losses)), "grad_norm": 1.0 + i}
            for i, loss in enumerate(losses)]
    for step, value in (eval_losses or {}).items():
        rows[step - 1]["eval_loss"] = value
    store.append_metrics(run_id, rows)
    store.finish_run(run_id, status, steps_done=len(losses), final_loss=losses[-1],
                     output_dir=output_dir or f"/tmp/outputs/{run_id}", **values)


def finished_run(store: Store, run_id: str, name: str, final: bool = True, steps: tuple[int, ...] = (),
                 status: RunStatus = RunStatus.COMPLETED) -> Path:
    """A finished LoRA run with its folder (``run_folder``) and its stored row and metrics: what the Playground,
    serve and export pages offer as a source."""
    folder = run_folder(run_id, name, final=final, steps=steps)
    insert_finished_run(store, run_id, name, [2.0] * 10, status, output_dir=str(folder))
    return folder


def orphan_run(store, status: str = RunStatus.RUNNING.value, pid: int | None = None,
               pid_started_at: float | None = None, make_dir: bool = True) -> str:
    """A run the database says is active, with no orchestrator following it (a server that went away)."""
    run_id = f"orphan-{os.getpid()}-{time.monotonic_ns()}"
    if make_dir:
        paths.run_dir(run_id).mkdir(parents=True)
    store.create_run(RunRecord(id=run_id, name="orphan", status=status, created_at=time.time(), started_at=time.time(),
                               output_dir=str(paths.run_dir(run_id)), pid=pid, pid_started_at=pid_started_at,
                               total_steps=10))
    return run_id
