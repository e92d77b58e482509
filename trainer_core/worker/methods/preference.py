"""What the preference methods' worker halves share (DPO, ORPO, SimPO, KTO, reward): rows as TRL's
trainers take them, the chat template applied by the trainer, and the one place that imports
``trl.experimental`` (ORPO and CPO/SimPO live there in TRL 1.16; an API that may move, so it is imported
here only, with the fix in the message)."""
from __future__ import annotations

from typing import Any

from datasets import Dataset

from trainer_core.config import TrainConfig

PAIR_COLUMNS = ("prompt", "chosen", "rejected")
KTO_COLUMNS = ("prompt", "completion", "label")


def shape_rows(rows: list[dict], cfg: TrainConfig) -> tuple[list[dict], dict[str, int]]:
    """The loader already gave rows in TRL's shape (trainer_core.data.preference); nothing is dropped here."""
    return rows, {}


# Text prompts become conversations when the model has a chat template (as_conversational): the worker renders
# the run's sample prompts the same way (train.rows_are_chat). The preference halves re-export it.
TEXT_PROMPTS_AS_CHAT = True


def as_conversational(ds: Dataset | None, tokenizer, columns: tuple[str, ...]) -> Dataset | None:
    """Text rows for a model with a chat template become one user turn and one assistant turn, as SFT does
    with alpaca rows: an instruct model then learns its answers in the format it is prompted with."""
    if ds is None or not getattr(tokenizer, "chat_template", None) or not len(ds):
        return ds
    if not isinstance(ds[0]["prompt"], str):
        return ds
    answers = [c for c in columns if c != "prompt" and c != "label"]

    def convert(row: dict) -> dict:
        out = {"prompt": [{"role": "user", "content": row["prompt"]}]}
        for column in answers:
            out[column] = [{"role": "assistant", "content": row[column]}]
        return out

    return ds.map(convert)


def common_args(cfg: TrainConfig, args: dict[str, Any]) -> dict[str, Any]:
    """The engine's shared TrainingArguments plus what every preference config takes the same way."""
    return {**args, "max_length": cfg.max_seq_length, "dataset_num_proc": 1}


def experimental(name: str):
    """``trl.experimental.<orpo|cpo>``'s config and trainer classes, or an ImportError saying what to install."""
    import importlib
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # we know; the warning would repeat in every run log
    try:
        module = importlib.import_module(f"trl.experimental.{name}")
    except ImportError as exc:
        raise ImportError(f"this TRL has no trl.experimental.{name} ({exc}); the studio is tested with trl 1.16: "
                          "pip install 'trl==1.16.*'") from None
    prefix = name.upper()
    return getattr(module, f"{prefix}Config"), getattr(module, f"{prefix}Trainer")


# ---------------------------------------------------------------------- preview
def _ids(tokenizer, prompt: Any, answer: Any | None) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) as the trainer tokenizes a side: the chat template over the conversation for
    conversational rows (the prompt with its generation prompt), plain text plus EOS otherwise."""
    if isinstance(prompt, list):
        head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
        head_ids = list(head["input_ids"])
        if answer is None:
            return head_ids, []
        whole = tokenizer.apply_chat_template(prompt + list(answer), tokenize=True, return_dict=True)
        whole_ids = list(whole["input_ids"])
        shared = 0
        while shared < min(len(head_ids), len(whole_ids)) and head_ids[shared] == whole_ids[shared]:
            shared += 1
        return whole_ids[:shared], whole_ids[shared:]
    head_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    if answer is None:
        return head_ids, []
    tail = tokenizer(answer, add_special_tokens=False)["input_ids"]
    return head_ids, tail + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])


def _rendered(tokenizer, index: int, label: str, prompt_ids: list[int], answer_ids: list[int], limit: int):
    from trainer_core.data.preview import RenderedRow

    total = len(prompt_ids) + len(answer_ids)
    kept_prompt = prompt_ids[:limit]
    kept_answer = answer_ids[:max(0, limit - len(kept_prompt))]
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    segments = tuple(seg for seg in ((decode(kept_prompt), False), (decode(kept_answer), True)) if seg[0])
    return RenderedRow(index=index, text="".join(t for t, _ in segments), segments=segments, num_tokens=total,
                       truncated=total > limit, label=label)


def _sides(row: dict) -> list[tuple[str, Any]]:
    """(label, answer) for each side the trainer scores: chosen and rejected, a labelled completion, or
    the prompt alone (GRPO: the model writes the answers itself)."""
    if "chosen" in row:
        return [("chosen", row["chosen"]), ("rejected", row["rejected"])]
    if "completion" in row:
        return [("good answer" if row["label"] else "bad answer", row["completion"])]
    extra = ", ".join(f"{k}={str(v)[:60]!r}" for k, v in row.items() if k != "prompt")
    return [(f"prompt (rewards also get: {extra})" if extra else "prompt", None)]


def preview(cfg: TrainConfig, data, tokenizer, rows_shown: int, tokenizer_label: str):
    """The New run preview of a preference/RL run: each pair side by side as each side is tokenized (prompt
    masked, each side's token count and truncation), or for GRPO the prompt as the model sees it."""
    from trainer_core.host import parallel
    from trainer_core.data.preview import Preview

    rows = data.rows
    shown, lengths = [], []
    truncated = tokens = trained = 0
    limit = cfg.max_seq_length
    for index, row in enumerate(rows):
        prompt = row["prompt"]
        if isinstance(prompt, str) and getattr(tokenizer, "chat_template", None):
            prompt = [{"role": "user", "content": prompt}]  # as_conversational does the same for the trainer
        for label, answer in _sides(row):
            if isinstance(answer, str) and isinstance(prompt, list):
                answer = [{"role": "assistant", "content": answer}]
            prompt_ids, answer_ids = _ids(tokenizer, prompt, answer)
            total = len(prompt_ids) + len(answer_ids)
            lengths.append(total)
            truncated += total > limit
            tokens += min(total, limit)
            trained += max(0, min(total, limit) - len(prompt_ids))
            if index < rows_shown:
                shown.append(_rendered(tokenizer, index, label, prompt_ids, answer_ids, limit))
    processes = parallel.process_count(cfg)
    return Preview(
        format=data.train.format, format_reason=data.train.reason, tokenizer=tokenizer_label, rows=tuple(shown),
        lengths=tuple(lengths), max_seq_length=limit, truncated=truncated, dropped=dict(data.train.dropped),
        total_rows=len(rows), total_tokens=tokens, trained_tokens=trained,
        steps_per_epoch=parallel.steps_per_epoch(len(rows), cfg.batch_size, cfg.gradient_accumulation_steps,
                                                 processes),
        eval_rows=len(data.eval_rows), processes=processes, global_batch=parallel.global_batch(cfg, processes))
