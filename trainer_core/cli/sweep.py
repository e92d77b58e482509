"""``python -m trainer_core sweep``: start a sweep from a YAML file (a run config with a ``sweep:`` section) and follow
it to its end, or list, show, stop and resume sweeps.

    python -m trainer_core sweep --config sweep.yaml [--set key=value ...]
    python -m trainer_core sweep list | show SWEEP | stop SWEEP | resume SWEEP [--more N]

While it follows a sweep this process drives it (trainer_core/sweeps/runner.py); Ctrl-C stops the sweep (its
running trials stop and save). If this process dies, the dashboard (or another ``sweep resume``) takes the sweep
over and carries on.
"""
from __future__ import annotations

import signal
import sys
import time

import yaml

from trainer_core.config import ConfigError, FieldError, load_yaml, read_yaml_file
from trainer_core.sweeps import record
from trainer_core.sweeps.record import SweepStatus
from trainer_core.sweeps import checks
from trainer_core.sweeps.spec import SweepConfig
from trainer_core.sweeps.summary import progress_line, summarize

FOLLOW_EVERY_S = 2.0


def add_parser(sub, cli_actor) -> None:
    parser = sub.add_parser("sweep", help="`sweep --config FILE`: a hyperparameter search whose trials are runs; "
                                          "`sweep list | show SWEEP | stop SWEEP | resume SWEEP [--more N]`")
    parser.add_argument("--config", help="YAML run config with a sweep: section (docs/sweeps.md)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field of the base config")
    parser.set_defaults(func=lambda args: cmd_sweep(args, cli_actor), sweep_command=None)
    commands = parser.add_subparsers(dest="sweep_command")
    commands.add_parser("list", help="every sweep, newest first")
    for name, text in (("show", "a sweep's trials, best first marked"), ("stop", "stop a sweep: its trials stop and "
                                                                           "save, nothing new starts"),
                       ("resume", "resume a stopped sweep, or extend one with --more trials, and follow it")):
        command = commands.add_parser(name, help=text)
        command.add_argument("sweep", help="sweep id")
        if name == "resume":
            command.add_argument("--more", type=int, default=0, help="trials to add to its budget")


def cmd_sweep(args, cli_actor) -> int:
    from trainer_core.jobs.orchestrator import Orchestrator
    from trainer_core.jobs.refusals import RunRefused
    from trainer_core.sweeps.runner import SweepRunner

    if args.sweep_command is None and not args.config:
        print("error: give --config FILE to start a sweep, or one of list, show, stop, resume", file=sys.stderr)
        return 2
    if args.sweep_command == "list":
        return _list()
    if args.sweep_command == "show":
        return _show(args.sweep)
    orch = Orchestrator()
    runner = SweepRunner(orch, start_thread=False)
    try:
        actor = cli_actor(orch.store)
        if args.sweep_command == "stop":
            runner.stop(args.sweep, actor=actor)
            print(f"sweep {args.sweep}: stopping (its running trials stop and save)")
            return 0
        if args.sweep_command == "resume":
            runner.resume(args.sweep, more_trials=args.more, actor=actor)
            sweep_id = args.sweep
        else:
            sweep_id = runner.create(load(args.config, args.set or []), actor=actor)
            print(f"sweep {sweep_id} started by {actor.name}; folder {record.sweep_dir(sweep_id)}")
        return follow(runner, orch, sweep_id, actor)
    except ConfigError as exc:
        for error in exc.errors:
            print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return 2
    except RunRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    finally:
        runner.close()
        orch.close()


def load(path: str, overrides: list[str]) -> SweepConfig:
    """The file's base config and sweep: section, every problem of both raised together (ConfigError)."""
    data = read_yaml_file(path, "config")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError([FieldError("--set", f"expected key=value, got {item!r}")])
        head, _, rest = key.strip().partition(".")
        target = data.setdefault("sweep", {}) if head == "sweep" and rest else data
        try:
            target[rest if head == "sweep" and rest else key.strip()] = load_yaml(value)
        except (yaml.YAMLError, RecursionError):
            raise ConfigError([FieldError(key.strip(), f"--set value {value[:60]!r} is not a YAML value")]) from None
    config, errors = checks.read(data)
    if errors:
        raise ConfigError(errors)
    return config


def follow(runner, orch, sweep_id: str, actor) -> int:
    """Drive and print the sweep until it ends; Ctrl-C stops it (its trials save). Exit 0 completed, 3 stopped."""
    previous = signal.signal(signal.SIGINT, lambda *_: (print("\nstopping the sweep (its running trials stop and "
                                                              "save)", file=sys.stderr), runner.stop(sweep_id, actor=actor)))
    try:
        return _follow(runner, orch, sweep_id)
    finally:  # the caller's handler back
        signal.signal(signal.SIGINT, previous)


def _follow(runner, orch, sweep_id: str) -> int:
    last = ""
    while True:
        runner.tick_once()
        summary = summarize(sweep_id, orch.store.sweep_runs(sweep_id), importance=False)
        line = progress_line(summary)
        if line != last:
            print(line, flush=True)
            last = line
        if not summary.state.status.is_active() and sweep_id not in runner.driving():
            break
        time.sleep(FOLLOW_EVERY_S)
    _print_trials(summarize(sweep_id, orch.store.sweep_runs(sweep_id)))
    return 0 if summary.state.status is SweepStatus.COMPLETED else 3


def _list() -> int:
    for sweep_id in record.list_ids():
        state = record.read(sweep_id)
        spec = state.config.spec
        print(f"{sweep_id}  {state.status.value:<9}  {spec.search:<6}  {', '.join(p.name for p in spec.params)}  "
              f"{spec.objective} ({spec.direction})  {state.name}")
    return 0


def _show(sweep_id: str) -> int:
    from db.store import Store

    try:
        summary = summarize(sweep_id, Store().sweep_runs(sweep_id))
    except (FileNotFoundError, record.UnsafePathError):
        print(f"error: there is no sweep {sweep_id}", file=sys.stderr)
        return 2
    print(progress_line(summary))
    _print_trials(summary)
    return 0


def _print_trials(summary) -> None:
    for row in summary.trials:
        value = f"{row['objective']:.4g}" if row["objective"] is not None else "—"
        params = ", ".join(f"{p}={row[p]!r}" for p in summary.params)
        mark = " *best*" if row["best"] else ""
        note = f"  ({row['note']})" if row["note"] else ""
        print(f"  trial {row['trial']:>3}  {row['outcome']:<9} {value:>8}  {params}  {row['run_id']}{mark}{note}")
    if summary.importance:
        print("  importance: " + ", ".join(f"{k} {v:.0%}" for k, v in summary.importance.items()))
