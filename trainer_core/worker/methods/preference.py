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
