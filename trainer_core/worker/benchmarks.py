"""lm-evaluation-harness tasks on the eval job's loaded model (its HF backend, ``HFLM``, wrapping the model
already in memory: an adapter stays applied, nothing is loaded twice). Tasks are names from lm-eval's
registry (online: their datasets come from the hub) or local task YAML files (offline with local data).
Worker-only: imports lm_eval (the ``eval`` extra)."""
from __future__ import annotations

import math
from pathlib import Path

import yaml

from trainer_core.evaluation.spec import EvalSpec


def task_names(tasks: list[str]) -> tuple[list[str], list[str]]:
    """(names to run, folders to include): a YAML file contributes its ``task`` name and its folder."""
    names, folders = [], []
    for task in tasks:
        if task.endswith((".yaml", ".yml")):
            path = Path(task).expanduser().resolve()
            config = yaml.safe_load(path.read_text()) or {}
            if not isinstance(config, dict) or not isinstance(config.get("task"), str):
                raise ValueError(f"lm_eval_tasks: {task} has no 'task: <name>' line, so lm-eval cannot name it")
            names.append(config["task"])
            folders.append(str(path.parent))
        else:
            names.append(task)
    return names, list(dict.fromkeys(folders))


def run_tasks(spec: EvalSpec, model, tokenizer, log=print) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} from ``lm_eval.simple_evaluate``."""
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise ImportError("lm_eval_tasks need lm-evaluation-harness: pip install 'finetune-studio[eval]' "
                          "(or pip install lm-eval)") from exc
    names, folders = task_names(spec.lm_eval_tasks)
    log(f"lm-eval: tasks {', '.join(names)}" + (f" (local definitions in {', '.join(folders)})" if folders else ""))
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1)
    results = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=TaskManager(include_path=folders or None),
                                      limit=spec.lm_eval_limit or None, random_seed=spec.seed,
                                      numpy_random_seed=spec.seed, torch_random_seed=spec.seed,
                                      fewshot_random_seed=spec.seed, log_samples=False)
    tokenizer.padding_side = padding_side
    scores: dict[str, dict[str, float]] = {}
    for task, values in (results or {}).get("results", {}).items():
        scores[task] = {metric: float(value) for metric, value in values.items()
                        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
    return scores
