"""Eval jobs on the orchestrator's side: an eval spec completed from its run (the same format mapping as
training), the cached base-model baseline (one per base model, test data and settings), and the
predictions file of a running eval. No ML stack, no SQL: the store and ``Orchestrator.submit`` do the work."""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from db.entities import EvalResultRecord
from trainer_core.auth import access
from trainer_core.specs import model_source
from trainer_core.config import ConfigError, FieldError
from trainer_core.data import DatasetError
from trainer_core.data.sources import resolve_source
from trainer_core.evaluation import retrieval
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobs import queue
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus

if TYPE_CHECKING:
    from trainer_core.jobs.orchestrator import Orchestrator

PREDICTIONS = "predictions.jsonl"  # written by worker/evaluate.py, a line per sample as it is scored
PREDICTIONS_SHOWN = 2_000  # lines of a running eval's predictions file read for the page


def prepared(spec: EvalSpec) -> EvalSpec:
    """The spec as it will run: an eval of a run reads rows with that run's format settings (unless the spec
    sets its own), a local file by its absolute path, and it gets a name."""
    values: dict = {}
    if not spec.source.is_base and (spec.format_type, spec.custom_format_mapping, spec.system_prompt) == ("auto", {}, ""):
        try:
            cfg = model_source.run_config(spec.source.run_id)
            values.update(format_type=cfg.format_type if cfg.format_type != "text" else "auto",
                          custom_format_mapping=dict(cfg.custom_format_mapping), system_prompt=cfg.system_prompt)
        except model_source.SourceError:
            pass  # validation names the missing run
    if not spec.source.is_base and spec.image_max_side == 0:  # a vision run's images are seen as it trained on them
        try:
            values["image_max_side"] = int(model_source.run_config(spec.source.run_id).image_max_side or 0)
        except model_source.SourceError:
            pass  # validation names the missing run
    if not spec.source.is_base and retrieval.wanted(spec):  # an embedding run: its prompts, length and columns
        try:
            taken = retrieval.run_settings(spec.source.run_id)
        except model_source.SourceError:
            taken = {}  # validation names the missing run
        if taken and not spec.custom_format_mapping:
            values["custom_format_mapping"] = taken["custom_format_mapping"]
        if taken and (spec.query_prompt, spec.document_prompt, spec.max_seq_length) == ("", "", 0):
            values.update({k: taken[k] for k in ("query_prompt", "document_prompt", "max_seq_length")})
    # a bundled demo set stays named (its absolute path lies outside the allowed folders), as training keeps it
    bundled = spec.data.strip().startswith("bundled:")
    if spec.data.strip() and eval_samples.data_kind(spec.data) == "file" and not bundled:
        try:
            values["data"] = str(resolve_source(spec.data.strip(), "data"))
        except DatasetError:
            pass  # validation says what is wrong with the path
    if isinstance(spec.lm_eval_tasks, list):  # the worker runs in its job folder: a relative YAML path is ours
        values["lm_eval_tasks"] = [str(Path(t).expanduser().absolute())
                                   if isinstance(t, str) and t.endswith((".yaml", ".yml")) and "\x00" not in t else t
                                   for t in spec.lm_eval_tasks]
    if isinstance(spec.metrics, list) and "reward" in spec.metrics and not spec.reward_run and not spec.source.is_base:
        values["reward_run"] = spec.source.run_id  # the baseline (a copy with the base model) scores with these too
    if not spec.name:
        values["name"] = f"Eval · {_source_label(spec.source)}"
    return dataclasses.replace(spec, **values)


def _source_label(source: model_source.ModelSource) -> str:
    try:
        return model_source.resolve(source).label
    except model_source.SourceError:
        return source.key


@dataclass(frozen=True)
class Started:
    """What one submission queued: the eval, its baseline (found or new), and whether this submission queued it."""
    job_id: str
    baseline_id: str | None = None
    baseline_new: bool = False


def start(orch: "Orchestrator", spec: EvalSpec, actor: access.Actor | None) -> tuple[str, str | None]:
    """Submit an eval (and, for a run's model, its base-model baseline unless one exists or is under way).
    Returns (eval job id, baseline job id or None)."""
    started = submit(orch, spec, actor)
    return started.job_id, started.baseline_id


def submit(orch: "Orchestrator", spec: EvalSpec, actor: access.Actor | None) -> Started:
    """``start``, also saying whether the baseline is new (the CLI cancels what it started, ``cancel``)."""
    spec = prepared(spec)
    errors = spec.validate()
    if errors:
        raise ConfigError(errors)
    if actor is not None and actor.role is not access.Role.ADMIN and spec.admin_only():
        # said on the form's field here; the orchestrator refuses the same spec from anyone else (any route)
        raise ConfigError([FieldError(*reason.split(": ", 1)) for reason in spec.admin_only()])
    resolved = model_source.resolve(spec.source)
    try:
        fingerprint = eval_samples.fingerprint(spec) if spec.data.strip() else ""
    except DatasetError as exc:
        raise ConfigError([FieldError(exc.field, exc.message)]) from None
    settings = eval_samples.settings_hash(spec)
    baseline_id, baseline_new = None, False
    # One lock around "is there a baseline? if not, queue one": two submissions at once queue it once.
    with _baseline_lock():
        if spec.baseline and not spec.source.is_base and fingerprint:
            base_source = model_source.ModelSource(model=resolved.base_model)
            found = orch.store.find_eval(base_source.key, fingerprint, settings)
            if found is not None and reusable(found):
                baseline_id = found.job_id
            else:
                base_spec = dataclasses.replace(spec, source=base_source, baseline=False,
                                                name=f"Baseline · {_source_label(base_source)}")
                baseline_id = _submit(orch, base_spec, resolved.base_model, fingerprint, settings, actor)
                baseline_new = True
        try:
            job_id = _submit(orch, spec, resolved.base_model, fingerprint, settings, actor)
        except Exception:
            # Both or neither: a baseline launched for an eval that never got submitted would run unfollowed,
            # holding the device. One found under way belongs to the evals that found it and stays.
            if baseline_new:
                _take_back(orch, baseline_id, actor)
            raise
    return Started(job_id, baseline_id, baseline_new)


def _baseline_lock() -> queue.FileLock:
    return queue.FileLock(paths.data_root() / ".eval-baseline.lock")


def reusable(found: EvalResultRecord) -> bool:
    """A baseline under way (queued, starting or running), or one that completed with samples scored to the end
    (an eval of 0 samples, from before that was a failure, or a partial one is never reused). One being stopped
    or cancelled ends stopped or cancelled, which never counts: an eval waiting for it would get no baseline."""
    if found.status is RunStatus.STOPPING:
        return False
    if not found.status.is_terminal():
        return True
    metrics = found.metrics or {}
    return found.status is RunStatus.COMPLETED and bool(metrics.get("samples")) and not metrics.get("partial")


def baseline_of(store, result: EvalResultRecord) -> EvalResultRecord | None:
    """The base model's eval on the same data and settings (None when there is none, or it is the same job). A
    completed baseline counts only when it scored the same test rows as ``result`` (a row too long for one
    model's context is left out of that model's eval only): other rows would be no comparison."""
    found = store.find_eval(f"base:{result.base_model}", result.data_fingerprint, result.settings_hash)
    if found is None or found.job_id == result.job_id:
        return None
    if found.status is not RunStatus.COMPLETED or result.metrics is None:
        return found  # under way (or failed): its status is shown
    return found if same_rows(store, result, found) else None


def same_rows(store, one: EvalResultRecord, other: EvalResultRecord) -> bool:
    if (one.metrics or {}).get("samples") != (other.metrics or {}).get("samples"):
        return False
    mine, theirs = store.eval_samples(one.job_id)["index"].tolist(), store.eval_samples(other.job_id)["index"].tolist()
    return not mine or not theirs or mine == theirs  # rows not stored (an old or rebuilt result): the count decides


def cancel(orch: "Orchestrator", started: Started, actor: access.Actor | None) -> list[str]:
    """Cancel an eval and the baseline this submission queued, unless another eval still waits for that
    baseline. Returns the job ids cancelled."""
    orch.cancel(started.job_id, actor=actor)
    cancelled = [started.job_id]
    if not (started.baseline_new and started.baseline_id):
        return cancelled
    with _baseline_lock():  # no new eval can pick the baseline up while this decides
        baseline = orch.store.eval_result(started.baseline_id)
        if baseline is None or baseline.status.is_terminal() or _waiting_for(orch, baseline, started.job_id):
            return cancelled
        orch.cancel(started.baseline_id, actor=actor)
    return cancelled + [started.baseline_id]


def _waiting_for(orch: "Orchestrator", baseline: EvalResultRecord, besides: str) -> bool:
    """Whether an eval other than ``besides`` that is queued or running compares with ``baseline``."""
    for run in orch.store.active_runs() + orch.store.queued_runs():
        if run.kind is not JobKind.EVAL or run.id in (besides, baseline.job_id):
            continue
        other = orch.store.eval_result(run.id)
        if other is not None and other.source_key != baseline.source_key and (
                other.base_model, other.data_fingerprint, other.settings_hash) == (
                baseline.base_model, baseline.data_fingerprint, baseline.settings_hash):
            return True
    return False


def _submit(orch: "Orchestrator", spec: EvalSpec, base_model: str, fingerprint: str, settings: str,
            actor: access.Actor | None) -> str:
    job_id = orch.submit(spec, actor)
    # The result row exists from now on (metrics NULL until the job reports them): a baseline under way is found.
    try:
        orch.store.save_eval_result(job_id, source_key=spec.source.key, source_run_id=spec.source.run_id,
                                    checkpoint=spec.source.checkpoint, base_model=base_model,
                                    data_fingerprint=fingerprint, settings_hash=settings,
                                    data_label=spec.dataset_label, created_at=time.time())
    except Exception:
        _take_back(orch, job_id, actor)  # a job without its result row is never found, nor shown as an eval
        raise
    return job_id


def _take_back(orch: "Orchestrator", job_id: str, actor: access.Actor | None) -> None:
    """Cancel a job this submission started and cannot finish submitting (a queued one leaves the queue), and
    say why in its timeline; the caller re-raises the submission's own error."""
    orch.cancel(job_id, actor=actor)
    orch.store.add_event(job_id, "control", "cancelled: the submission it belonged to failed")


def read_predictions(job_id: str, limit: int = PREDICTIONS_SHOWN) -> list[dict]:
    """The lines of an eval job's predictions file written so far (a line still being written is skipped)."""
    try:
        path = paths.run_dir(job_id) / PREDICTIONS
        with open(path, "rb") as fh:
            data = fh.read(64 << 20)
    except (OSError, paths.UnsafePathError):
        return []
    rows = []
    for raw in data.split(b"\n")[:-1][:limit]:  # the part after the last newline may be half-written
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def predictions_path(job_id: str) -> Path:
    return paths.run_dir(job_id) / PREDICTIONS
