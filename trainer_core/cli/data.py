"""``python -m trainer_core data``: data recipes from the command line (docs/data-recipes.md).

    python -m trainer_core data starters                          the starter recipes
    python -m trainer_core data preview  (--recipe FILE | --starter NAME) [--set key=value ...] [--rows N]
    python -m trainer_core data generate (--recipe FILE | --starter NAME) [--set key=value ...] [--no-follow]
    python -m trainer_core data resume JOB                        continue a stopped, cancelled or failed recipe job
    python -m trainer_core data list                              the datasets recipes made, newest first
    python -m trainer_core data show NAME[@vN]                    a dataset's card and first rows

A recipe file is YAML: a RecipeSpec's fields (``recipe`` is NeMo Data Designer's config). While ``generate`` follows
the job, Ctrl-C stops it: the rows kept so far are published (``data resume JOB`` continues it).
"""
from __future__ import annotations

import json
import signal
import sys
import time

import yaml

from trainer_core.config import ConfigError, FieldError, load_yaml, read_yaml_file
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

EXIT = {RunStatus.COMPLETED: 0, RunStatus.STOPPED: 3, RunStatus.CANCELLED: 130}


def add_parser(sub, cli_actor) -> None:
    parser = sub.add_parser("data", help="data recipes: `data starters | preview | generate | resume | list | show`")
    commands = parser.add_subparsers(dest="data_command", required=True)
    commands.add_parser("starters", help="the starter recipes")
    for name, text in (("preview", "a few rows generated and checked, with an estimate for the full job"),
                       ("generate", "start a recipe job and follow it (Ctrl-C stops it and publishes what it made)")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--recipe", help="YAML file of a recipe's fields (docs/data-recipes.md)")
        command.add_argument("--starter", help="start from a starter recipe (see `data starters`)")
        command.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a field (YAML value)")
        if name == "preview":
            command.add_argument("--rows", type=int, default=5, help="records to generate (at most 20)")
        else:
            command.add_argument("--no-follow", action="store_true", help="start it and return")
    resume = commands.add_parser("resume", help="continue a stopped, cancelled or failed recipe job")
    resume.add_argument("job", help="the recipe job's id")
    commands.add_parser("list", help="the datasets recipes made, newest first")
    show = commands.add_parser("show", help="a dataset's card and first rows")
    show.add_argument("dataset", help="NAME or NAME@vN")
    parser.set_defaults(func=lambda args: cmd_data(args, cli_actor))


def cmd_data(args, cli_actor) -> int:
    if args.data_command == "starters":
        return _starters()
    if args.data_command == "list":
        return _list()
    if args.data_command == "show":
        return _show(args.dataset)
    from trainer_core.jobs.orchestrator import Orchestrator
    from trainer_core.jobs.refusals import RunRefused
    from trainer_core.recipes import launch

    orch = Orchestrator()
    try:
        actor = cli_actor(orch.store)
        if args.data_command == "resume":
            job_id = launch.resume(orch, args.job, actor)
            print(f"recipe job {job_id} continues {args.job}")
            return _follow(orch, job_id, actor)
        spec = launch.from_fields(read_recipe(args.recipe, args.starter, args.set or []))
        if args.data_command == "preview":
            return _preview(launch.preview(orch, spec, actor, rows=args.rows))
        job_id = launch.start(orch, spec, actor)
        print(f"recipe job {job_id} started by {actor.name}; dataset recipes/{spec.dataset_name}; folder "
              f"{paths.run_dir(job_id)}")
        return 0 if args.no_follow else _follow(orch, job_id, actor)
    except ConfigError as exc:
        for error in exc.errors:
            print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return 2
    except RunRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    except launch.PreviewError as exc:
        print(f"error: the preview failed: {exc}", file=sys.stderr)
        return 1
    finally:
        orch.close()


def read_recipe(path: str | None, starter: str | None, overrides: list[str]) -> dict:
    """The recipe's fields: the file's (or the starter's), ``--set`` over them. ConfigError names the problem."""
    data: dict = {}
    if path:
        data = read_yaml_file(path, "--recipe")
    elif not starter:
        raise ConfigError([FieldError("--recipe", "give --recipe FILE or --starter NAME (see `data starters`)")])
    if starter:
        data = {"starter": starter, **data}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError([FieldError("--set", f"expected key=value, got {item!r}")])
        try:
            data[key.strip()] = load_yaml(value)
        except (yaml.YAMLError, RecursionError):
            raise ConfigError([FieldError(key.strip(), f"--set value {value[:60]!r} is not a YAML value")]) from None
    return data


def _starters() -> int:
    from trainer_core.recipes import starters

    for name in starters.names():
        found = starters.get(name)
        print(f"{name:26} {found.label}  (needs: {found.needs})\n{'':26} {found.description}")
    return 0


def _preview(result: dict) -> int:
    for i, shown in enumerate(result["rows"]):
        where = ", ".join(f"{k} {v}" for k, v in shown["source"].items() if v is not None)
        verdict = "kept" if shown["row"] is not None else f"set aside: {shown['reason']}"
        scores = ", ".join(f"{k} {v:g}" for k, v in shown["scores"].items())
        print(f"--- record {i + 1}{' (' + where + ')' if where else ''}: {verdict}{'; ' + scores if scores else ''}")
        print(json.dumps(shown["row"] if shown["row"] is not None else shown["record"], ensure_ascii=False,
                         indent=1)[:2000])
    estimate = result["estimate"]
    print(f"\n{result['made']}/{result['asked']} records in {result['elapsed_s']:.1f} s, "
          f"{result['tokens_in'] + result['tokens_out']:,} tokens; the full job ({estimate['rows']:,} records): about "
          f"{_duration(estimate['seconds'])} and {int(estimate['tokens']):,} tokens, "
          f"{estimate['kept_share']:.0%} kept at this rate")
    for warning in result.get("warnings", []) + result.get("teacher_problems", []):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _follow(orch, job_id: str, actor) -> int:
    """Print the job's progress until it ends; Ctrl-C stops it (the rows kept so far are published)."""
    from trainer_core.recipes import store

    def on_sigint(*_):
        print("\nstopping: the rows kept so far are published (`data resume` continues)", file=sys.stderr)
        orch.stop(job_id, actor=actor)

    shown = {"line": "", "at": 0.0}

    def tick(snap) -> None:
        if time.monotonic() - shown["at"] < 2:
            return
        tally = store.counts(paths.run_dir(job_id))
        eta = f", eta {snap.eta_s:.0f} s" if snap.eta_s else ""
        line = f"{tally.made}/{snap.total_steps} records, {tally.kept} kept, {tally.rejected} set aside{eta}"
        if line != shown["line"]:
            print(line, flush=True)
        shown.update(line=line, at=time.monotonic())

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        snap = orch.wait(job_id, on_tick=tick)
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"final status: {snap.status.value}")
    if snap.status is RunStatus.FAILED:
        print(f"error: {snap.error}", file=sys.stderr)
        return 1
    found = [v for v in store.published() if v.card.get("job_id") == job_id]
    if found:
        card = found[0].card
        print(f"dataset {found[0].ref}: {card['kept']} rows kept of {card['made']} made "
              f"({card['rejected']} set aside: {', '.join(f'{k} {v}' for k, v in card['rejected_by_reason'].items())})")
    return EXIT.get(snap.status, 1)


def _list() -> int:
    from trainer_core.recipes import store

    found = store.published()
    if not found:
        print("no datasets made by recipes yet (`data generate --starter docs-qa --set documents=FOLDER`)")
    for version in found:
        card = version.card
        print(f"{version.name}@v{version.version:<4} {card.get('kept', '?'):>6} rows  job {card.get('job_id', '?')}  "
              f"{card.get('starter') or 'custom'}  {version.ref}")
    return 0


def _show(ref: str) -> int:
    from trainer_core.recipes import store

    name, _, version = ref.partition("@")
    found = [v for v in store.published() if v.name == name and (not version or f"v{v.version}" == version)]
    if not found:
        print(f"error: no recipe dataset {ref} (see `data list`)", file=sys.stderr)
        return 2
    chosen = max(found, key=lambda v: v.version)
    print((chosen.folder / store.README_FILE).read_text())
    with open(chosen.data_path, encoding="utf-8") as fh:
        for _, line in zip(range(3), fh):
            print(line.rstrip()[:1000])
    return 0
