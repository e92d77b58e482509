"""The database is a cache of the run folders (DESIGN rule 12): rebuild it, and notice when it is broken.

``rebuild()`` moves the current SQLite file aside (never deletes it), creates an empty database and, for
every run folder, replays

* ``journal.jsonl`` -- what the orchestrator wrote (the row as created, process id, queue moves, Stop
  requests, the outcome it decided, a deletion from History), through the store's own write functions;
* ``events.jsonl`` -- what the worker reported, through the pump's own event handlers
  (``pump.drain`` and ``pump.flush`` on a ``pump.Tracker``), so metrics, timeline and alerts come out exactly as the
  pump stored them.

A run that had not ended is left active at the end of its log; the next orchestrator adopts it like any
run left behind by a restart (a live worker is followed again, a dead one is marked failed).
Run folders from before the journal existed are rebuilt from config.yaml and events.jsonl alone. People's votes and
ratings are replayed from their own log, ``<data root>/feedback/log.jsonl`` (trainer_core/protocol/feedback_log.py).

Kept whole: one operation (set the database aside, replay every run folder through the pump's own handlers, report)
whose steps share the run-folder readers and must fail the same way.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

from db import settings_store, users
from db.entities import RunRecord
from db.store import Store, default_url
from trainer_core.specs import jobspec, model_source
from trainer_core.config import ConfigError, TrainConfig
from trainer_core.jobs import adoption, pump, queue
from trainer_core.jobs.live import LiveRun
from trainer_core.protocol import events as ev
from trainer_core.protocol import feedback_log, journal, paths
from trainer_core.protocol.status import JobKind, RunStatus, read_kind

SQLITE_FILES = ("", "-wal", "-shm")  # the database and its write-ahead log move aside together
CREATING_S = 10.0  # a run folder written this recently may be a start in progress (its row comes next)


class RebuildRefused(RuntimeError):
    """The rebuild cannot go ahead safely; the message says why and what to do."""


@dataclass
class RebuildReport:
    runs: list[str] = field(default_factory=list)  # rebuilt, oldest first
    active: list[str] = field(default_factory=list)  # left active for the next orchestrator to adopt
    skipped: list[str] = field(default_factory=list)  # "run id: reason"
    renamed: list[str] = field(default_factory=list)  # "folder: its journal names run X" (rebuilt as the folder)
    rebased: list[str] = field(default_factory=list)  # runs whose recorded paths were under an older data root
    moved_aside: list[str] = field(default_factory=list)  # files of the old database, kept
    accounts: tuple[int, int] | None = None  # (users, API tokens) carried over; None: the old file was unreadable
    feedback: int = 0  # records of the feedback log (votes, withdrawals, ratings) replayed

    def summary(self) -> str:
        text = f"Rebuilt {len(self.runs)} run(s) from their folders"
        if self.active:
            text += f"; {len(self.active)} not finished (followed again when the dashboard or CLI starts)"
        if self.skipped:
            text += f"; skipped {len(self.skipped)}: " + "; ".join(self.skipped[:5])
        if self.renamed:
            text += (f"; {len(self.renamed)} folder(s) named another run in their journal (copied or renamed), "
                     "rebuilt under their folder's name: " + "; ".join(self.renamed[:5]))
        if self.rebased:
            text += (f"; {len(self.rebased)} run(s) recorded paths under an older data root, now read under "
                     f"{paths.runs_dir()}: " + ", ".join(self.rebased[:5]))
        if self.feedback:
            text += f"; replayed {self.feedback} feedback record(s) (votes and ratings)"
        if self.moved_aside:
            text += ". The previous database was kept as " + ", ".join(self.moved_aside)
        if self.accounts is None and self.moved_aside:
            text += (". Users, roles and API tokens could not be read from it (they are kept nowhere else): people "
                     "get the default role when they next sign in (admins from FINETUNE_STUDIO_ADMINS) and create "
                     "their API tokens again")
        elif self.accounts and any(self.accounts):
            text += f". Carried over {self.accounts[0]} user(s) and {self.accounts[1]} API token(s)"
        return text + "."


# ====================================================================== diagnosis
def describe_error(exc: BaseException, url: str | None = None) -> str:
    """What went wrong with the database, in one paragraph that names the way out."""
    url = url or default_url()
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).splitlines() or [""]
    text = f"The database ({database_label(url)}) cannot be used: {type(cause).__name__}: {lines[0][:300]}. "
    if _sqlite_path(url) is None:  # a server that is down is not a lost database
        return text + ("Check that the database server is running and DATABASE_URL is right. If the database "
                       "itself was lost, create an empty one and rebuild it from the run folders: the Rebuild "
                       "button on the Settings page, or `python -m trainer_core db rebuild`.")
    return text + ("Runs, metrics and timelines are all kept in the run folders, so it can be rebuilt from them "
                   "(the current file is moved aside and kept, never deleted): use the Rebuild button on the "
                   "Settings page, or run `python -m trainer_core db rebuild`.")


def unknown_run_folders(store: Store) -> list[str]:
    """Job folders (with a config.yaml or job.json) the database does not know and that were not deleted from History:
    a database that was deleted (SQLite recreates it empty) or replaced. Empty when all is well."""
    settled = time.time() - CREATING_S
    folders = [p for p in _run_folders() if _job_file(p).stat().st_mtime < settled]
    if not folders:
        return []
    known = store.run_ids()
    return sorted(p.name for p in folders if p.name not in known and not journal.deleted(p))


# ====================================================================== rebuild
def rebuild(url: str | None = None) -> RebuildReport:
    """Rebuild the database at ``url`` (default: the configured one) from the run folders.

    Refused (RebuildRefused) while another dashboard or CLI follows a run, or when a PostgreSQL database
    already holds runs. Call it with no orchestrator running in this process (close it first)."""
    url = url or default_url()
    report = RebuildReport()
    with _no_orchestrators(), _start_lock(), _pump_locks() as held:
        db_path = _sqlite_path(url)  # only a SQLite file is set aside; PostgreSQL keeps its users where they are
        accounts = users.read_accounts(url) if db_path is not None and db_path.exists() else None
        saved = settings_store.read_settings(url) if accounts is not None else None  # Settings' rows: only here too
        # A SQLite database is built in a new file and swapped in only once it is complete: a rebuild that stops
        # half-way (an error, Ctrl-C) leaves the old file where it was, never a half-built database.
        building = None if db_path is None else db_path.with_name(f"{db_path.name}.rebuilding-{os.getpid()}")
        if building is not None:
            _remove_sqlite(building)
        store = Store(url if building is None else f"sqlite:///{building}", journal=False)
        try:
            if store.count_runs():
                raise RebuildRefused(
                    f"The database {_redact_url(url)} already holds runs. Rebuild into an empty PostgreSQL "
                    "database (create one and point DATABASE_URL at it); this one is left untouched.")
            _rebuild_all(store, held, report)
            report.feedback = store.replay_feedback(feedback_log.read())  # people's votes: their own log
            if accounts is not None:
                users.restore_accounts(store, accounts)
                report.accounts = (len(accounts.users), len(accounts.tokens))
            if saved:
                settings_store.restore_settings(store, saved)
        except BaseException:
            store.engine.dispose()
            if building is not None:
                _remove_sqlite(building)
            raise
        store.engine.dispose()  # closes the last connection: SQLite folds its WAL into the file
        if building is not None:
            report.moved_aside = _set_aside(url)
            for suffix in SQLITE_FILES:
                if Path(f"{building}{suffix}").exists():
                    os.replace(f"{building}{suffix}", f"{db_path}{suffix}")
    return report


def _remove_sqlite(path: Path) -> None:
    for suffix in SQLITE_FILES:
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _rebuild_all(store: Store, held: list[tuple[Path, IO]], report: RebuildReport) -> None:
    for run_dir, lock_fh in held:
        try:
            outcome = _rebuild_run(store, run_dir, lock_fh, report)
        except Exception as exc:  # noqa: BLE001 - one folder must not cost the others their rebuild; the report names it
            _forget(store, run_dir.name)
            report.skipped.append(f"{run_dir.name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            continue
        if outcome == "deleted":
            continue
        report.runs.append(run_dir.name)
        if outcome == "active":
            report.active.append(run_dir.name)


def _forget(store: Store, run_id: str) -> None:
    """Remove what a folder that failed half-way had written, so the database holds it whole or not at all."""
    try:
        if store.get_run(run_id) is not None:
            store.finish_run(run_id, RunStatus.FAILED)
            store.delete_run(run_id)
    except Exception:  # noqa: BLE001 - best effort; the folder is reported as skipped either way
        pass


def _rebuild_run(store: Store, run_dir: Path, lock_fh: IO, report: RebuildReport) -> str:
    """Restore one run; returns "deleted", "active" or "finished"."""
    records = journal.read(run_dir)
    if any(r["op"] == "delete" for r in records):
        return "deleted"
    created = next((r["row"] for r in records if r["op"] == "create"), None)
    row = RunRecord.from_dict(created) if created is not None else _row_from_folder(run_dir)
    if row.id != run_dir.name:  # a copied (cp -a runs/A runs/B) or renamed folder: the folder is what exists
        report.renamed.append(f"{run_dir.name}: its journal names run {str(row.id)[:64]}")
        row = row.replace(id=run_dir.name)
    moved_from = None  # where the folder was when its journal and log were written, when that was elsewhere
    if row.output_dir and Path(row.output_dir) != run_dir and Path(row.output_dir).name in (run_dir.name, created and
                                                                                            created.get("id")):
        if Path(row.output_dir).parent != run_dir.parent:
            report.rebased.append(run_dir.name)
        moved_from = Path(row.output_dir)
        row = row.replace(output_dir=str(run_dir))
    if store.get_run(row.id) is not None:
        raise RebuildRefused(f"a run {row.id} was already rebuilt from another folder")
    store.create_run(row)
    for record in records:
        if record["op"] == "update":
            store.update_run(row.id, **_rebased(record["values"], moved_from, run_dir))
        elif record["op"] == "event":
            store.add_event(row.id, record["kind"], record["message"], ts=record["ts"])
    tracked = _replay_events(store, run_dir, lock_fh, moved_from)
    _keep_eval_row(store, row, run_dir)
    finish = next((r for r in records if r["op"] == "finish"), None)
    if finish is not None:
        store.finish_run(row.id, RunStatus(finish["status"]), **_rebased(finish["values"], moved_from, run_dir))
        return "finished"
    if created is None:  # a folder from before the journal: the log's outcome is all there is
        status, values = tracked.terminal or (RunStatus.FAILED, {
            "error": "Rebuilt from its folder, which records no outcome (the run predates the journal)."})
        last = ev.last_terminal_event(run_dir / "events.jsonl")
        store.finish_run(row.id, status, finished_at=last.ts if last else None, **values)
        return "finished"
    return "active"


def _rebased(values: dict, moved_from: Path | None, run_dir: Path) -> dict:
    """A journal record's values with an output_dir under the folder's old place read under its new one, and
    left out unless it lies inside the folder or its export target (the journal is a file of the run folder)."""
    if not values.get("output_dir"):
        return values
    output_dir = pump.moved(str(values["output_dir"]), moved_from, run_dir)
    try:
        paths.inside_run(run_dir, output_dir, jobspec.export_roots(run_dir))
    except paths.UnsafePathError:
        return {k: v for k, v in values.items() if k != "output_dir"}
    return {**values, "output_dir": output_dir}


def _replay_events(store: Store, run_dir: Path, lock_fh: IO, moved_from: Path | None = None) -> pump.Tracker:
    """Feed the whole event log through the pump's handlers and store what they produce, like the pump."""
    run = store.get_run(run_dir.name)
    # The worker's events start where the live pump started: from a job being launched. The row's status now is
    # where the journal left it (a Stop request: stopping), and handlers that hold a stopping job would drop
    # what the live pump stored before the request (a serve job's "serving at URL" line).
    live = LiveRun(run.id, run.name, RunStatus.STARTING, phase=run.phase)
    tracked = pump.Tracker(run.id, run_dir, live, 0, lock_fh, kind=run.kind, moved_from=moved_from)
    pump.drain(tracked, store, max_reads=None)
    pump.flush(tracked, store)
    tracked.log.close()
    return tracked


def _keep_eval_row(store: Store, row: RunRecord, run_dir: Path) -> None:
    """An eval job's result row, as its submission created it, when its log never reported one (queued, running,
    failed or cancelled): without it a baseline under way is not found and a second one is queued."""
    if row.kind is not JobKind.EVAL or store.eval_result(row.id) is not None:
        return
    from trainer_core.evaluation import samples as eval_samples  # reads data files only: no ML stack

    spec = jobspec.read_spec(run_dir)
    try:
        base_model = model_source.resolve(spec.source).base_model
    except model_source.SourceError:
        base_model = spec.source.model  # its source run is gone: a base model's name is all there is
    try:
        fingerprint = eval_samples.fingerprint(spec) if spec.data.strip() else ""
    except Exception:  # noqa: BLE001 - its data changed or went away: the row stays, unmatched by later baselines
        fingerprint = ""
    store.save_eval_result(row.id, source_key=spec.source.key, source_run_id=spec.source.run_id,
                           checkpoint=spec.source.checkpoint, base_model=base_model, data_fingerprint=fingerprint,
                           settings_hash=eval_samples.settings_hash(spec), data_label=spec.dataset_label,
                           created_at=row.created_at)


def _row_from_folder(run_dir: Path) -> RunRecord:
    """The row ``Orchestrator.start`` or ``submit`` would have created, from the folder's config.yaml or job.json
    (a folder without a journal, or whose first line was lost)."""
    if (run_dir / "config.yaml").is_file() or read_kind(run_dir) is JobKind.TRAIN:
        row = _row_from_config(run_dir)
    else:
        row = _row_from_spec(run_dir)
    try:
        owner = (run_dir / "owner.txt").read_text(encoding="utf-8", errors="replace").strip()[:200]
    except OSError:
        owner = ""
    return row.replace(owner=owner) if owner else row


def _created_at(run_dir: Path, job_file: Path) -> float:
    try:
        return time.mktime(time.strptime(run_dir.name[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return job_file.stat().st_mtime


def _row_from_spec(run_dir: Path) -> RunRecord:
    spec = jobspec.read_spec(run_dir)
    created = _created_at(run_dir, run_dir / jobspec.SPEC_FILE)
    label = spec.KIND.label
    return RunRecord(id=run_dir.name, name=spec.name or f"{label} · {run_dir.name[9:15]}", status=RunStatus.STARTING,
                     phase="launching worker", model=spec.model_label, dataset=spec.dataset_label, method=label,
                     created_at=created, started_at=created, output_dir=str(run_dir), total_steps=spec.total_steps,
                     config_json=json.dumps(spec.to_dict(), sort_keys=True), devices=queue.devices_of(spec),
                     parent_run_id=spec.source.run_id or None, kind=spec.KIND)


def _row_from_config(run_dir: Path) -> RunRecord:
    """The row ``Orchestrator.start`` would have created, from config.yaml (folders without a journal)."""
    cfg = TrainConfig.from_yaml((run_dir / "config.yaml").read_text())
    run_id = run_dir.name
    try:
        created = time.mktime(time.strptime(run_id[:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        created = (run_dir / "config.yaml").stat().st_mtime
    parent, step = _resumed_from(cfg)
    return RunRecord(id=run_id, name=cfg.run_name or f"{cfg.method_label} · {run_id[9:15]}", status=RunStatus.STARTING,
               phase="launching worker", model=cfg.model_label, dataset=cfg.dataset_label, method=cfg.method_label,
               created_at=created, started_at=created, output_dir=str(run_dir), total_steps=cfg.max_steps,
               config_json=json.dumps(cfg.to_public_dict(), sort_keys=True),
               devices=queue.devices_of(cfg), parent_run_id=parent, resumed_from_step=step, kind=read_kind(run_dir))


def _resumed_from(cfg: TrainConfig) -> tuple[str | None, int | None]:
    """(parent run id, step) when the config resumes from ``runs/<parent>/checkpoints/checkpoint-<step>``."""
    if not cfg.resume_from_checkpoint:
        return None, None
    checkpoint = Path(cfg.resume_from_checkpoint)
    parent = checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else None
    _, _, step = checkpoint.name.rpartition("-")
    return parent, int(step) if step.isdigit() else None


def _run_folders() -> list[Path]:
    """Folders under runs/ that hold a job (a training run's config.yaml, another kind's job.json), by name
    (oldest first)."""
    return sorted(p for p in paths.runs_dir().iterdir()
                  if paths.RUN_ID_RE.fullmatch(p.name) and _job_file(p) is not None)


def _job_file(run_dir: Path) -> Path | None:
    for name in ("config.yaml", jobspec.SPEC_FILE):
        if (run_dir / name).is_file():
            return run_dir / name
    return None


# ====================================================================== safety
@contextlib.contextmanager
def _no_orchestrators() -> Iterator[None]:
    """Exclusive use of the presence lock: no dashboard or CLI pumps into the database meanwhile (they hold it
    shared while they run, and a new one waits until the rebuild is done)."""
    with open(paths.data_root() / adoption.PRESENCE_LOCK, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RebuildRefused(
                "A dashboard or CLI is running on this data folder and writing to the database. Stop it (workers "
                "keep training; it follows them again when it comes back) and rebuild again; nothing was "
                "changed.") from None
        yield  # closing the file releases the lock


@contextlib.contextmanager
def _start_lock() -> Iterator[None]:
    with queue.start_lock():  # nobody launches a queued run meanwhile
        yield


@contextlib.contextmanager
def _pump_locks() -> Iterator[list[tuple[Path, IO]]]:
    """The pump lock of every run folder, held for the whole rebuild; refused if anyone else holds one."""
    held: list[tuple[Path, IO]] = []
    try:
        for run_dir in _run_folders():
            lock_fh = adoption.try_lock(run_dir)
            if lock_fh is None:
                raise RebuildRefused(
                    f"Run {run_dir.name} is being followed by a running dashboard or CLI. Stop it (the workers "
                    "keep training) and rebuild again; nothing was changed.")
            held.append((run_dir, lock_fh))
        yield held
    finally:
        for _, lock_fh in held:
            lock_fh.close()


def _set_aside(url: str) -> list[str]:
    """Move the SQLite database (and its WAL files) to ``<name>.moved-aside-<time>``; PostgreSQL is checked,
    not moved. Returns the new names."""
    db_path = _sqlite_path(url)
    if db_path is None:
        return []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for suffix in SQLITE_FILES:
        source = Path(f"{db_path}{suffix}")
        if source.exists():
            target = source.with_name(f"{db_path.name}.moved-aside-{stamp}{suffix}")
            source.rename(target)
            moved.append(str(target))
    return moved


def database_label(url: str) -> str:
    """The database for people: the SQLite file, or the URL without its password."""
    return str(_sqlite_path(url) or _redact_url(url))


def _sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    return Path(url[len("sqlite:///"):])


def _redact_url(url: str) -> str:
    """A database URL without its password, for messages."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, sep, creds = head.partition("://")
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{tail}"

