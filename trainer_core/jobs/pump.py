"""Reading a job's event log into the live state and the database.

Each active job has a ``Tracker``: where its log was read up to, its live state, the metric rows and
timeline entries not yet stored, and its outcome once known. ``drain`` handles new lines one by one
through the table ``HANDLERS`` (job kind -> event kind -> handler); ``flush`` stores what was gathered
together with the new log offset, in one transaction. ``db rebuild`` replays a run folder through the very
same functions, so a rebuilt database holds what the pump would have stored.

Kept whole: the handler table (job kind -> event kind -> handler) and the handlers: db rebuild replays run folders
through these very functions, so they stay together as one reading of the event log.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from db.store import SPARKLINE_POINTS, Store
from trainer_core.specs import jobspec
from trainer_core.jobs import eval_results
from trainer_core.jobs.alerts import AlertMonitor, SampleAlerts
from trainer_core.jobs.live import LiveRun, metric_row
from trainer_core.launchers import JobHandle
from trainer_core.protocol import events as ev
from trainer_core.protocol import files, paths
from trainer_core.protocol.metrics import merge_metric, thin
from trainer_core.protocol.status import JOB_KINDS, JobKind, RunStatus

READS_PER_TICK = 4  # chunks of the event log per job and tick, so one busy job cannot starve the others
IDLE_FLUSH_S = 5.0  # heartbeats during model loading or a long eval still reach the database
LOG_TAIL_LINES = 60


class MetricBuffer:
    """Collects metric rows and tells when to flush: by count or by age (rule 6)."""

    # Flushed while a backlog is read too (per line, not per 4 MiB read): a commit costs ~1 ms, so 500
    # rows or half a second keeps both the commit count and the delay to the database small.
    def __init__(self, max_rows: int = 500, max_age_s: float = 0.5):
        self.max_rows = max_rows
        self.max_age_s = max_age_s
        self.rows: dict[int, dict[str, Any]] = {}
        self.first_at: float | None = None

    def add(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        merge_metric(self.rows.setdefault(step, {"step": step}), row)
        if self.first_at is None:
            self.first_at = time.monotonic()

    def due(self) -> bool:
        if not self.rows:
            return False
        return len(self.rows) >= self.max_rows or (time.monotonic() - (self.first_at or 0)) >= self.max_age_s

    def take(self) -> list[dict[str, Any]]:
        rows = list(self.rows.values())
        self.rows = {}
        self.first_at = None
        return rows


@dataclass
class Tracker:
    """Pump-side bookkeeping of one active job."""

    run_id: str
    run_dir: Path
    live: LiveRun
    offset: int
    lock_fh: IO
    kind: JobKind = JobKind.TRAIN
    handle: JobHandle | None = None  # the launcher's handle on its worker (None when replayed: db rebuild)
    pid: int | None = None
    pid_started_at: float | None = None
    buffer: MetricBuffer = field(default_factory=MetricBuffer)
    timeline: list = field(default_factory=list)
    run_values: dict = field(default_factory=dict)
    urgent: bool = False
    terminal: tuple[RunStatus, dict] | None = None
    stop_requested_at: float | None = None
    terminated_at: float | None = None
    stall_step: int | None = None  # the step last seen by the stall check, since when (monotonic), and whether
    stall_since: float = field(default_factory=time.monotonic)  # it was alerted on (adoption.notice_stall)
    stall_alerted: bool = False
    best_eval_loss: float | None = None
    flushed_at: float = field(default_factory=time.monotonic)
    monitor: AlertMonitor = field(default_factory=AlertMonitor)
    log: ev.LogFollower | None = None  # reads events.jsonl through its own descriptor (see LogFollower)
    losses: dict = field(default_factory=dict)  # step -> train loss of this run: its History sparkline
    sparkline_stale: bool = False
    samples: list = field(default_factory=list)  # sample answers not yet stored (samples during training)
    sample_alerts: SampleAlerts = field(default_factory=SampleAlerts)
    writes: list = field(default_factory=list)  # store calls of other job kinds' results (eval), at the next flush
    artifacts: list = field(default_factory=list)  # export artifact rows not yet stored
    export_roots: list | None = None  # folders besides run_dir its paths may be in (read from job.json once)
    # db rebuild: where this folder was when its log was written (a moved data root, a copied or renamed folder);
    # paths under it are read under run_dir instead
    moved_from: Path | None = None

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = ev.LogFollower(self.run_dir / ev.LOG_NAME, self.pid)


# ====================================================================== reading and storing
def drain(t: Tracker, store: Store, max_reads: int | None) -> None:
    """Handle the log's new lines, up to ``max_reads`` chunks (None: until it has nothing new). Each
    line is handled before the offset moves past it, and a batch that is due (by count or age) is
    stored between two lines, so a long backlog reaches the database as it is read."""
    reads = 0
    while max_reads is None or reads < max_reads:
        lines = t.log.read(t.offset)
        reads += 1
        if not lines:
            return
        for line in lines:
            if line.event is not None:
                handle(t, line.event)
            elif line.problem:
                on_log_problem(t, line.problem)
            t.offset = line.end
            if t.buffer.due():
                flush(t, store)  # the offset saved with these rows is right after the line just handled


def flush(t: Tracker, store: Store) -> None:
    if t.sparkline_stale:
        t.run_values["sparkline"] = json.dumps(thin(list(t.losses.values()), SPARKLINE_POINTS))
        t.sparkline_stale = False
    if t.samples:  # before the offset moves past their lines (append_metrics): a crash replays them, never loses them
        store.append_samples(t.run_id, t.samples)
        t.samples = []
    for write in t.writes:  # idempotent upserts, stored before the offset moves past their lines
        write(store)
    t.writes = []
    if t.artifacts:  # before the offset moves past their lines (a replay only replaces the same rows)
        store.add_artifacts(t.artifacts)
        t.artifacts = []
    rows = t.buffer.take()
    store.append_metrics(t.run_id, rows, event_offset=t.offset, events=t.timeline, **t.run_values)
    t.timeline, t.run_values, t.urgent = [], {}, False
    t.flushed_at = time.monotonic()


def flush_due(t: Tracker) -> bool:
    idle_updates = (t.run_values or t.timeline) and time.monotonic() - t.flushed_at > IDLE_FLUSH_S
    return bool(t.urgent or t.buffer.due() or t.terminal is not None or idle_updates)


def set_terminal(t: Tracker, status: RunStatus, **values: Any) -> None:
    """Record the job's outcome (the first one wins); it is stored once the worker has exited."""
    if t.terminal is None:
        t.terminal = (status, values)
        t.live.update(status=status, phase=values.get("phase", ""),  # "saving" is over once the run ended
                      **{k: v for k, v in values.items() if k in ("error", "log_tail")})


def handle(t: Tracker, event: ev.Event) -> None:
    handler = HANDLERS[t.kind].get(event.kind)
    if handler is None:
        on_log_problem(t, f"a {t.kind.value} job does not report {event.kind!r} events: skipped one", event.ts)
        return
    handler(t, event)


# ====================================================================== event handlers (one per kind)
def _on_status(t: Tracker, e: ev.StatusEvent) -> None:
    status = RunStatus(e.status)
    if t.live.status is RunStatus.STOPPING and status in (RunStatus.STARTING, RunStatus.RUNNING):
        status = RunStatus.STOPPING  # a stop was requested; don't flip back to running in the UI
    t.live.update(status=status, phase=e.phase, **({"engine": e.engine} if e.engine else {}))
    t.run_values.update(status=status.value, phase=e.phase, **({"engine": e.engine} if e.engine else {}))
    # The timeline records what the worker said, not how it was shown: the same log always gives the same
    # timeline, however late the pump read it (db rebuild relies on that).
    reported = t.kind.status_label(RunStatus(e.status))  # "Exporting: publish", not "Training: publish"
    t.timeline.append((e.ts, "status", f"{reported}: {e.phase}" if e.phase else reported))
    t.urgent = True


def _on_warning(t: Tracker, e: ev.WarningEvent) -> None:
    t.live.add_warning(e.message)
    t.timeline.append((e.ts, "warning", e.message))
    t.urgent = True


def _on_progress(t: Tracker, e: ev.ProgressEvent) -> None:
    row = metric_row(e)
    t.buffer.add(row)
    t.live.add_metric(row)
    t.live.update(step=e.step, total_steps=e.total_steps, epoch=e.epoch, loss=e.loss, learning_rate=e.learning_rate,
                  grad_norm=e.grad_norm, tokens_seen=e.tokens_seen, tokens_per_s=e.tokens_per_s,
                  memory_mb=e.memory_mb, eta_s=e.eta_s)
    t.run_values.update(steps_done=e.step, total_steps=e.total_steps, epoch=e.epoch, last_loss=e.loss,
                        tokens_seen=e.tokens_seen, heartbeat_at=e.ts)
    if e.loss is not None:
        t.losses[e.step] = e.loss
        t.sparkline_stale = True
    _check_alerts(t, row, e.ts)


def _check_alerts(t: Tracker, row: dict[str, Any], ts: float) -> None:
    """Alerts go to the live view and, with the next flush, to the run's timeline in the database."""
    for alert in t.monitor.observe(row):
        t.live.add_alert(alert)
        t.timeline.append((ts, "alert", alert.message))
        t.urgent = True


def _on_eval(t: Tracker, e: ev.EvalEvent) -> None:
    row = metric_row(e)
    t.buffer.add(row)
    t.live.add_metric(row)
    _check_alerts(t, row, e.ts)
    t.live.update(eval_loss=e.eval_loss)
    if e.eval_loss is not None and (t.best_eval_loss is None or e.eval_loss < t.best_eval_loss):
        t.best_eval_loss = e.eval_loss
        t.run_values["best_eval_loss"] = e.eval_loss


def moved(path: str, old_dir: Path | None, run_dir: Path) -> str:
    """``path`` written when the run folder was at ``old_dir`` (db rebuild of a moved data root, a copied or
    renamed folder), read under ``run_dir``; any other path unchanged (``inside`` still checks the result)."""
    if old_dir is None or not Path(path).is_absolute() or old_dir not in (Path(path), *Path(path).parents):
        return path
    return str(run_dir / Path(path).relative_to(old_dir))


def inside(t: Tracker, e: ev.Event, path: str, refused: str) -> str | None:
    """``path`` from the log as it is stored, when it lies inside the job's folder (or its export target); else
    None and a warning says why. A worker running remote code, or anyone who can write the run folder, could
    name any file here."""
    if t.export_roots is None:
        t.export_roots = jobspec.export_roots(t.run_dir)
    path = moved(path, t.moved_from, t.run_dir)
    try:
        paths.inside_run(t.run_dir, path, t.export_roots)
        return path
    except paths.UnsafePathError as exc:
        on_log_problem(t, f"{refused}: {exc}", e.ts)
        return None


def _on_checkpoint(t: Tracker, e: ev.CheckpointEvent) -> None:
    path = inside(t, e, e.path, "checkpoint event ignored")
    if path is None:
        return
    t.timeline.append((e.ts, "checkpoint", f"checkpoint saved at step {e.step}: {path}"))
    t.urgent = True


def _on_complete(t: Tracker, e: ev.CompleteEvent) -> None:
    values: dict[str, Any] = {"final_loss": e.final_loss}
    if e.steps:
        values["steps_done"] = e.steps
    output_dir = e.output_dir and inside(t, e, e.output_dir, "complete event: output_dir not stored")
    if output_dir:
        values["output_dir"] = output_dir
    set_terminal(t, RunStatus(e.status), **values)


def _on_error(t: Tracker, e: ev.ErrorEvent) -> None:
    set_terminal(t, RunStatus.FAILED, error=e.message, log_tail=tail(t.run_dir / "worker.log", LOG_TAIL_LINES))


def _on_data(t: Tracker, e: ev.DataEvent) -> None:
    """What the worker loaded is the run's data fingerprint from now on: Resume checks the files against it."""
    t.run_values["data_fingerprint"] = e.fingerprint
    t.timeline.append((e.ts, "data", f"loaded {e.rows} training rows and {e.eval_rows} eval "
                                     f"row{'' if e.eval_rows == 1 else 's'} (data fingerprint {e.fingerprint[:12]})"))
    t.urgent = True


def _on_heartbeat(t: Tracker, e: ev.HeartbeatEvent) -> None:
    t.run_values["heartbeat_at"] = e.ts


def _on_serve_ready(t: Tracker, e: ev.ServeReadyEvent) -> None:
    phase = f"serving at {e.url}"
    if t.live.status is RunStatus.STOPPING:
        return  # a stop was requested while it loaded: it ends without serving
    t.live.update(status=RunStatus.RUNNING, phase=phase, **({"engine": e.engine} if e.engine else {}))
    t.run_values.update(status=RunStatus.RUNNING.value, phase=phase, **({"engine": e.engine} if e.engine else {}))
    t.timeline.append((e.ts, "status", f"serving {', '.join(e.models)} at {e.url}"))
    t.urgent = True
SAMPLE_TEXT_MAX = 20_000  # characters of one stored answer (max_new_tokens bounds it far below this)
# A spoken sample's file as the tts worker names it: inside the run's samples folder, nothing else
SAMPLE_AUDIO = re.compile(r"samples/step-\d{6,9}-\d{1,2}\.wav")


def _on_sample(t: Tracker, e: ev.SampleEvent) -> None:
    """A sample answer: stored with the next flush; a degenerate one raises its kind's alert once per run."""
    flags = {str(k)[:50]: str(v)[:500] for k, v in list(e.flags.items())[:10]}  # a worker only sends a few
    t.samples.append({"step": e.step, "index": e.index, "ts": e.ts, "prompt": _storable(e.prompt, SAMPLE_TEXT_MAX),
                      "text": _storable(e.text, SAMPLE_TEXT_MAX), "new_tokens": e.new_tokens, "flags": flags,
                      "audio": e.audio if SAMPLE_AUDIO.fullmatch(e.audio or "") else "",
                      "turns": [{k: _storable(v, SAMPLE_TEXT_MAX) if isinstance(v, str) else v for k, v in turn.items()}
                                for turn in e.turns]})
    for alert in t.sample_alerts.observe(e.step, e.index, flags):
        t.live.add_alert(alert)
        t.timeline.append((e.ts, "alert", alert.message))
    t.urgent = True  # a few per sampling step: shown without waiting for the next metrics batch


def _storable(text: str, limit: int) -> str:
    """Text as every database takes it: no NUL (PostgreSQL refuses it in text), at most ``limit`` characters."""
    text = text.replace("\x00", "\ufffd")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def on_log_problem(t: Tracker, problem: str, ts: float | None = None) -> None:
    """An invalid line (skipped on its own) or a change to the log file itself: a warning in the timeline, at
    the event's own time when it has one (so db rebuild writes the same timeline)."""
    t.live.add_warning(problem)
    t.timeline.append((time.time() if ts is None else ts, "warning", problem))
    t.urgent = True


# ---- export jobs
def _on_artifact(t: Tracker, e: ev.ArtifactEvent) -> None:
    path = inside(t, e, e.path, "artifact event ignored")
    if path is None:
        return  # never a row: the page would offer the file to every viewer
    t.artifacts.append(dict(job_id=t.run_id, path=path, source_run_id=e.source_run_id, kind=e.artifact,
                            detail=e.detail, size=e.size, sha256=e.sha256, created_at=e.ts))
    t.timeline.append((e.ts, "artifact", f"{e.artifact}{' ' + e.detail if e.detail else ''}: {path} "
                                         f"({e.size:,} bytes, sha256 {e.sha256[:12]}…)"))
    t.urgent = True


def _on_verify(t: Tracker, e: ev.VerifyEvent) -> None:
    unit = e.unit or "answers identical to the adapter's"  # an mmproj's verify counts tensors
    text = f"verify {e.format}: {e.identical}/{e.total} {unit}"
    if e.identical < e.total:
        text += f"; first difference: {e.first_difference}"
        t.live.add_warning(text)
    t.timeline.append((e.ts, "verify", text))
    t.urgent = True


Handler = Callable[[Tracker, Any], None]
# Every kind of job reports its state, warnings, its outcome and that it is alive the same way.
LIFECYCLE: dict[str, Handler] = {
    "status": _on_status, "warning": _on_warning, "complete": _on_complete, "error": _on_error,
    "heartbeat": _on_heartbeat,
}
# The events some kinds of job have of their own; which kind has which is its row of JOB_KINDS.
EVENT_HANDLERS: dict[str, Handler] = {
    "progress": _on_progress, "eval": _on_eval, "checkpoint": _on_checkpoint, "sample": _on_sample, "data": _on_data,
    "serve_ready": _on_serve_ready, "eval_sample": eval_results.on_sample, "eval_result": eval_results.on_result,
    "artifact": _on_artifact, "verify": _on_verify,
}
HANDLERS: dict[JobKind, dict[str, Handler]] = {
    kind: {**LIFECYCLE, **{name: EVENT_HANDLERS[name] for name in entry.events}} for kind, entry in JOB_KINDS.items()}


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log file (read from its end: a worker log can be large)."""
    return "\n".join(files.tail_lines(path, lines))
