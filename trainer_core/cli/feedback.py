"""``python -m trainer_core feedback ...``: people's feedback from the command line (issue 34), through the same
service as the pages (trainer_core/feedback/service.py), as the CLI's user (``FINETUNE_STUDIO_TOKEN``'s, else the
local user).

    feedback import FILE.jsonl              ratings of eval answers and votes made elsewhere, one JSON object a line
    feedback export --format dpo|kto        the votes as the next version of a DPO or KTO dataset in the data root
    feedback agreement [--eval JOB]         counts, agreement between people, conflicts; the judge against people

Filters (export, agreement): ``--run``, ``--person``, ``--label`` (repeatable), ``--since``/``--until`` (YYYY-MM-DD).
Exit codes: 0 done, 2 refused or bad input (an import still records its good lines and names each bad one)."""
from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Callable

from trainer_core.feedback import agreement, calibration, export, served, votes
from trainer_core.feedback.service import SCALE_TEXT, Feedback, FeedbackRefused
from trainer_core.feedback.votes import FeedbackError
from trainer_core.protocol import paths


def add_parser(sub, actor_of: Callable) -> None:
    parser = sub.add_parser("feedback", help="`feedback import FILE`, `feedback export --format dpo|kto`, "
                                             "`feedback agreement`: votes and ratings (docs/feedback.md)")
    commands = parser.add_subparsers(dest="feedback_command", required=True)
    imported = commands.add_parser("import", help="record ratings and votes from a JSONL file (docs/feedback.md)")
    imported.add_argument("file", help="a .jsonl file, one rating or vote a line")
    exported = commands.add_parser("export", help="write the votes as a DPO or KTO dataset under the data root")
    exported.add_argument("--format", choices=list(export.FORMATS), required=True)
    agreed = commands.add_parser("agreement", help="votes per run and person, agreement, conflicts; --eval JOB: "
                                                   "the LLM judge against people's ratings")
    agreed.add_argument("--eval", metavar="JOB", default="", help="an eval job whose judge to check")
    agreed.add_argument("--json", action="store_true", help="print one JSON object")
    for command in (exported, agreed):
        command.add_argument("--run", action="append", default=[], help="only votes on this run's answers")
        command.add_argument("--person", action="append", default=[], help="only this person's votes")
        command.add_argument("--label", action="append", default=[], choices=list(votes.ALL_LABELS))
        command.add_argument("--since", default="", metavar="YYYY-MM-DD")
        command.add_argument("--until", default="", metavar="YYYY-MM-DD", help="included")
    parser.set_defaults(func=lambda args: cmd_feedback(args, actor_of))


def filters_of(args) -> agreement.Filters:
    def day(text: str, plus: int = 0) -> float | None:
        if not text:
            return None
        try:
            return (dt.datetime.fromisoformat(text) + dt.timedelta(days=plus)).timestamp()
        except ValueError:
            raise FeedbackError(f"{text!r} is not a date: write YYYY-MM-DD") from None

    return agreement.Filters(tuple(args.run), tuple(args.person), tuple(args.label), day(args.since),
                             day(args.until, 1))


def cmd_feedback(args, actor_of: Callable) -> int:
    from db.store import Store
    from db.users import UnknownToken

    store = Store()
    try:
        feedback = Feedback(store)
        actor = actor_of(store)
        synced = served.sync(feedback)  # ratings posted to serve jobs' endpoints become votes first
        for skipped in synced.skipped:
            print(f"warning: a served rating was not recorded: {skipped}", file=sys.stderr)
        return COMMANDS[args.feedback_command](args, feedback, actor)
    except (FeedbackError, UnknownToken) as exc:
        print(f"{'refused' if isinstance(exc, (FeedbackRefused, UnknownToken)) else 'error'}: {exc}", file=sys.stderr)
        return 2
    finally:
        store.engine.dispose()


def cmd_import(args, feedback: Feedback, actor) -> int:
    problem = paths.path_problem(args.file)
    if problem:
        raise FeedbackError(problem)
    try:
        lines = Path(args.file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise FeedbackError(f"cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}") from None
    report = feedback.import_lines(actor, lines)
    print(f"recorded {report.ratings} rating(s) and {report.votes} vote(s) as {actor.name}")
    for problem in report.problems:
        print(f"refused: {problem}", file=sys.stderr)
    return 2 if report.problems else 0


def cmd_export(args, feedback: Feedback, actor) -> int:
    done = feedback.export(actor, args.format, filters_of(args))
    print(f"wrote {done.rows} row(s) from {len(done.vote_ids)} vote(s): {done.path} (version {done.version}); "
          f"lineage in {done.card}")
    for why, count in done.left_out.items():
        print(f"left out {count}: {why}")
    return 0


def cmd_agreement(args, feedback: Feedback, actor) -> int:
    chosen = agreement.select(feedback.all_votes(), filters_of(args))
    found = agreement.agreement(chosen)
    result = {"votes": len(chosen), "people": len({v.voter for v in chosen}),
              "agreement": found.rate, "pairs_of_people": found.pairs, "agreeing": found.agreeing,
              "shared": found.shared, "conflicts": len(found.conflicts),
              "by_run": {k: dict(v) for k, v in agreement.counts_by_run(chosen).items()},
              "by_person": {k: dict(v) for k, v in agreement.counts_by_person(chosen).items()}}
    if args.eval:
        result["judge"] = judge_report(feedback, args.eval)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    rate = "—" if found.rate is None else f"{found.rate:.0%}"
    print(f"{result['votes']} vote(s) by {result['people']} person(s); agreement {rate} ({found.agreeing} of "
          f"{found.pairs} pairs of people on {found.shared} shared answer(s)); {len(found.conflicts)} conflict(s)")
    for title, counts in (("run", result["by_run"]), ("person", result["by_person"])):
        for key, labels in counts.items():
            print(f"  {title} {key}: " + ", ".join(f"{label} {n}" for label, n in sorted(labels.items())))
    for scale, report in result.get("judge", {}).items():
        stats = ", ".join(f"{s['name']} {_num(s['value'])} [{_num(s['low'])}, {_num(s['high'])}]"
                          for s in report["statistics"])
        print(f"judge ({SCALE_TEXT[scale]}): {report['status']}, n {report['n']}: {stats}. {report['reason']}")
    return 0


def judge_report(feedback: Feedback, job_id: str) -> dict:
    samples = feedback.store.eval_samples(job_id)
    if samples.empty or samples["judge"].isna().all():
        raise FeedbackError(f"eval job {job_id[:64]!r} has no answers scored by the LLM judge")
    ratings = feedback.ratings_for(job_id)
    out = {}
    for scale in SCALE_TEXT:
        found = calibration.calibrate(calibration.paired(samples, ratings, scale), scale)
        out[scale] = {"status": found.status, "n": found.n, "reason": found.reason,
                      "statistics": [vars(s) for s in found.statistics]}
    return out


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


COMMANDS = {"import": cmd_import, "export": cmd_export, "agreement": cmd_agreement}
