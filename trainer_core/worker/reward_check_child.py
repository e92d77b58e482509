"""The reward check's child process: ``python -m trainer_core.worker.reward_check_child`` reads
{"config", "rows", "generations"} on stdin and writes one JSON line: each reward's scores on a few real rows.

Completions are the data's own reference answers (an ``answer``/``completion``/``chosen`` column, where one
holds text) and, with ``generations`` > 0, that many sampled answers of the base model per prompt. Every
reward runs on the same completions; an exception is kept with its message and the traceback line in the
reward's file, so the form can show where it broke. User code runs here, in a child process, never in the
dashboard (trainer_core.rewards.check decides who may start it)."""
from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from trainer_core.config import ConfigError, TrainConfig
from trainer_core.data import DatasetError
from trainer_core.data.loading import load_for_training
from trainer_core.methods.grpo import rewards_of
from trainer_core.rewards.builtin import completion_text
from trainer_core.rewards.guard import RewardError, guard
from trainer_core.rewards.spec import RewardSpec

REFERENCE_COLUMNS = ("answer", "completion", "chosen", "solution", "output")


def _references(rows: list[dict]) -> list[tuple[int, Any, str]]:
    """(row index, completion, where it came from) for rows with a reference answer."""
    out = []
    for index, row in enumerate(rows):
        for column in REFERENCE_COLUMNS:
            value = row.get(column)
            if isinstance(value, str) and value.strip() or isinstance(value, list) and value:
                out.append((index, value, f"reference ({column})"))
                break
    return out


def _generate(cfg: TrainConfig, rows: list[dict], per_prompt: int) -> list[tuple[int, Any, str]]:
    import torch
    from transformers import AutoModelForCausalLM

    from trainer_core.worker import model_files, token_cache

    s = cfg.method_settings
    model_ref = model_files.resolve_model(cfg, log=lambda m: print(m, file=sys.stderr))
    tokenizer = token_cache.load_tokenizer(cfg, model_ref, None)
    model = AutoModelForCausalLM.from_pretrained(model_ref, dtype=torch.float32)
    torch.manual_seed(cfg.random_seed)
    out = []
    for index, row in enumerate(rows):
        prompt = row["prompt"]
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]
        else:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            generated = model.generate(ids, do_sample=True, temperature=s.temperature, top_p=s.top_p,
                                       max_new_tokens=s.max_completion_length, num_return_sequences=per_prompt,
                                       pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        for seq in generated:
            text = tokenizer.decode(seq[ids.shape[1]:], skip_special_tokens=True)
            completion = [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
            out.append((index, completion, "base model"))
    return out


def _error_line(exc: BaseException, spec: RewardSpec) -> str:
    """What went wrong, for the reward's own row: the reward's exception as it raised it, or what the guard found
    (an exit, a wrong return, too many non-finite scores), with the line in the reward's file where there is one."""
    shown = exc.__cause__ or exc.__context__ if isinstance(exc, RewardError) else exc
    if isinstance(exc, RewardError) and not (isinstance(shown, Exception) and not isinstance(shown, MemoryError)):
        text = exc.reason  # names no reward: the row does
    else:
        text = f"{type(shown).__name__}: {str(shown)[:500]}"
    frames = traceback.extract_tb(shown.__traceback__) if shown is not None else []
    mine = [f for f in frames
            if spec.kind == "python" and f.filename.endswith(".py") and "trainer_core" not in f.filename]
    frame = (mine or frames or [None])[-1]
    where = f" (line {frame.lineno}: {frame.line})" if frame is not None else ""
    return f"{text}{where}"


def _functions(specs: list[RewardSpec], alerts: dict[str, list[str]]) -> list:
    """Each reward, guarded as in training (its warnings into ``alerts``), or the exception that loading raised."""
    from pathlib import Path

    from trainer_core.rewards import files
    from trainer_core.worker.methods import grpo

    out = []
    for spec in specs:
        warn = alerts.setdefault(spec.name, []).append
        try:
            if spec.kind == "python":
                path, problem = files.source_problem(spec)
                if problem:
                    raise ValueError(problem)
                out.append(guard(grpo.load_function(Path(path), spec), spec.name, warn))
            else:
                out.append(grpo.guarded([spec], grpo.reward_functions([spec], Path("."), None), warn)[0])
        except Exception as exc:  # noqa: BLE001 - a reward that cannot load is the check's finding
            out.append(exc)
    return out


def check(cfg: TrainConfig, rows_wanted: int, generations: int) -> dict[str, Any]:
    data = load_for_training(cfg)
    rows = data.rows[:rows_wanted]
    completions = _references(rows) + (_generate(cfg, rows, generations) if generations else [])
    if not completions:
        return {"errors": [{"field": "reward_check", "message": "no completions to score: the rows hold no "
                                                                "reference answers and no generations were asked"}]}
    specs = rewards_of(cfg)
    prompts = [rows[i]["prompt"] for i, _, _ in completions]
    texts = [c for _, c, _ in completions]
    columns = {key: [rows[i].get(key) for i, _, _ in completions]
               for key in dict.fromkeys(k for row in rows for k in row if k != "prompt")}
    results, alerts = [], {}
    for spec, fn in zip(specs, _functions(specs, alerts)):
        entry: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "weight": spec.weight, "scores": [],
                                 "error": None}
        if isinstance(fn, BaseException):
            entry["error"] = _error_line(fn, spec)
        else:
            try:  # the guard checks what comes back: one finite float (or None) per completion
                entry["scores"] = fn(prompts, texts, **columns)
            except Exception as exc:  # noqa: BLE001 - the user's reward raising is what the check is for
                entry["error"] = _error_line(exc, spec)
        entry["alerts"] = alerts[spec.name]
        results.append(entry)
    samples = [{"row": i, "source": source, "prompt": completion_text(rows[i]["prompt"])[-500:],
                "completion": completion_text(c)[:1000]} for i, c, source in completions]
    return {"rewards": results, "samples": samples}


def main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        cfg = TrainConfig.from_dict(request["config"])
        reply = check(cfg, int(request.get("rows", 4)), int(request.get("generations", 0)))
    except ConfigError as exc:
        reply = {"errors": [{"field": e.field, "message": e.message} for e in exc.errors]}
    except DatasetError as exc:
        reply = {"errors": [{"field": exc.field, "message": exc.message}]}
    except Exception as exc:  # noqa: BLE001 - process boundary: report it; the traceback goes to stderr
        traceback.print_exc()
        reply = {"errors": [{"field": "reward_check", "message": f"the check failed: {type(exc).__name__}: {exc}"}]}
    print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
