"""Headless CLI, driving the same orchestrator and database as the dashboard.

    python -m trainer_core run --config run.yaml [--set key=value ...]
    python -m trainer_core validate --config run.yaml
    python -m trainer_core runs [show RUN | follow RUN | export RUN --format csv|jsonl|yaml [-o FILE]]
    python -m trainer_core db rebuild     (rebuild the database from the run folders)
    python -m trainer_core chat RUN [--checkpoint STEP | --base] [--prompt TEXT] ...   (chat with a run's model)
    python -m trainer_core serve RUN [--checkpoint STEP] [--host H] [--port P] [--launcher ray]  (an endpoint)
    python -m trainer_core stop JOB | cancel JOB [--wait]     (any job: stop & save / cancel; a queued one leaves)
    python -m trainer_core eval RUN [--checkpoint STEP | --base] --data FILE [--metrics ...] [--json]
    python -m trainer_core export RUN --to adapter|merged|gguf [--quant q8_0] [-o DIR] [--verify] [--push REPO]
    python -m trainer_core feedback import FILE | export --format dpo|kto | agreement [--eval JOB]   (votes, ratings)
    python -m trainer_core sweep --config sweep.yaml | sweep list | show SWEEP | stop SWEEP | resume SWEEP [--more N]

Secrets come from the environment (HF_TOKEN, WANDB_API_KEY), never from the YAML or argv; a launcher: ray run
gets them through its run folder, never Ray's job table (trainer_core/protocol/secret_file.py).
Identity: with FINETUNE_STUDIO_TOKEN set (an API token from the dashboard's Account page), the CLI acts as
that token's user and role; without it, as the local OS user with every right (whoever can run this
command can read the data root anyway).
Exit codes: 0 completed, 1 failed, 2 invalid config or refused, 3 stopped or cancelled,
4 the database cannot be used (the message says how to rebuild it).

Kept whole: the CLI's one argument parser and the bodies of its commands, each a few lines over the orchestrator;
the commands with logic of their own live in trainer_core/cli/ (evaluate.py, export.py, serve.py).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml
from sqlalchemy.exc import SQLAlchemyError

from trainer_core.jobs import resource_check
from trainer_core.protocol import paths, secrets
from trainer_core.auth.access import Actor, Role
from trainer_core.config import (SECRET_FIELDS, ConfigError, FieldError, TrainConfig, load_yaml, read_training_type,
                                 secrets_in_file)
from trainer_core.data import loading
from trainer_core.cli import evaluate as eval_cli
from trainer_core.jobs.live import LiveSnapshot
from trainer_core.protocol.status import RunStatus

TOKEN_ENV = "FINETUNE_STUDIO_TOKEN"
EXIT = {RunStatus.COMPLETED: 0, RunStatus.FAILED: 1, RunStatus.STOPPED: 3, RunStatus.CANCELLED: 3}


def load_config(path: str, overrides: list[str]) -> TrainConfig:
    problem = paths.path_problem(path)
    if problem:
        raise ConfigError([FieldError("config", problem)])
    try:
        data = load_yaml(TrainConfig.read_text(path)) or {}
    except FileNotFoundError:
        raise ConfigError([FieldError("config", f"{path} does not exist")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError([FieldError("config", f"cannot read {path}: {reason}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([FieldError("config", f"{path} is not valid YAML: {exc}")]) from None
    except RecursionError:
        raise ConfigError([FieldError("config", f"{path} nests values too deeply to read: fix the file")]) from None
    if not isinstance(data, dict):
        raise ConfigError([FieldError("config", f"{path} must hold a mapping of field: value")])
    leaked = secrets_in_file(data, Path(path).name)
    if leaked:
        raise ConfigError(leaked)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError([FieldError("--set", f"expected key=value, got {item!r}")])
        if key.strip() in SECRET_FIELDS:  # argv is visible to every user of the machine (ps, /proc)
            raise ConfigError([FieldError(key.strip(), "secrets do not belong on the command line; set HF_TOKEN / "
                                                       "WANDB_API_KEY in the environment")])
        if key.strip() == "training_type":  # the old name of method + adapter: the flag replaces both
            for name in ("method", "adapter"):
                data.pop(name, None)
        elif key.strip() in ("method", "adapter") and "training_type" in data:  # an old file: the flag changes one
            errors: list[FieldError] = []
            data = read_training_type(data, errors)
            if errors:
                raise ConfigError(errors)
        try:
            data[key.strip()] = load_yaml(value)
        except (yaml.YAMLError, RecursionError):
            raise ConfigError([FieldError(key.strip(), f"--set value {value[:60]!r} is not a YAML value; quote "
                                                       "text that contains [ { : or #")]) from None
    cfg = TrainConfig.from_dict(data)
    for name, value in secrets.from_env(os.environ).items():
        setattr(cfg, name, value)
    return cfg


def progress_line(snap: LiveSnapshot, width: int = 30) -> str:
    filled = int(snap.progress * width)
    bar = "█" * filled + "·" * (width - filled)
    loss = f"loss {snap.loss:.4f}" if snap.loss is not None else "loss —"
    eta = f"eta {int(snap.eta_s)}s" if snap.eta_s is not None else ""
    return f"[{bar}] {snap.step}/{snap.total_steps or '?'} {loss} {snap.status.label}: {snap.phase} {eta}".rstrip()


def cli_actor(store) -> Actor:
    """The user this command acts as: the API token's (FINETUNE_STUDIO_TOKEN), else the local OS user."""
    from db import users

    token = os.environ.get(TOKEN_ENV, "")
    return users.user_for_token(store, token) if token else Actor.local()


def cmd_run(args) -> int:
    from db.users import UnknownToken
    from trainer_core.jobs.orchestrator import Orchestrator, RunRefused

    orch = None
    try:
        cfg = load_config(args.config, args.set or [])
        orch = Orchestrator()
        actor = cli_actor(orch.store)
        run_id = orch.start(cfg, actor=actor)
    except ConfigError as exc:
        if orch is not None:
            orch.close()  # its pump thread must not outlive the refusal
        for error in exc.errors:
            print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return 2
    except (RunRefused, UnknownToken) as exc:
        if orch is not None:
            orch.close()
        print(f"refused: {exc} ({TOKEN_ENV})" if isinstance(exc, UnknownToken) else f"refused: {exc}", file=sys.stderr)
        return 2
    row = orch.get_run(run_id)
    if row.status == RunStatus.QUEUED.value:
        ahead = [r.name for r in orch.queue() if r.id != run_id] + [r.name for r in orch.store.active_runs()]
        print(f"run {run_id} queued behind {len(ahead)} run(s); it starts when its device is free "
              f"(Ctrl-C removes it from the queue)")
    else:
        print(f"run {run_id} started by {actor.name}; folder {row.output_dir}")
    interrupts = {"n": 0}

    def on_sigint(*_):
        interrupts["n"] += 1
        if interrupts["n"] == 1:
            print("\nstopping and saving (Ctrl-C again to cancel without saving)", file=sys.stderr)
            orch.stop(run_id, actor=actor)
        else:
            print("\ncancelling", file=sys.stderr)
            orch.cancel(run_id, actor=actor)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        return follow(orch, run_id)
    finally:  # the caller's handler back: a later command in this process is not this run's to stop
        signal.signal(signal.SIGINT, previous)
        orch.close()


def follow(orch, run_id: str) -> int:
    """Print a job's progress until it ends, then its outcome; the exit code says how it ended."""
    tty = sys.stdout.isatty()
    last = {"line": "", "at": 0.0}

    def tick(snap: LiveSnapshot) -> None:
        line = progress_line(snap)
        if tty:
            print("\r" + line.ljust(100), end="", flush=True)
        elif line != last["line"] and time.monotonic() - last["at"] > 5:
            print(line, flush=True)
            last.update(line=line, at=time.monotonic())

    snap = orch.wait(run_id, on_tick=tick)
    if tty:
        print()
    print(progress_line(snap))
    print(f"final status: {snap.status.value}")
    if snap.status is RunStatus.FAILED:
        print(f"error: {snap.error}", file=sys.stderr)
        if snap.log_tail:
            print("--- worker log (tail) ---\n" + snap.log_tail, file=sys.stderr)
    elif snap.output_dir:
        print(f"outputs: {snap.output_dir}")
    return EXIT.get(snap.status, 1)


def cmd_validate(args) -> int:
    try:
        cfg = load_config(args.config, args.set or [])
        errors = cfg.validate() + loading.check_data(cfg)  # fields, then the dataset files
        if errors:
            raise ConfigError(errors)
        memory = resource_check.memory_problems(cfg)  # what `run` would refuse, too
        if memory:
            raise ConfigError(memory)
    except ConfigError as exc:
        for error in exc.errors:
            print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return 2
    print("config is valid")
    return 0


def cmd_rewards(args) -> int:
    """`rewards check`: each GRPO reward run on a few real rows (the data's reference answers, and with
    --generations the base model's sampled answers) before a GPU hour is spent: scores, spread, a reward that
    raises (exit 1, with its message and line) or gives every completion the same score (a warning)."""
    from db.store import Store
    from db.users import UnknownToken
    from trainer_core.methods import grpo
    from trainer_core.rewards import check as reward_check
    from trainer_core.rewards import spec as reward_spec

    try:
        cfg = load_config(args.config, args.set or [])
        if cfg.method != "grpo":
            raise ConfigError([FieldError("method", f"rewards are checked for method grpo, this config trains "
                                                    f"{cfg.method}: set method: grpo")])
        errors = cfg.validate() + loading.check_data(cfg)
        if errors:
            raise ConfigError(errors)
        if reward_spec.needs_admin(grpo.rewards_of(cfg)):  # the check runs the user's Python file
            store = Store()
            try:
                actor = cli_actor(store)
            finally:
                store.engine.dispose()
            if actor.role is not Role.ADMIN:
                print("error: a custom Python reward runs its code on this host: only an admin may check or "
                      "start it (FINETUNE_STUDIO_TOKEN of an admin, or no token as the local user)", file=sys.stderr)
                return 2
    except ConfigError as exc:
        for error in exc.errors:
            print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return 2
    except UnknownToken as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = reward_check.check_rewards(cfg, rows=args.rows, generations=args.generations)
    for line in reward_check.report(result):
        print(line, file=sys.stderr if line.startswith("error:") else sys.stdout)
    if result.errors:
        return 2
    return 0 if result.ok else 1


def cmd_runs(args) -> int:
    from db.store import Store

    if args.runs_command == "follow":
        return _follow_again(args.run)
    _catch_up()
    store = Store()
    if args.runs_command == "show":
        return _show(store, args.run)
    if args.runs_command == "export":
        return _export(store, args.run, args.format, args.output)
    runs = store.list_runs(limit=args.limit)
    _warn_unknown_folders(store)
    if not runs:
        print("no runs yet")
        return 0
    header = f"{'id':<24} {'status':<10} {'steps':>11} {'final loss':>10}  name"
    print(header)
    for run in runs:
        loss = f"{run.final_loss:.4f}" if run.final_loss is not None else "—"
        print(f"{run.id:<24} {run.status:<10} {f'{run.steps_done}/{run.total_steps}':>11} {loss:>10}  {run.name}")
    return 0


def _catch_up() -> None:
    """Jobs that nobody follows (no dashboard, the `run` that followed them gone) are read from their own logs
    first, as a dashboard's pump would: without this a job whose worker ended long ago still shows "running"."""
    from trainer_core.jobs import adoption
    from trainer_core.jobs.orchestrator import Orchestrator

    with adoption.hold_presence():  # it writes to the database: `db rebuild` waits, and is waited for
        orch = Orchestrator(start_pump=False)
        try:
            orch.catch_up()
        finally:
            orch.close()


def _follow_again(ref: str) -> int:
    """`runs follow RUN`: follow a job to its end again (after its `run` died, or one a dashboard started); this
    process pumps it when nobody else does. Ctrl-C stops following, not the job."""
    from trainer_core.jobs.orchestrator import Orchestrator

    orch = Orchestrator()
    try:
        run = _find(orch.store, ref)
        if run is None:
            return 2
        print(f"following {run.name} ({run.id}); Ctrl-C stops following, the job goes on")
        return follow(orch, run.id)
    except KeyboardInterrupt:
        print(f"\nstopped following {ref}; the job goes on (`runs follow {ref}` again, `stop {ref}` to stop it)",
              file=sys.stderr)
        return 130
    finally:
        orch.close()


def _warn_unknown_folders(store) -> None:
    from trainer_core.jobs.rebuild import unknown_run_folders

    unknown = unknown_run_folders(store)
    if unknown:
        print(f"note: {len(unknown)} run folder(s) are not in the database ({', '.join(unknown[:3])}"
              f"{', ...' if len(unknown) > 3 else ''}); was it deleted or replaced? Restore them with "
              "`python -m trainer_core db rebuild`.", file=sys.stderr)


def rebuild_refusal() -> str:
    """Why the caller may not rebuild the database ("" when they may): admins only. Without FINETUNE_STUDIO_TOKEN
    the local OS user acts, with every right (whoever runs this on the host owns the data root anyway); with it,
    the token's user, who must be an admin (a viewer's token, or one that is unknown, is refused)."""
    from db import users
    from db.store import Store
    from trainer_core.auth import access

    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        return ""
    store = None
    try:
        store = Store()
        actor = users.user_for_token(store, token)
    except SQLAlchemyError as exc:
        return (f"{TOKEN_ENV} is set, but the database that holds the API tokens cannot be read to check it "
                f"({type(exc).__name__}); unset {TOKEN_ENV} to rebuild as the local OS user")
    except users.UnknownToken as exc:
        return f"{exc} ({TOKEN_ENV})"
    finally:
        if store is not None:
            store.engine.dispose()  # the rebuild moves the SQLite file aside: no connection may hold it
    if not access.allowed(actor, access.Action.MAINTAIN):
        return f"only admins can rebuild the database; the token in {TOKEN_ENV} is {actor.name}'s (role {actor.role.value})"
    return ""


def cmd_db(args) -> int:
    from trainer_core.jobs.rebuild import RebuildRefused, rebuild

    refusal = rebuild_refusal()
    if refusal:
        print(f"refused: {refusal}", file=sys.stderr)
        return 2
    try:
        report = rebuild()
    except RebuildRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


def _find(store, ref: str):
    """A run by id, unique id prefix or exact name; prints why not and returns None otherwise."""
    run = store.get_run(ref)
    if run is not None:
        return run
    matches = store.find_runs(ref)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        print(f"error: no run matches {ref!r} (see `python -m trainer_core runs`)", file=sys.stderr)
    else:
        print(f"error: {ref!r} matches {len(matches)} runs: {', '.join(r.id for r in matches[:5])}; "
              "give more of the id", file=sys.stderr)
    return None


def _show(store, ref: str) -> int:
    run = _find(store, ref)
    if run is None:
        return 2
    events = store.get_events(run.id)
    alerts = [e for e in events if e.kind == "alert"]

    def when(ts):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "—"

    def num(value, digits=4):
        return f"{value:.{digits}f}" if value is not None else "—"

    duration = (run.finished_at or time.time()) - run.started_at if run.started_at else None
    lines = [
        ("name", run.name), ("id", run.id), ("status", _status_text(run)),
        ("model", run.model), ("dataset", run.dataset), ("method", run.method), ("engine", run.engine or "—"),
        ("started", when(run.started_at)), ("finished", when(run.finished_at)),
        ("duration", f"{duration:.0f} s" if duration is not None else "—"),
        ("steps", f"{run.steps_done}/{run.total_steps}"), ("epoch", num(run.epoch, 3)),
        ("last loss", num(run.last_loss)), ("final loss", num(run.final_loss)),
        ("best eval loss", num(run.best_eval_loss)),
        ("tokens seen", f"{run.tokens_seen:,}" if run.tokens_seen else "—"),
        ("outputs", run.output_dir or "—"), ("alerts", str(len(alerts))),
    ]
    if run.parent_run_id and run.kind == "train":  # an eval/export/serve job's parent is the run it works on
        lines.append(("resumed from", f"{run.parent_run_id} at step {run.resumed_from_step}"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")
    for alert in alerts:
        print(f"alert: {alert.message}")
    if run.error:
        print(f"error: {run.error}")
    return 0


def _status_text(run) -> str:
    """The status label, with the phase only while the run is under way (a finished run's last phase, such as
    "saving" in rows written before finish_run cleared it, is stale)."""
    status = RunStatus(run.status)
    return status.label + (f" ({run.phase})" if run.phase and not status.is_terminal() else "")


def _export(store, ref: str, fmt: str, output: str | None) -> int:
    run = _find(store, ref)
    if run is None:
        return 2
    if fmt == "yaml":
        text = yaml.safe_dump(TrainConfig.from_dict(json.loads(run.config_json or "{}")).to_public_dict(),
                              sort_keys=False)
    else:
        frame = store.metrics_frame(run.id)
        text = frame.to_csv(index=False) if fmt == "csv" else frame.to_json(orient="records", lines=True)
    if output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(output).write_text(text)
        print(f"wrote {output}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_core", description="Finetune Studio headless CLI")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a run from a YAML config and follow it to the end")
    run.add_argument("--config", required=True, help="YAML file with TrainConfig fields (no secrets)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    run.set_defaults(func=cmd_run)
    val = sub.add_parser("validate", help="check a YAML config without starting anything")
    val.add_argument("--config", required=True)
    val.add_argument("--set", action="append", metavar="KEY=VALUE")
    val.set_defaults(func=cmd_validate)
    rewards = sub.add_parser("rewards", help="`rewards check --config FILE`: run a GRPO config's rewards on a few "
                                             "rows before starting it")
    rewards_sub = rewards.add_subparsers(dest="rewards_command", required=True)
    check = rewards_sub.add_parser("check", help="each reward's scores on the data's reference answers (and with "
                                                 "--generations the base model's), its spread, and any exception")
    check.add_argument("--config", required=True)
    check.add_argument("--set", action="append", metavar="KEY=VALUE")
    check.add_argument("--rows", type=int, default=4, help="dataset rows to score (default 4)")
    check.add_argument("--generations", type=int, default=0,
                       help="base-model answers sampled per prompt besides the references (default 0: no model load)")
    check.set_defaults(func=cmd_rewards)
    runs = sub.add_parser("runs", help="list runs; `runs show RUN`, `runs follow RUN`, `runs export RUN --format csv`")
    runs.add_argument("--limit", type=int, default=50)
    runs.set_defaults(func=cmd_runs, runs_command="list")
    runs_sub = runs.add_subparsers(dest="runs_command")
    runs_sub.add_parser("list", help="list runs, newest first")
    follow_again = runs_sub.add_parser("follow", help="follow a run to its end again (after its `run` died)")
    follow_again.add_argument("run", help="run id, unique id prefix, or name")
    show = runs_sub.add_parser("show", help="print a run's summary")
    show.add_argument("run", help="run id, unique id prefix, or name")
    export = runs_sub.add_parser("export", help="write a run's metrics (csv/jsonl) or config (yaml, no secrets)")
    export.add_argument("run", help="run id, unique id prefix, or name")
    export.add_argument("--format", choices=("csv", "jsonl", "yaml"), default="csv")
    export.add_argument("--output", "-o", help="file to write (default: standard output)")
    db = sub.add_parser("db", help="`db rebuild`: rebuild the database from the run folders")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("rebuild", help="move the database aside (kept, never deleted) and rebuild it from every "
                                      "run folder's config.yaml, journal.jsonl and events.jsonl")
    db.set_defaults(func=cmd_db)
    _add_serving_commands(sub)
    _add_control_commands(sub)
    eval_cli.add_parser(sub, _find, cli_actor)
    from trainer_core.cli import export as cli_export  # `export RUN --to ...` (issue 11): its own module

    cli_export.add_parser(sub).set_defaults(func=lambda args: cli_export.cmd_export(args, _find, cli_actor))
    from trainer_core.cli import sweep as cli_sweep  # `sweep --config FILE` (issue 35): its own module

    cli_sweep.add_parser(sub, cli_actor)
    from trainer_core.cli import feedback as cli_feedback  # `feedback import|export|agreement` (issue 34)

    cli_feedback.add_parser(sub, cli_actor)
    from trainer_core.cli import data as cli_data  # `data preview|generate|resume|list|show` (issue 33)

    cli_data.add_parser(sub, cli_actor)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SQLAlchemyError as exc:
        from trainer_core.jobs.rebuild import describe_error

        print(f"error: {describe_error(exc)}", file=sys.stderr)
        return 4


def _add_control_commands(sub) -> None:
    """`stop JOB` and `cancel JOB`: the pages' Stop and Cancel, for a job of any kind."""
    for name, text in (("stop", "stop a job (a training run saves a checkpoint and its adapter first; a queued "
                                "job leaves the queue)"),
                       ("cancel", "cancel a job without saving (a queued job leaves the queue)")):
        parser = sub.add_parser(name, help=text)
        parser.add_argument("job", help="job id, unique id prefix, or name")
        parser.add_argument("--wait", action="store_true", help="wait until it has ended (exit 1 if it failed)")
        parser.set_defaults(func=cmd_control, action=name)


def cmd_control(args) -> int:
    from db.users import UnknownToken
    from trainer_core.jobs.orchestrator import Orchestrator, RunRefused

    orch = Orchestrator()
    try:
        actor = cli_actor(orch.store)
        run = _find(orch.store, args.job)
        if run is None:
            return 2
        status = RunStatus(run.status)
        if status.is_terminal():
            print(f"{run.name} ({run.id}) has already ended ({run.kind.status_label(status).lower()}): nothing to "
                  f"{args.action}", file=sys.stderr)
            return 0
        (orch.stop if args.action == "stop" else orch.cancel)(run.id, actor=actor)
        print(f"{args.action} requested: {run.name} ({run.id})", file=sys.stderr)
        if not args.wait:
            return 0
        orch.wait(run.id, interval=0.5)
        final = RunStatus(orch.store.get_run(run.id).status)
        print(f"{run.name} ({run.id}) {run.kind.status_label(final).lower()}")
        return 1 if final is RunStatus.FAILED else 0
    except (RunRefused, UnknownToken) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted (the request stands)", file=sys.stderr)
        return 3
    finally:
        orch.close()


def _add_serving_commands(sub) -> None:
    """`chat` and `serve`: a serve job for a run's model (trainer_core/cli/serve.py)."""
    from trainer_core.cli import serve as serving_cli
    from trainer_core.serving.spec import DEFAULT_MAX_TOKENS_CAP, DEFAULT_REQUEST_TIMEOUT_S

    def model_args(p, base: bool) -> None:
        p.add_argument("run", help="run id, unique id prefix, or name")
        which = p.add_mutually_exclusive_group()
        which.add_argument("--checkpoint", type=int, metavar="STEP", help="a completed checkpoint of the run")
        if base:
            which.add_argument("--base", action="store_true", help="the run's base model, without its adapter")
        else:
            p.set_defaults(base=False)

    chat = sub.add_parser("chat", help="chat with a run's model (streamed); --prompt for one answer, else a terminal chat")
    model_args(chat, base=True)
    chat.add_argument("--prompt", help="ask this, print the answer and exit")
    chat.add_argument("--image", metavar="PATH", help="show a vision model this image (PNG, JPEG, WebP or GIF, under "
                                                      "the allowed folders) with the first message")
    chat.add_argument("--system", default="", help="system prompt")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    chat.add_argument("--max-new-tokens", type=int, default=256)
    chat.add_argument("--seed", type=int, default=0)
    chat.set_defaults(func=lambda a: serving_cli.cmd_chat(a, _find, cli_actor))
    serve = sub.add_parser("serve", help="serve a run's model as an OpenAI-compatible endpoint until Ctrl-C")
    model_args(serve, base=True)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0: reachable from the network)")
    serve.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    serve.add_argument("--max-tokens-cap", type=int, default=DEFAULT_MAX_TOKENS_CAP, metavar="N",
                       help=f"the longest answer one request may ask for (default {DEFAULT_MAX_TOKENS_CAP})")
    serve.add_argument("--request-timeout", type=int, default=DEFAULT_REQUEST_TIMEOUT_S, metavar="S",
                       help=f"end a request still running after S seconds (default {DEFAULT_REQUEST_TIMEOUT_S}; 0: never)")
    serve.add_argument("--tls-cert", metavar="FILE", help="a PEM certificate: serve HTTPS (with --tls-key)")
    serve.add_argument("--tls-key", metavar="FILE", help="the certificate's PEM private key")
    serve.add_argument("--launcher", choices=("local", "ray"), default="local",
                       help="ray: a single-worker Ray job on the server's cluster, listening on its node's address "
                            "(RAY_ADDRESS; docs/ray.md)")
    serve.add_argument("--ray-gpus", type=float, default=0.0, metavar="N",
                       help="with --launcher ray: the GPUs Ray gives the server on its node (default 0: its CPU)")
    serve.add_argument("--store-completions", action="store_true",
                       help="keep each chat completion in the job folder so the app can rate it at POST /v1/feedback "
                            "(docs/feedback.md)")
    serve.set_defaults(func=lambda a: serving_cli.cmd_serve(a, _find, cli_actor))


if __name__ == "__main__":
    sys.exit(main())
