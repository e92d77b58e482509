"""``python -m trainer_core.worker.recipe_preview SPEC OUT``: a handful of a recipe's records generated and checked as
the job would (seeds, endpoints, Data Designer's preview in its venv, the output template, validators, duplicates),
without a job. Run by the dashboard and the CLI in the sandbox (a Python validator is user code); writes
``OUT/preview.json``: the rows with their source, verdict and judge scores, and the estimate for the full job."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainer_core.recipes.checking import Checker, RecipeError, endpoints, judge_scores, prepare_seeds
from trainer_core.recipes.spec import RecipeSpec
from trainer_core.worker.recipe import CHILD, DD_VENV_ENV, child_env, dd_python

RESULT = "preview.json"
WAIT_S = float(os.environ.get("FINETUNE_STUDIO_TEACHER_WAIT_S", "900"))


def preview(spec: RecipeSpec, out: Path, rows: int) -> dict:
    warnings: list[str] = []
    seeds = prepare_seeds(spec, out, warnings.append)
    providers, model_configs, keys = endpoints(spec, out, WAIT_S, lambda: None)  # the dashboard's timeout ends it
    config = dict(spec.recipe)
    config["model_configs"] = model_configs
    if seeds is not None:
        config["seed_config"] = {"source": {"seed_type": "local", "path": str(seeds)}, "sampling_strategy": "ordered"}
    plan = out / "plan.json"
    plan.write_text(json.dumps({"config": config, "providers": providers, "num_records": rows,
                                "buffer_size": rows, "artifact_path": str(out / "dd"), "dataset_name": "preview"}))
    python = dd_python()
    if not python.is_file():
        raise RecipeError(f"NeMo Data Designer is not installed: run `make install` (.venv-dd/), or set {DD_VENV_ENV}")
    result = out / "records.json"
    done = subprocess.run([str(python), str(CHILD), "preview", str(plan), str(result)], capture_output=True,
                          text=True, env=child_env(keys), cwd=out, timeout=WAIT_S)
    if done.returncode != 0 or not result.is_file():
        said = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        message = next((m.get("message") for m in said if m.get("event") == "error"), "") or done.stderr[-1500:]
        raise RecipeError(f"recipe: {message}")
    generated = json.loads(result.read_text())
    checker = Checker(spec, out)
    try:
        shown = _checked(checker, generated["rows"])
    finally:
        checker.close()
    made = max(1, len(generated["rows"]))
    per_row_s = generated["elapsed_s"] / made
    tokens = (generated["tokens_in"] + generated["tokens_out"]) / made
    return {"rows": shown, "asked": rows, "made": len(generated["rows"]), "elapsed_s": generated["elapsed_s"],
            "tokens_in": generated["tokens_in"], "tokens_out": generated["tokens_out"],
            "teacher_problems": generated.get("problems", []), "warnings": warnings,
            "estimate": {"rows": spec.num_rows, "seconds": per_row_s * spec.num_rows, "tokens": tokens * spec.num_rows,
                         "kept_share": sum(1 for s in shown if s["row"] is not None) / made}}


def _checked(checker: Checker, records: list[dict]) -> list[dict]:
    shown = []
    for i, record in enumerate(records):
        row, reason = checker.check(record, f"preview record {i}")
        shown.append({"record": record, "row": row, "reason": reason,
                      "source": {k: record.get(k) for k in ("source", "page", "chunk") if k in record},
                      "scores": {f"{c}.{k}": v for (c, k), v in judge_scores(record, checker.judges).items()}})
    return shown


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainer_core.worker.recipe_preview SPEC_JSON OUT_DIR", file=sys.stderr)
        return 64
    out = Path(argv[1])
    try:
        data = json.loads(Path(argv[0]).read_text())
        rows = int(data.pop("_preview_rows", 5))
        spec = RecipeSpec.from_dict(data)
        found = preview(spec, out, rows)
    except (RecipeError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        (out / RESULT).write_text(json.dumps({"error": str(exc)}))
        return 1
    (out / RESULT).write_text(json.dumps(found, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
