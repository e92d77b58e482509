"""A job's events and checkpoints as OpenAI's objects, read from its runs' timelines, metrics and folders.

Events: the job's creation, each run's timeline (status, data, checkpoint, warning, alert, control lines: the
same the Run details page shows) as ``message`` events, and each logged step as a ``metrics`` event
(``{"step", "train_loss", "valid_loss", "total_steps", ...}``), newest first like OpenAI's; ``after`` is the
last id of the previous page. Ids are stable: ``ftevent-<run id>-t<timeline row>`` and ``-s<step>``.
Checkpoints: each run's completed ``checkpoint-<step>`` folders, with the metrics of that step; a checkpoint's
``fine_tuned_model_checkpoint`` is a model name ``/v1/chat/completions`` answers to.
"""
from __future__ import annotations

from trainer_core.api import jobs
from trainer_core.api.jobs import JobRecord
from trainer_core.specs import checkpoints
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths

LEVELS = {"warning": "warn", "alert": "warn", "error": "error"}
METRIC_NAMES = {"loss": "train_loss", "eval_loss": "valid_loss", "learning_rate": "learning_rate",
                "grad_norm": "grad_norm", "epoch": "epoch", "tokens_seen": "tokens_seen",
                "reward": "train_reward_mean", "eval_reward": "valid_reward_mean"}  # GRPO's weighted total reward


def events(orch: Orchestrator, record: JobRecord) -> list[dict]:
    """Every event of the job, newest first."""
    found = [(float(record.created_at), 0, {"id": f"ftevent-{record.run_id}-created", "object": "fine_tuning.job.event",
                                            "created_at": record.created_at, "level": "info", "type": "message",
                                            "message": f"Created fine-tuning job: {record.id}", "data": {}})]
    for n, note in enumerate(record.request.get("notes", [])):  # what the request asked that the job ignores
        found.append((record.created_at + 1e-6 * (n + 1), 0, {
            "id": f"ftevent-{record.run_id}-note{n}", "object": "fine_tuning.job.event",
            "created_at": record.created_at, "level": "warn", "type": "message", "message": note, "data": {}}))
    chain = jobs.runs_of(orch, record)
    for run in chain:
        for event in orch.events(run.id):
            found.append((event.ts, 1, {"id": f"ftevent-{run.id}-t{event.id}", "object": "fine_tuning.job.event",
                                        "created_at": int(event.ts), "level": LEVELS.get(event.kind, "info"),
                                        "type": "message",
                                        "message": event.message, "data": {"kind": event.kind}}))
        for row in orch.store.metric_rows(run.id):
            data = {"step": row["step"], "total_steps": run.total_steps}
            data.update({name: row[key] for key, name in METRIC_NAMES.items() if row.get(key) is not None})
            loss = f"training loss={row['loss']:.4f}" if row.get("loss") is not None else ""
            valid = f"validation loss={row['eval_loss']:.4f}" if row.get("eval_loss") is not None else ""
            reward = f"reward={row['reward']:.4f}" if row.get("reward") is not None else ""
            text = ", ".join(t for t in (loss, valid, reward) if t) or "metrics"
            ts = row.get("wall_time") or run.started_at or run.created_at
            found.append((ts, 2, {"id": f"ftevent-{run.id}-s{row['step']}", "object": "fine_tuning.job.event",
                                  "created_at": int(ts), "level": "info", "type": "metrics",
                                  "message": f"Step {row['step']}/{run.total_steps}: {text}", "data": data}))
    status = jobs.STATUS[chain[-1].status] if chain else ""
    if status in ("succeeded", "failed"):
        ts = chain[-1].finished_at or chain[-1].created_at
        ending = ((f"New fine-tuned model created: {jobs.fine_tuned_model(record)}", "info"),
                  ("The job has successfully completed", "info")) if status == "succeeded" else \
            ((f"The job failed: {chain[-1].error or 'see the run in the studio'}", "error"),)
        for n, (message, level) in enumerate(ending):
            found.append((ts + 1e-6 * (n + 1), 3, {"id": f"ftevent-{record.run_id}-end{n}",
                                                   "object": "fine_tuning.job.event", "created_at": int(ts),
                                                   "level": level, "type": "message", "message": message,
                                                   "data": {}}))
    found.sort(key=lambda item: (item[0], item[1]))
    return [event for _, _, event in reversed(found)]


def events_page(orch: Orchestrator, record: JobRecord, after: str | None, limit: int) -> dict:
    return jobs.page(jobs.after(events(orch, record), after, lambda e: e["id"])[:limit + 1], limit)


def checkpoint_list(orch: Orchestrator, record: JobRecord) -> list[dict]:
    """The job's completed checkpoints, newest first."""
    found = []
    for run in jobs.runs_of(orch, record):
        try:
            folders = checkpoints.completed_checkpoints(paths.run_dir(run.id) / "checkpoints")
        except paths.UnsafePathError:
            continue
        rows = {row["step"]: row for row in orch.store.metric_rows(run.id)} if folders else {}
        for folder in folders:
            step = int(folder.name.rsplit("-", 1)[1])
            row = rows.get(step, {})
            metrics = {"step": float(step)}
            if row.get("loss") is not None:
                metrics["train_loss"] = row["loss"]
            if row.get("eval_loss") is not None:
                metrics["valid_loss"] = row["eval_loss"]
            found.append({"id": f"ftckpt-{run.id}-{step}", "object": "fine_tuning.job.checkpoint",
                          "created_at": int(folder.stat().st_mtime), "fine_tuning_job_id": record.id,
                          "fine_tuned_model_checkpoint": jobs.fine_tuned_model(record, step),
                          "metrics": metrics, "step_number": step})
    return sorted(found, key=lambda c: (c["step_number"], c["created_at"]), reverse=True)


def checkpoints_page(orch: Orchestrator, record: JobRecord, after: str | None, limit: int) -> dict:
    return jobs.page(jobs.after(checkpoint_list(orch, record), after, lambda c: c["id"])[:limit + 1], limit)
