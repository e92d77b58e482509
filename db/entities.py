"""Typed records the store returns: what pages, the CLI and the jobs package see of the database (never ORM
rows). Like mlflow's ``to_mlflow_entity()``, the store builds them from rows (``RunRecord.from_row``), so a
status is a ``RunStatus``, a kind a ``JobKind`` and the names of a run's secrets a tuple."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

from sqlalchemy import inspect

from db.models import Run, RunEvent, Sample
from trainer_core.protocol import training_type
from trainer_core.protocol.status import JobKind, RunStatus


@dataclass(frozen=True)
class RunRecord:
    """One job (a run): its row in the run table, typed. See db.models.Run for what each field holds.

    ``config_json`` and ``log_tail`` are None in the records of ``Store.list_runs`` (a page of History does
    not read them; ``get_run`` does)."""

    id: str
    name: str = ""
    status: RunStatus = RunStatus.QUEUED
    kind: JobKind = JobKind.TRAIN
    phase: str = ""
    model: str = ""
    dataset: str = ""
    method: str = ""
    method_name: str = ""
    adapter: str = ""
    engine: str = ""
    created_at: float = 0.0
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    steps_done: int = 0
    total_steps: int = 0
    epoch: Optional[float] = None
    last_loss: Optional[float] = None
    final_loss: Optional[float] = None
    best_eval_loss: Optional[float] = None
    tokens_seen: Optional[int] = None
    output_dir: str = ""
    config_json: Optional[str] = "{}"
    error: str = ""
    log_tail: Optional[str] = ""
    pid: Optional[int] = None
    pid_started_at: Optional[float] = None
    heartbeat_at: Optional[float] = None
    event_offset: int = 0
    queue_position: Optional[float] = None
    devices: str = ""
    parent_run_id: Optional[str] = None
    resumed_from_step: Optional[int] = None
    data_fingerprint: str = ""
    needs_secrets: tuple[str, ...] = ()
    sparkline: Optional[str] = None
    secrets_holder: str = ""
    owner: str = ""
    sweep_id: str = ""
    sweep_trial: Optional[int] = None

    def __post_init__(self) -> None:
        # Values as the table holds them (a status or kind as text, secret names comma-separated) are typed here,
        # once: nobody downstream converts or splits them again.
        object.__setattr__(self, "status", RunStatus(self.status))
        object.__setattr__(self, "kind", JobKind(self.kind or JobKind.TRAIN.value))
        if isinstance(self.needs_secrets, str):
            object.__setattr__(self, "needs_secrets", tuple(n for n in self.needs_secrets.split(",") if n))
        found = training_type.pair_of_config_json(self.config_json) if self.kind is JobKind.TRAIN and \
            not self.method_name else None
        if found:  # recorded before method and adapter were columns (an old journal's row): its config says
            object.__setattr__(self, "method_name", found[0])
            object.__setattr__(self, "adapter", found[1])

    @classmethod
    def from_row(cls, row: Run) -> "RunRecord":
        unloaded = inspect(row).unloaded  # deferred columns (list_runs) stay unread: None here
        return cls(**{f.name: None if f.name in unloaded else getattr(row, f.name) for f in _RUN_FIELDS})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunRecord":
        """A record from a row's values as the journal keeps them (columns added later take their default)."""
        names = {f.name for f in _RUN_FIELDS}
        return cls(**{k: v for k, v in values.items() if k in names})

    def to_row(self) -> Run:
        values = dataclasses.asdict(self)
        values.update(status=self.status.value, kind=self.kind.value, needs_secrets=",".join(self.needs_secrets))
        return Run(**values)

    def replace(self, **values: Any) -> "RunRecord":
        return dataclasses.replace(self, **values)


_RUN_FIELDS = dataclasses.fields(RunRecord)


@dataclass(frozen=True)
class EventRecord:
    """One entry of a run's timeline."""

    run_id: str
    ts: float
    kind: str
    message: str
    id: Optional[int] = None

    @classmethod
    def from_row(cls, row: RunEvent) -> "EventRecord":
        return cls(run_id=row.run_id, ts=row.ts, kind=row.kind, message=row.message, id=row.id)


@dataclass(frozen=True)
class SampleRecord:
    """One greedy answer to a sample prompt at a training step; ``flags``: degeneration kind -> finding."""

    run_id: str
    step: int
    index: int
    prompt: str
    text: str
    new_tokens: int = 0
    flags: dict = dataclasses.field(default_factory=dict)
    ts: float = 0.0
    audio: str = ""  # a spoken sample's WAV, relative to the run folder ("": a text answer)
    turns: tuple = ()  # a GRPO rollout with tools: its turns (dicts, protocol.events.SampleEvent); () otherwise

    @classmethod
    def from_row(cls, row: Sample) -> "SampleRecord":
        try:
            flags = json.loads(row.flags) if row.flags else {}
        except ValueError:
            flags = {}
        try:
            turns = json.loads(row.turns) if row.turns else []
        except ValueError:
            turns = []
        return cls(run_id=row.run_id, step=row.step, index=row.idx, prompt=row.prompt, text=row.text,
                   new_tokens=row.new_tokens, flags=flags if isinstance(flags, dict) else {}, ts=row.ts,
                   audio=row.audio or "", turns=tuple(t for t in turns if isinstance(t, dict))
                   if isinstance(turns, list) else ())


@dataclass(frozen=True)
class EvalResultRecord:
    """An eval job's result (db.models.EvalResult) with the job's status; ``metrics`` is None until it ends."""

    job_id: str
    source_key: str
    source_run_id: str
    checkpoint: Optional[int]
    base_model: str
    data_fingerprint: str
    settings_hash: str
    data_label: str
    metrics: Optional[dict]
    created_at: float
    status: RunStatus = RunStatus.QUEUED

    @classmethod
    def from_row(cls, row: Any, status: str) -> "EvalResultRecord":
        return cls(job_id=row.job_id, source_key=row.source_key, source_run_id=row.source_run_id,
                   checkpoint=row.checkpoint, base_model=row.base_model, data_fingerprint=row.data_fingerprint,
                   settings_hash=row.settings_hash, data_label=row.data_label,
                   metrics=json.loads(row.metrics_json) if row.metrics_json else None, created_at=row.created_at,
                   status=RunStatus(status))


@dataclass(frozen=True)
class ArtifactRecord:
    """One published export artifact (see db.models.Artifact)."""

    job_id: str
    path: str
    source_run_id: str = ""
    kind: str = ""
    detail: str = ""
    size: int = 0
    sha256: str = ""
    created_at: float = 0.0

    @classmethod
    def from_row(cls, row: Any) -> "ArtifactRecord":
        return cls(**{f.name: getattr(row, f.name) for f in dataclasses.fields(cls)})
