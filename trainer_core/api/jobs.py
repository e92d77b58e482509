"""Fine-tuning jobs: an API job is an ordinary training run, started, stopped and resumed through the orchestrator.

The job's id is ``ftjob-<run id>`` of its first run. What only the API knows (the files, suffix, metadata, the
hyperparameters as asked) is a small record in ``<data root>/api/jobs/<run id>.json``, written before the answer;
everything else is read from the run's row and folder each time, so the job's state survives a restart of the
API server (and of the dashboard) like the run's own. Pause is the studio's Stop & save; resume starts the run
that continues it from its checkpoint (the orchestrator's resume), which the job follows from then on.

A job whose ``model`` is a previous job's ``fine_tuned_model`` (or one of its checkpoints) starts from that run's
weights (``start_point``): a LoRA run's adapter is loaded, trainable, on the same base (the run's ``init_adapter``,
with the adapter's rank, alpha and target modules); a full fine-tune's saved model is the new run's model. The new
model is named after the first job's base, as OpenAI names it. Only the job's owner (or an admin) continues it; a
name that is unknown, someone else's or not succeeded is refused naming ``model``.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from db.entities import RunRecord
from trainer_core.api import files, models, requests, servers
from trainer_core.api.errors import ApiError, forbidden, invalid, not_found
from trainer_core.auth import access
from trainer_core.config import ConfigError
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.jobs.refusals import RunRefused
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.specs import model_source
from trainer_core.specs.model_source import ModelSource

ORGANIZATION = "finetune-studio"
LORA_FIELDS = ("adapter", "lora_r", "lora_alpha", "target_modules", "use_rslora")  # what a saved adapter fixes
STATUS = {RunStatus.QUEUED: "queued", RunStatus.STARTING: "running", RunStatus.RUNNING: "running",
          RunStatus.STOPPING: "running", RunStatus.COMPLETED: "succeeded", RunStatus.STOPPED: "paused",
          RunStatus.CANCELLED: "cancelled", RunStatus.FAILED: "failed"}


@dataclass
class JobRecord:
    run_id: str  # the job's first run
    created_at: int
    owner: str
    base_model: str  # the studio's model_name
    request: dict[str, Any] = field(default_factory=dict)  # requests.JobRequest as a dict
    cancelled: bool = False  # cancelled while paused (its last run had stopped; nothing was running)

    @property
    def id(self) -> str:
        return models.JOB_PREFIX + self.run_id


def folder() -> Path:
    path = paths.data_root() / "api" / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _save(record: JobRecord) -> None:
    target = folder() / f"{record.run_id}.json"
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
    partial.write_text(json.dumps(asdict(record)))
    os.replace(partial, target)


def get(job_id: object) -> JobRecord:
    run_id = job_id.removeprefix(models.JOB_PREFIX) if isinstance(job_id, str) else ""
    if not isinstance(job_id, str) or not job_id.startswith(models.JOB_PREFIX) or not paths.RUN_ID_RE.fullmatch(run_id):
        raise not_found("fine-tuning job", str(job_id)[:100], "fine_tuning_job_id")
    try:
        return JobRecord(**json.loads((folder() / f"{run_id}.json").read_text()))
    except FileNotFoundError:
        raise not_found("fine-tuning job", job_id, "fine_tuning_job_id") from None


def all_records() -> list[JobRecord]:
    """Every job, newest first (run ids begin with their start time)."""
    found = []
    for path in sorted(folder().glob("*.json"), reverse=True):
        try:
            found.append(JobRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return found


def runs_of(orch: Orchestrator, record: JobRecord) -> list[RunRecord]:
    """The job's runs, first to latest: its first run, then each run that resumed the one before."""
    chain: list[RunRecord] = []
    run = orch.get_run(record.run_id)
    while run is not None and len(chain) < 1000:
        chain.append(run)
        resumed = [c for c in orch.store.children(run.id) if c.kind is JobKind.TRAIN and c.resumed_from_step is not None]
        run = orch.get_run(resumed[-1].id) if resumed else None
    return chain


def create(orch: Orchestrator, body: object, actor: access.Actor) -> dict:
    name = body.get("model") if isinstance(body, dict) else None
    start = start_point(orch, name, actor) if isinstance(name, str) and name.startswith("ft:") else None
    request, cfg = requests.read(body, start)
    shown = {str(files.get(request.training_file).training_path): request.training_file}
    if request.validation_file:
        shown[str(files.get(request.validation_file).training_path)] = request.validation_file
    try:
        run_id = orch.start(cfg, actor=actor)
    except ConfigError as exc:
        raise requests.config_error(exc, shown, request.studio) from None
    except RunRefused as exc:
        raise forbidden(str(exc)) from None
    servers.make_room(orch, run_id)
    record = JobRecord(run_id=run_id, created_at=int(orch.get_run(run_id).created_at), owner=actor.name,
                       base_model=start.base_model if start is not None else cfg.model_name, request=asdict(request))
    _save(record)
    return render(orch, record)


def render(orch: Orchestrator, record: JobRecord) -> dict:
    """OpenAI's fine-tuning job object, from the record and the job's latest run."""
    request = requests.JobRequest(**record.request)
    chain = runs_of(orch, record)
    latest = chain[-1] if chain else None
    status = STATUS[latest.status] if latest is not None else "failed"
    if status == "paused" and record.cancelled:
        status = "cancelled"
    succeeded = status == "succeeded"
    error = None
    if status == "failed":
        error = {"code": "training_failed", "message": (latest.error if latest else "") or
                 "the run's record is gone (deleted from History)", "param": None}
    hyper = {key: request.hyperparameters[key] for key in ("n_epochs", "batch_size", "learning_rate_multiplier")}
    method: dict[str, Any] = {"type": request.method, request.method: {"hyperparameters": dict(request.hyperparameters)}}
    if request.method == "dpo":
        method["dpo"]["hyperparameters"]["beta"] = request.beta if request.beta is not None else "auto"
    if request.method == "reinforcement":
        method["reinforcement"]["grader"] = request.grader
    tokens = [r.tokens_seen for r in chain if r.tokens_seen]
    return {"id": record.id, "object": "fine_tuning.job", "created_at": record.created_at,
            "error": error, "fine_tuned_model": fine_tuned_model(record) if succeeded else None,
            "finished_at": int(latest.finished_at) if latest and latest.finished_at and latest.status.is_terminal()
            else None,
            "hyperparameters": hyper, "model": request.model, "organization_id": ORGANIZATION,
            "result_files": [], "seed": request.seed, "status": status,
            "trained_tokens": sum(tokens) if succeeded and tokens else None,
            "training_file": request.training_file, "validation_file": request.validation_file,
            "estimated_finish": None, "integrations": [], "metadata": request.metadata or None, "method": method,
            "user_provided_suffix": request.suffix or None}


def fine_tuned_model(record: JobRecord, step: int | None = None) -> str:
    return models.fine_tuned_name(record.base_model, record.request.get("suffix", ""), record.id, step)


def run_with_checkpoint(chain: list[RunRecord], step: int) -> str | None:
    """The latest of the job's runs that saved a checkpoint at ``step`` (None when none did)."""
    for run in reversed(chain):
        if (paths.run_dir(run.id) / "checkpoints" / f"checkpoint-{step}").is_dir():
            return run.id
    return None


def listing(orch: Orchestrator, cursor: str | None, limit: int, metadata: dict[str, str]) -> dict:
    records = [r for r in all_records() if all(r.request.get("metadata", {}).get(k) == v for k, v in metadata.items())]
    return page([render(orch, r) for r in after(records, cursor, lambda r: r.id)[:limit + 1]], limit)


def after(items: list, cursor: str | None, key) -> list:
    """The items after the one whose ``key`` is ``cursor`` (OpenAI's ``after``); all of them without a cursor."""
    if not cursor:
        return items
    ids = [key(item) for item in items]
    return items[ids.index(cursor) + 1:] if cursor in ids else []


def page(data: list[dict], limit: int) -> dict:
    """OpenAI's list object; ``data`` holds up to one item more than the page, to know ``has_more``."""
    shown = data[:limit]
    return {"object": "list", "data": shown, "has_more": len(data) > limit,
            "first_id": shown[0]["id"] if shown else None, "last_id": shown[-1]["id"] if shown else None}


# ---------------------------------------------------------------------- continuing a fine-tuned model
def start_point(orch: Orchestrator, name: str, actor: access.Actor) -> requests.StartPoint:
    """Where a job continuing the fine-tuned model ``name`` starts; ApiError naming ``model`` when it cannot."""
    parsed = models.parse_fine_tuned(name)
    if parsed is None:
        raise models.unknown_model(name)
    job_id, step = parsed
    try:
        record = get(job_id)
    except ApiError:
        raise models.unknown_model(name) from None
    if fine_tuned_model(record, step) != name or not access.allowed(actor, access.Action.RESUME, record.owner):
        raise models.unknown_model(name)  # someone else's model is one this caller has no access to (OpenAI's word)
    chain = runs_of(orch, record)
    if step is None and (not chain or chain[-1].status is not RunStatus.COMPLETED):
        raise ApiError(400, f"The model '{name}' cannot be fine-tuned further: its job {record.id} is "
                            f"{status_of(orch, record)}, not succeeded", "invalid_request_error", "model",
                       "model_not_ready")
    run_id = chain[-1].id if step is None else run_with_checkpoint(chain, step)
    if run_id is None:
        raise models.unknown_model(name)
    try:
        resolved = model_source.resolve(ModelSource(run_id=run_id, checkpoint=step))
    except model_source.SourceError as exc:
        raise ApiError(400, f"The model '{name}' cannot be fine-tuned further: {exc}", "invalid_request_error",
                       "model", "model_not_ready") from None
    if resolved.adapter_dir is None:  # full weights: the new run trains on them
        return requests.StartPoint(str(resolved.model_dir), record.base_model)
    settings = {key: getattr(resolved.config, key) for key in LORA_FIELDS}
    return requests.StartPoint(resolved.base_model, record.base_model,
                               {**settings, "init_adapter": str(resolved.adapter_dir)})


# ---------------------------------------------------------------------- control
def cancel(orch: Orchestrator, record: JobRecord, actor: access.Actor) -> dict:
    latest = _latest(orch, record)
    if (latest.status.is_terminal() and latest.status is not RunStatus.STOPPED) or record.cancelled:
        raise invalid(f"Job {record.id} is already {status_of(orch, record)}; only a queued, running or paused job "
                      "can be cancelled", "fine_tuning_job_id")
    if latest.status is RunStatus.STOPPED:  # paused: nothing runs; the job ends here
        _act(lambda: access.check(actor, access.Action.CANCEL, latest.owner))
        record.cancelled = True
        _save(record)
        return render(orch, record)
    _act(lambda: orch.cancel(latest.id, actor=actor))
    return render(orch, record)


def pause(orch: Orchestrator, record: JobRecord, actor: access.Actor) -> dict:
    latest = _latest(orch, record)
    if latest.status not in (RunStatus.STARTING, RunStatus.RUNNING):
        raise invalid(f"Job {record.id} is {STATUS[latest.status]}: only a running job can be paused",
                      "fine_tuning_job_id")
    _act(lambda: orch.stop(latest.id, actor=actor))  # Stop & save: its checkpoint is where resume goes on
    return render(orch, record)


def resume(orch: Orchestrator, record: JobRecord, actor: access.Actor) -> dict:
    latest = _latest(orch, record)
    if latest.status is not RunStatus.STOPPED or record.cancelled:
        raise invalid(f"Job {record.id} is {status_of(orch, record)}: only a paused job can be resumed",
                      "fine_tuning_job_id")
    resumed: list[str] = []
    _act(lambda: resumed.append(orch.resume(latest.id, actor=actor)))
    servers.make_room(orch, resumed[0])
    return render(orch, record)


def status_of(orch: Orchestrator, record: JobRecord) -> str:
    return render(orch, record)["status"]


def _latest(orch: Orchestrator, record: JobRecord) -> RunRecord:
    chain = runs_of(orch, record)
    if not chain:
        raise not_found("fine-tuning job", record.id, "fine_tuning_job_id")
    return chain[-1]


def _act(action) -> None:
    try:
        action()
    except (RunRefused, access.NotAllowed) as exc:
        message = str(exc)
        if message.startswith("Not allowed"):
            raise forbidden(message) from None
        raise ApiError(409, message, "invalid_request_error", "fine_tuning_job_id", "conflict") from None
    except ConfigError as exc:
        raise requests.config_error(exc) from None
