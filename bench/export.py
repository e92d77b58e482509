"""Export of the bundled model: merged and GGUF export time and output size, and the verify step's agreement.

    .venv/bin/python bench/export.py [--quant q8_0 --quant f16] [--prompt-set quick-check] [--tokens 24]

A LoRA adapter is built with PEFT on the bundled SmolLM2-135M-Instruct (tests/support/lora_runs.py: lora_run), then
one export job runs the real path: ``Orchestrator.submit(ExportSpec)`` -> worker subprocess -> events.jsonl ->
pump -> database. Stage times come from the job's own status events (the time from one stage's start to the
next's), sizes and agreement from the artifact and verify rows the pump stored. This process plays the
dashboard: it never imports torch. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make trainer_core, db and tests importable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", action="append", help="GGUF type(s) (default: q8_0 and f16)")
    parser.add_argument("--prompt-set", default="quick-check")
    parser.add_argument("--tokens", type=int, default=24, help="max new tokens per verify answer")
    parser.add_argument("--models", default=str(ROOT / ".test-cache" / "models"), help="converted-model cache")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-export-"))
    os.environ.update(FINETUNE_STUDIO_HOME=str(home / "home"), FINETUNE_STUDIO_MODELS=args.models,
                      FINETUNE_STUDIO_FORCE_CPU="1", FINETUNE_STUDIO_ALLOWED_ROOTS=f"{home}:{args.models}")
    os.environ.pop("DATABASE_URL", None)

    from tests.support.lora_runs import lora_run
    from trainer_core.config import BUNDLED_MODEL
    from trainer_core.export.spec import ExportSpec
    from trainer_core.jobs.orchestrator import Orchestrator
    from trainer_core.specs.model_source import ModelSource
    from trainer_core.protocol import events as ev, paths
    from trainer_core.protocol.status import RunStatus

    run = lora_run("20260101-000000-bench0", BUNDLED_MODEL)
    orch = Orchestrator()
    try:
        job_id = orch.submit(ExportSpec(source=ModelSource(run_id=run.name), targets=["merged", "gguf"],
                                        quantizations=args.quant or ["q8_0", "f16"], prompt_set=args.prompt_set,
                                        max_new_tokens=args.tokens))
        snap = orch.wait(job_id)
        if snap.status is not RunStatus.COMPLETED:
            print(f"export {snap.status.value}: {snap.error}\n{orch.log_tail(job_id)}", file=sys.stderr)
            return 1
        events, _ = ev.read_new(paths.run_dir(job_id) / ev.LOG_NAME, 0)
        marks = [(e.phase, e.ts) for e in events if e.kind == "status"] + \
            [("end", next(e.ts for e in events if e.kind == "complete"))]
        seconds = {phase: round(marks[i + 1][1] - ts, 1) for i, (phase, ts) in enumerate(marks[:-1])}
        sizes = {f"{a.kind} {a.detail}".strip(): a.size for a in orch.artifacts(job_id=job_id)
                 if a.kind in ("merged", "gguf")}
        verify = [e.message for e in orch.events(job_id) if e.kind == "verify"]
        print(json.dumps({"stage_seconds": seconds, "bytes": sizes, "verify": verify,
                          "load_average": os.getloadavg()}, indent=1))
    finally:
        orch.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
