"""What a data recipe adds to its teacher: rows per second of a recipe job against the teacher's own throughput.

    .venv/bin/python bench/recipe_overhead.py [--rows 200] [--parallel 4] [--delay 0.05]

The teacher is the test support's deterministic OpenAI-compatible server (tests/support/fake_teacher.py), each answer
taking ``--delay`` seconds, as a model's generation would. Measured side by side in one run:

* bare: the recipe's own prompts (the ``docs-qa`` starter's, rendered for each chunk) sent straight to the teacher by
  ``--parallel`` threads: requests per second and output tokens per second, the ceiling any client reaches;
* recipe: the same number of records through a recipe job (orchestrator, sandboxed worker, Data Designer's child in
  its venv with ``max_parallel_requests`` = ``--parallel``, validation, duplicate removal, publishing): records per
  second from the worker's start to its last batch (its progress events), and the job's wall time end to end.

The ratio recipe ÷ bare is the recipe's efficiency (1.0: no overhead over the teacher).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bare(url: str, prompts: list[str], parallel: int) -> tuple[float, float]:
    """(requests/s, output tokens/s) of the prompts sent straight to the teacher."""
    def ask(prompt: str) -> int:
        body = json.dumps({"model": "teacher", "messages": [{"role": "user", "content": prompt}]}).encode()
        request = urllib.request.Request(url + "/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["usage"]["completion_tokens"]

    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        tokens = sum(pool.map(ask, prompts))
    elapsed = time.perf_counter() - started
    return len(prompts) / elapsed, tokens / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per teacher answer")
    parser.add_argument("--batch", type=int, default=20, help="the recipe's batch_size")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="recipe-bench-"))
    os.environ.update(FINETUNE_STUDIO_HOME=str(home / "home"), FINETUNE_STUDIO_FORCE_CPU="1",
                      FINETUNE_STUDIO_ALLOWED_ROOTS=str(home), FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE="1")

    from db.store import Store
    from tests.support.fake_teacher import FakeTeacher, fact_files
    from trainer_core.jobs.orchestrator import Orchestrator
    from trainer_core.protocol.status import RunStatus
    from trainer_core.recipes import launch, starters, store

    fact_files(home / "docs", min(args.rows, 128))
    fields = starters.spec_fields("docs-qa")
    prompt = fields["recipe"]["columns"][0]["prompt"]
    chunks = sorted((home / "docs").glob("*.md"))
    prompts = [prompt.replace("{{ source }}", p.name).replace("{{ chunk }}", "0")
               .replace("{{ text }}", p.read_text().strip()) for p in chunks]
    prompts = [prompts[i % len(prompts)] for i in range(args.rows)]
    with FakeTeacher() as teacher:
        teacher.delay_s = args.delay
        bare_rps, bare_tps = bare(teacher.url, prompts, args.parallel)
        orch = Orchestrator(Store())
        try:
            spec = launch.from_fields({**fields, "documents": str(home / "docs"), "num_rows": args.rows,
                                       "batch_size": args.batch, "dataset_name": "bench", "dedupe": False,
                                       "models": [{"alias": "teacher", "url": teacher.url, "model": "teacher",
                                                   "max_parallel_requests": args.parallel}]})
            began = time.perf_counter()
            job_id = launch.start(orch, spec)
            snap = orch.wait(job_id, timeout=3600)
            wall = time.perf_counter() - began
        finally:
            orch.close()
    if snap.status is not RunStatus.COMPLETED:
        print(f"the recipe job ended {snap.status.value}: {snap.error}", file=sys.stderr)
        return 1
    progress = [json.loads(line) for line in (home / "home" / "runs" / job_id / "events.jsonl").read_text()
                .splitlines() if '"progress"' in line]
    made = progress[-1]["step"]
    generating = progress[-1]["elapsed_s"]  # from the worker's start of generation: Data Designer's start included
    recipe_rps = made / generating
    first, last = progress[0], progress[-1]  # the steady rate: between the first batch and the last
    steady = (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"]) if len(progress) > 1 else 0.0
    (version,) = store.published()
    print(f"teacher: {args.delay * 1000:.0f} ms per answer, {args.parallel} in parallel; {args.rows} records")
    print(f"bare     {bare_rps:8.2f} requests/s  {bare_tps:9.1f} output tokens/s")
    print(f"recipe   {recipe_rps:8.2f} records/s   (generation: {generating:.1f} s; job end to end: {wall:.1f} s; "
          f"{version.card['kept']} rows published)")
    print(f"steady   {steady:8.2f} records/s   (first batch to last)")
    print(f"ratio recipe ÷ bare: {recipe_rps / bare_rps:.2f}; steady {steady / bare_rps:.2f}; "
          f"end to end {made / wall / bare_rps:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
