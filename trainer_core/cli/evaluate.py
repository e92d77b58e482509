"""``python -m trainer_core eval RUN [--checkpoint STEP | --base] --data FILE [--metrics ...] [--json]``:
evaluate a run's final model, one of its checkpoints or its base model on a test file, wait for the result
and print the overall metrics (with the base-model baseline and the difference when there is one).

Exit codes as for ``run``: 0 completed, 1 failed, 2 bad input or refused, 3 stopped or cancelled."""
from __future__ import annotations

import json
import signal
import sys
from typing import Callable

from trainer_core.specs import model_source
from trainer_core.config import ConfigError
from trainer_core.evaluation import retrieval, speech
from trainer_core.evaluation.spec import DEFAULT_METRICS, EvalSpec
from trainer_core.protocol.status import JobKind, RunStatus

EXIT = {RunStatus.COMPLETED: 0, RunStatus.FAILED: 1, RunStatus.STOPPED: 3, RunStatus.CANCELLED: 3}
SHOWN = ("exact", "rouge_l", "bleu", "loss", "perplexity", "judge", *retrieval.RESULT_KEYS, *speech.RESULT_KEYS)
RETRIEVAL_BATCH = 32  # texts encoded together for retrieval, unless --batch-size says otherwise


def add_parser(sub, find: Callable, actor_of: Callable) -> None:
    """The ``eval`` subcommand; ``find(store, ref)`` resolves RUN like ``runs show``, ``actor_of(store)`` is
    the CLI's user."""
    parser = sub.add_parser("eval", help="evaluate a run's model (or a checkpoint, or its base model) on a test file")
    parser.add_argument("run", help="run id, unique id prefix, or name")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=int, metavar="STEP", help="evaluate checkpoint-STEP instead of the final model")
    which.add_argument("--base", action="store_true", help="evaluate the run's base model")
    parser.add_argument("--data", default="", help="test file (.jsonl/.json/.csv/.parquet, any training format), "
                                                  "eval_split:<run id>, or hub:<dataset id>; for retrieval a "
                                                  "BEIR-like folder or a file of anchor/positive pairs; for wer,cer "
                                                  "a file with audio and text columns or an audio folder")
    parser.add_argument("--metrics", default=None,
                        help="comma-separated: exact, rouge, bleu, perplexity, judge, preference_accuracy, reward; "
                             "tool_calls on conversations with tools (with exact, rouge, bleu, judge); "
                             f"retrieval alone for an embedding run; wer, cer for a speech run (default: "
                             f"{','.join(DEFAULT_METRICS)}, retrieval for an embedding run, wer,cer for a speech run)")
    parser.add_argument("--max-samples", type=int, default=200, help="test rows evaluated, 0 for all (default 200)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"prompts generated together (default 4), texts encoded together for retrieval "
                             f"(default {RETRIEVAL_BATCH})")
    parser.add_argument("--lm-eval", action="append", default=[], metavar="TASK",
                        help="an lm-evaluation-harness task name or local task YAML (repeatable)")
    parser.add_argument("--no-baseline", action="store_true", help="do not evaluate the base model for comparison")
    parser.add_argument("--json", action="store_true", help="print one JSON object with a key per metric")
    parser.add_argument("--launcher", choices=("local", "ray"), default="local",
                        help="ray: a single-worker Ray job on the server's cluster (RAY_ADDRESS; docs/ray.md)")
    parser.add_argument("--ray-gpus", type=float, default=0.0, metavar="N",
                        help="with --launcher ray: the GPUs Ray gives the job on its node (default 0: its CPU)")
    parser.set_defaults(func=lambda args: cmd_eval(args, find, actor_of))


def cmd_eval(args, find: Callable, actor_of: Callable) -> int:
    from db.users import UnknownToken
    from trainer_core.jobs import evals
    from trainer_core.jobs.orchestrator import Orchestrator, RunRefused

    orch = Orchestrator()
    try:
        run = find(orch.store, args.run)
        if run is None:
            return 2
        if run.kind is not JobKind.TRAIN:
            print(f"error: run: {run.id} is a {run.kind.label.lower()} job; evaluate a training run", file=sys.stderr)
            return 2
        try:
            source = _source(run.id, args)
            metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics is not None \
                else _default_metrics(run.id)
            batch = args.batch_size or (RETRIEVAL_BATCH if retrieval.METRIC in metrics else EvalSpec.batch_size)
            spec = EvalSpec(source=source, data=args.data, metrics=metrics, batch_size=batch,
                            max_samples=args.max_samples, max_new_tokens=args.max_new_tokens, lm_eval_tasks=args.lm_eval,
                            baseline=not (args.no_baseline or args.base),
                            # `--base --metrics reward`: the base model scored with RUN's rewards
                            reward_run=run.id if args.base else "", launcher=args.launcher,
                            ray_gpus_per_worker=args.ray_gpus)
            actor = actor_of(orch.store)
            started = evals.submit(orch, spec, actor)
        except ConfigError as exc:
            for error in exc.errors:
                print(f"error: {error.field}: {error.message}", file=sys.stderr)
            return 2
        except model_source.SourceError as exc:
            print(f"error: {exc.field}: {exc}", file=sys.stderr)
            return 2
        except (RunRefused, UnknownToken) as exc:
            print(f"refused: {exc}", file=sys.stderr)
            return 2
        print(f"eval job {started.job_id} submitted" + (f"; baseline {started.baseline_id}" if started.baseline_id
                                                          else ""), file=sys.stderr)
        return _follow(orch, started, actor, args.json)
    finally:
        orch.close()


def _default_metrics(run_id: str) -> list[str]:
    """An embedding run's retrieval, a speech run's wer and cer, every other run's DEFAULT_METRICS."""
    try:
        method = model_source.run_config(run_id).method
    except model_source.SourceError:
        method = ""  # the spec's validation names the missing run
    if method == "embedding":
        return [retrieval.METRIC]
    return list(speech.METRICS) if method == "stt" else list(DEFAULT_METRICS)


def _source(run_id: str, args) -> model_source.ModelSource:
    if args.base:
        return model_source.ModelSource(model=model_source.run_config(run_id).model_name)
    return model_source.ModelSource(run_id=run_id, checkpoint=args.checkpoint)


def _follow(orch, started, actor, as_json: bool) -> int:
    """Wait for the eval (``evals.Started``), printing progress; Ctrl-C cancels what this submission started."""
    from trainer_core.jobs import evals

    job_id, baseline_id = started.job_id, started.baseline_id

    def on_sigint(*_):
        cancelled = evals.cancel(orch, started, actor)  # the baseline too, if it was ours and nobody else waits
        kept = started.baseline_new and baseline_id not in cancelled and \
            not orch.store.get_run(baseline_id).status.is_terminal()
        print("\ncancelling the eval" + (f" and its baseline {baseline_id}" if baseline_id in cancelled else "")
              + (f" (its baseline {baseline_id} goes on: another eval waits for it)" if kept else ""),
              file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        return _await(orch, job_id, baseline_id, as_json)
    finally:  # the caller's handler back: a later Ctrl-C (or a later command in the same process) is not this eval's
        signal.signal(signal.SIGINT, previous)


def _await(orch, job_id: str, baseline_id: str | None, as_json: bool) -> int:
    """The eval followed to its end and its metrics printed (against the baseline's); the exit code."""
    shown: dict[str, int] = {}

    def progress(label: str, snap) -> None:
        """"N/M samples" once a sample is scored: M is then the rows the worker evaluates, not max_samples."""
        if snap.status in (RunStatus.RUNNING, RunStatus.STOPPING) and snap.step > 0 and snap.step != shown.get(label):
            shown[label] = snap.step
            print(f"{label}{snap.step}/{snap.total_steps} samples", file=sys.stderr, flush=True)

    def tick(snap) -> None:
        if snap.status is RunStatus.QUEUED and baseline_id:  # it waits for the baseline (the same device)
            base = orch.snapshot(baseline_id)
            if base is not None:
                progress("baseline: ", base)
        progress("", snap)

    snap = orch.wait(job_id, on_tick=tick)
    result = orch.eval_result(job_id)
    if snap.status is not RunStatus.COMPLETED or result is None or result.metrics is None:
        print(f"eval {snap.status.value}" + (f": {snap.error}" if snap.error else ""), file=sys.stderr)
        return EXIT.get(snap.status, 1)
    baseline = orch.eval_baseline(result) if baseline_id else None
    base_metrics = baseline.metrics if baseline is not None and baseline.status is RunStatus.COMPLETED else None
    if as_json:
        print(json.dumps({**result.metrics, "job_id": job_id, "baseline": base_metrics}, sort_keys=True))
        return 0
    for key in SHOWN:
        if key not in result.metrics:
            continue
        value = result.metrics[key]
        line = f"{key:<11} {_num(value)}"
        base = (base_metrics or {}).get(key)
        if base is not None and value is not None:
            line += f"   base {_num(base)}   delta {value - base:+.4f}"
        print(line)
    print(f"{'samples':<11} {result.metrics.get('samples', 0)}")
    for task, values in (result.metrics.get("lm_eval") or {}).items():
        print(f"lm-eval {task}: " + ", ".join(f"{k} {_num(v)}" for k, v in values.items()))
    return 0


def _num(value) -> str:
    return "—" if value is None else f"{value:.4f}"
