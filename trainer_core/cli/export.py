"""``python -m trainer_core export RUN [--checkpoint STEP] --to adapter|merged|gguf [--quant q8_0] [-o DIR]
[--verify] [--push REPO_ID [--update-existing]]``: an export job, followed to its end; prints the artifact paths.

Exit codes as for ``run``: 0 completed, 1 failed, 2 invalid or refused, 3 stopped or cancelled."""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Callable

from trainer_core.auth.access import Actor, Role
from trainer_core.config import ConfigError
from trainer_core.export import tools
from trainer_core.export.spec import TARGETS, ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

EXIT = {RunStatus.COMPLETED: 0, RunStatus.FAILED: 1, RunStatus.STOPPED: 3, RunStatus.CANCELLED: 3}


def add_parser(sub) -> argparse.ArgumentParser:
    export = sub.add_parser("export", help="export a run's model: adapter zip, merged weights, GGUF (+ Ollama "
                                           "Modelfile), ONNX (embedding runs), with a model card; prints the "
                                           "artifact paths")
    export.add_argument("run", help="run id, unique id prefix, or name (as for `runs show`)")
    export.add_argument("--checkpoint", type=int, metavar="STEP", help="export checkpoint-STEP, not the final model")
    export.add_argument("--to", action="append", required=True, metavar="TARGET",
                        help=f"{' | '.join(TARGETS)}; repeat or comma-separate for several")
    export.add_argument("--quant", action="append", metavar="TYPE",
                        help=f"GGUF type(s) (default q8_0); available here: {', '.join(tools.available_types())}")
    export.add_argument("--merged-dtype", default="bfloat16", choices=("bfloat16", "float16"))
    export.add_argument("-o", "--output", help="a new (or empty) folder for the artifacts, inside the exports/ "
                                               "folder of the data root or of an allowed root (default: the export "
                                               "job's folder, artifacts/)")
    export.add_argument("--verify", action="store_true", help="reload the exports and replay a prompt set greedily "
                                                              "next to the adapter")
    export.add_argument("--prompt-set", default="quick-check", help="the prompt set --verify replays")
    export.add_argument("--push", metavar="REPO_ID", help="push to this hub repo (private; token from HF_TOKEN)")
    export.add_argument("--public", action="store_true", help="with --push: a public repo")
    export.add_argument("--update-existing", action="store_true",
                        help="with --push: push into the repo even if it exists, when Finetune Studio created it (its "
                             "model card says so; an admin may update any repo); without it an existing repo is "
                             "refused")
    export.add_argument("--launcher", choices=("local", "ray"), default="local",
                        help="ray: a single-worker Ray job on the server's cluster (RAY_ADDRESS; docs/ray.md)")
    export.add_argument("--ray-gpus", type=float, default=0.0, metavar="N",
                        help="with --launcher ray: the GPUs Ray gives the job on its node (default 0: its CPU)")
    return export


def _split(values: list[str] | None) -> list[str]:
    return [v.strip().lower() for item in values or [] for v in item.split(",") if v.strip()]


def build_spec(args, run_id: str, actor: Actor | None = None) -> ExportSpec:
    output = ""
    if args.output:
        problem = paths.path_problem(args.output)
        # The worker runs in its job folder: a relative path is made absolute against this shell's folder.
        output = args.output if problem else str(Path(args.output).expanduser().absolute())
    return ExportSpec(source=ModelSource(run_id=run_id, checkpoint=args.checkpoint), targets=_split(args.to),
                      quantizations=_split(args.quant) or ["q8_0"], merged_dtype=args.merged_dtype, out_dir=output,
                      verify=args.verify, prompt_set=args.prompt_set, push_repo_id=args.push or "",
                      push_private=not args.public, push_update=args.update_existing,
                      push_update_any=args.update_existing and actor is not None and actor.role is Role.ADMIN,
                      launcher=args.launcher, ray_gpus_per_worker=args.ray_gpus)


def cmd_export(args, find: Callable, actor_for: Callable) -> int:
    from db.users import UnknownToken
    from trainer_core.jobs.orchestrator import Orchestrator, RunRefused

    orch = Orchestrator()
    try:
        run = find(orch.store, args.run)
        if run is None:
            return 2
        actor = actor_for(orch.store)
        job_id = orch.submit(build_spec(args, run.id, actor), actor=actor)
    except ConfigError as exc:
        orch.close()
        for error in exc.errors:
            print(f"error: {error.field}: {error.message}", file=sys.stderr)
        return 2
    except (RunRefused, UnknownToken) as exc:
        orch.close()
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    job = orch.store.get_run(job_id)
    if job is not None and RunStatus(job.status) is RunStatus.QUEUED:
        print(f"export job {job_id} queued for run {run.id}: it starts when the device is free (Ctrl-C cancels it)",
              file=sys.stderr)
    else:
        print(f"export job {job_id} started for run {run.id}", file=sys.stderr)
    previous = signal.signal(signal.SIGINT, lambda *_: orch.cancel(job_id))  # nothing half-written: cancel discards it
    try:
        snap = orch.wait(job_id)
    finally:
        signal.signal(signal.SIGINT, previous)
    artifacts = orch.artifacts(job_id=job_id)
    orch.close()
    if snap.status is RunStatus.FAILED:
        print(f"error: {snap.error}", file=sys.stderr)
        return 1
    for warning in snap.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for artifact in sorted(artifacts, key=lambda a: a.path):
        print(artifact.path)
    if snap.status is not RunStatus.COMPLETED:
        print(f"export {snap.status.label.lower()}", file=sys.stderr)
    return EXIT.get(snap.status, 1)
