"""The sweep driver: an Optuna study whose trials are ordinary runs, moved on one ``tick`` at a time.

Each tick reads the truth again -- the sweep's state.jsonl, the study (its JournalStorage file), and the trial runs
in the database (rows tagged with the sweep id and trial number) -- and acts on the difference:

* a trial asked but never started (a crash between ``ask`` and ``start``) is started now, with its stored values;
* a running trial's new evaluations are reported (``trial.report``); a trial Optuna's pruner would prune, or whose
  loss diverged, is marked pruned and stopped through the ordinary Stop (it saves: a real run, kept);
* a trial whose run ended is told its outcome (its last evaluation; pruned; failed with the run's error);
* while the budget lasts, new trials are asked and started until ``parallel`` are under way (the queue decides
  which of them actually run now);
* a stopping sweep stops its running trials (marked paused, so resume continues them from their checkpoints)
  and removes its queued ones from the queue (resume starts them again: they never ran).

The driver holds nothing that a restart would lose: whoever takes the sweep's lock next (runner.py) carries on.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from db.entities import RunRecord
from trainer_core.auth import access
from trainer_core.config import ConfigError, TrainConfig
from trainer_core.jobs.refusals import RunRefused
from trainer_core.protocol import secrets
from trainer_core.protocol.metrics import WIDE_NAMES
from trainer_core.protocol.status import RunStatus
from trainer_core.sweeps import decisions, record
from trainer_core.sweeps.record import SweepState, SweepStatus
from trainer_core.sweeps.spec import SweepSpec, apply, grid_space

STUDY_NAME = "sweep"
PRUNED, PAUSED, ERROR = "pruned", "paused", "error"  # trial user attributes
optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_study(folder: Path, spec: SweepSpec) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(folder / record.STUDY_FILE)))
    return optuna.create_study(study_name=STUDY_NAME, storage=storage, sampler=sampler(spec), pruner=pruner(spec),
                               direction=spec.direction, load_if_exists=True)


class _Grid(optuna.samplers.GridSampler):
    """Optuna's GridSampler without its end-of-grid ``study.stop()``, which only works inside ``study.optimize``:
    the sweep's budget (the grid's size at most) ends it here."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    if spec.search == "grid":
        return _Grid(grid_space(spec), seed=spec.seed)
    if spec.search == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed)


def pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    if spec.pruner == "median":  # from the second trial on: sweeps here are tens of trials, not thousands
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=spec.prune_warmup_steps)
    if spec.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def suggest(trial: optuna.Trial, spec: SweepSpec) -> dict[str, Any]:
    """The trial's values (asked now, or the stored ones of a trial asked before a restart)."""
    values = {}
    for p in spec.params:
        if spec.search == "grid" or p.values:
            values[p.name] = trial.suggest_categorical(p.name, p.grid() if spec.search == "grid" else list(p.values))
        elif p.is_int:
            values[p.name] = trial.suggest_int(p.name, p.low, p.high, step=p.step or 1, log=p.log)
        else:
            values[p.name] = trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)
    return values


class SweepDriver:
    def __init__(self, orch, state: SweepState):
        self.orch = orch
        self.id = state.id
        self.spec = state.config.spec
        self.base = state.config.base
        self.actor = access.Actor(state.owner, access.Role(state.role))
        self.study = open_study(state.folder, self.spec)
        self._read: dict[str, list[decisions.Row]] = {}  # a run's metric rows read so far (a cache: restarts re-read)

    # ================================================================== the loop
    def tick(self) -> SweepStatus:
        """One pass over the sweep; returns its status afterwards."""
        state = record.read(self.id)
        latest: dict[int, RunRecord] = {}
        for run in self.orch.store.sweep_runs(self.id):  # oldest first: a resumed trial's newest run wins
            latest[run.sweep_trial] = run
        trials = self.study.get_trials(deepcopy=False)
        busy = sum(self._follow(t, latest.get(t.number), state) for t in trials if t.state is TrialState.RUNNING)
        if state.status is SweepStatus.RUNNING:
            asked = len(trials)
            while busy < self.spec.parallel and self._budget_left(state, asked):
                self._start(self.study.ask())
                busy, asked = busy + 1, asked + 1
            if busy == 0 and not self._budget_left(state, asked):
                record.set_status(self.id, SweepStatus.COMPLETED, "its budget is spent")
                return SweepStatus.COMPLETED
        elif state.status is SweepStatus.STOPPING and busy == 0:
            record.set_status(self.id, SweepStatus.STOPPED)
            return SweepStatus.STOPPED
        return state.status

    def _budget_left(self, state: SweepState, asked: int) -> bool:
        budget = self.spec.trial_budget(state.n_trials)
        if budget is not None and asked >= budget:
            return False
        return not (self.spec.timeout_minutes and state.running_s >= self.spec.timeout_minutes * 60)

    def _follow(self, t: FrozenTrial, run: RunRecord | None, state: SweepState) -> bool:
        """Move one running trial on; True while it holds one of the sweep's ``parallel`` places."""
        if run is None:  # asked, never started (the process stopped in between): start it with its stored values
            if state.status is SweepStatus.RUNNING:
                self._start(optuna.Trial(self.study, t._trial_id))
                return True
            return False
        if not run.status.is_terminal():
            if state.status is SweepStatus.STOPPING:
                self._pause(t, run)
            else:
                self._report(t, run)
            return True
        self._report(t, run)  # evaluations logged just before it ended
        if t.user_attrs.get(PAUSED):
            return self._continue(t, run) if state.status is SweepStatus.RUNNING else False
        self._settle(t, run)
        return False

    # ================================================================== one trial
    def _start(self, trial: optuna.Trial, resume_of: RunRecord | None = None) -> None:
        values = suggest(trial, self.spec)
        try:
            if resume_of is not None:
                self.orch.resume(resume_of.id, secrets=secrets.from_env(os.environ), actor=self.actor)
                return
            data = apply(self.base, values)
            data["run_name"] = f"{self.spec.name or 'sweep'} trial {trial.number}"[:80]
            cfg = TrainConfig.from_dict(data)
            for name, value in secrets.from_env(os.environ).items():  # never stored: from the environment
                setattr(cfg, name, value)
            self.orch.start(cfg, actor=self.actor, sweep=(self.id, trial.number))
        except (ConfigError, RunRefused, OSError) as exc:
            reason = "; ".join(f"{e.field}: {e.message}" for e in exc.errors) if isinstance(exc, ConfigError) \
                else str(exc)
            trial.set_user_attr(ERROR, f"could not be started: {reason}"[:500])
            self.study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)

    def _report(self, t: FrozenTrial, run: RunRecord) -> None:
        rows = self._rows(run)
        trial = optuna.Trial(self.study, t._trial_id)
        for step, value in decisions.new_reports(rows, t.intermediate_values):
            trial.report(value, step)
        if run.status.is_terminal() or run.status is RunStatus.STOPPING or t.user_attrs.get(PRUNED):
            return
        reason = decisions.divergence(rows, self.spec.diverge_factor, self.spec.objective)
        if reason is None and trial.should_prune():
            last = max(self.study._storage.get_trial(t._trial_id).intermediate_values.items())
            reason = (f"{self.spec.objective} {last[1]:.4g} at step {last[0]} is worse than the {self.spec.pruner} "
                      "pruner allows against the earlier trials")
        if reason is not None:
            trial.set_user_attr(PRUNED, reason)  # before Stop: a restart in between still knows why it stopped
            self.orch.store.add_event(run.id, "sweep", f"pruned by sweep {self.id}: {reason}")
            self.orch.stop(run.id, actor=self.actor)

    def _rows(self, run: RunRecord) -> list[decisions.Row]:
        """The run's metric rows, read from the step after the last one read (the last one again: an eval row
        merges into its step's train row)."""
        objective = self.spec.objective
        wide = objective in WIDE_NAMES
        rows = self._read.setdefault(run.id, [])
        start = rows.pop().step if rows else None
        frame = self.orch.store.metrics_frame(run.id, from_step=start,
                                              columns=("loss", "nonfinite") + ((objective,) if wide else ()),
                                              keys=None if wide else [objective])
        rows += [decisions.Row(step=int(row["step"]), loss=_number(row.get("loss")),
                               objective=_number(row.get(objective)),
                               nonfinite=tuple(n for n in str(row.get("nonfinite") or "").split(",") if n))
                 for row in frame.to_dict("records")]
        if run.status.is_terminal():
            self._read.pop(run.id, None)
        return rows

    def _pause(self, t: FrozenTrial, run: RunRecord) -> None:
        """The sweep is stopping: stop this trial's run (it saves) or take it out of the queue; resume continues it."""
        if run.status is RunStatus.STOPPING:
            return
        if not t.user_attrs.get(PAUSED):  # before Stop, like a pruned trial's reason
            optuna.Trial(self.study, t._trial_id).set_user_attr(PAUSED, True)
        self.orch.stop(run.id, actor=self.actor)

    def _continue(self, t: FrozenTrial, run: RunRecord) -> bool:
        """Resume a trial the sweep paused: from its checkpoint, or from the start when it never trained a step."""
        trial = optuna.Trial(self.study, t._trial_id)
        trial.set_user_attr(PAUSED, False)
        if run.status is RunStatus.STOPPED and run.steps_done > (run.resumed_from_step or 0):
            self._start(trial, resume_of=run)
        elif run.status is RunStatus.CANCELLED or run.steps_done == 0:  # never left the queue, or no step done
            self._start(trial)
        else:
            self._settle(t, run)
            return False
        return True

    def _settle(self, t: FrozenTrial, run: RunRecord) -> None:
        """Tell Optuna how the trial ended (once)."""
        done = self.study._storage.get_trial(t._trial_id)
        trial = optuna.Trial(self.study, t._trial_id)
        if done.user_attrs.get(PRUNED):
            self.study.tell(t.number, state=TrialState.PRUNED, skip_if_finished=True)
        elif run.status is RunStatus.COMPLETED and decisions.final_value(done.intermediate_values) is not None:
            self.study.tell(t.number, decisions.final_value(done.intermediate_values), skip_if_finished=True)
        elif run.status is RunStatus.STOPPED:  # stopped by hand: kept as pruned, with what it reported
            trial.set_user_attr(PRUNED, "stopped by hand")
            self.study.tell(t.number, state=TrialState.PRUNED, skip_if_finished=True)
        else:
            reason = (run.error.splitlines()[0] if run.error else "") if run.status is RunStatus.FAILED else \
                f"run {run.status.label.lower()}"
            if run.status is RunStatus.COMPLETED:
                reason = f"it reported no {self.spec.objective}"
            trial.set_user_attr(ERROR, reason[:500])
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number  # NaN: a missing value in the frame
