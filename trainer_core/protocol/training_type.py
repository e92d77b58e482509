"""``training_type``: the one field that named both objective and adapter before they were split into
``method`` and ``adapter``. Old presets, run folders (config.yaml), database rows (config_json) and scripts
still carry it; this is the one mapping onto (method, adapter), with the standard library only so that the
store can read old rows with it too."""
from __future__ import annotations

import json
from typing import Any

TRAINING_TYPES = {"lora": "LoRA", "qlora": "QLoRA (4-bit)", "full": "Full fine-tuning", "cpt": "Continued pretraining"}
DEFAULT_PAIR = ("sft", "lora")


def pair(training_type: str, use_lora: bool = True) -> tuple[str, str]:
    """(method, adapter) for an old ``training_type``. Continued pretraining trained LoRA adapters unless
    use_lora was off; 4-bit loading stays the separate load_in_4bit switch it always was."""
    if training_type == "cpt":
        return "cpt", "lora" if use_lora else "full"
    return "sft", training_type


def pair_of_config(data: dict[str, Any]) -> tuple[str, str]:
    """(method, adapter) of a config as stored, old or new (a run's config_json, a config.yaml)."""
    if data.get("method"):
        return str(data["method"]), str(data.get("adapter") or DEFAULT_PAIR[1])
    if data.get("training_type") in TRAINING_TYPES:
        return pair(data["training_type"], data.get("use_lora", True) is not False)
    return DEFAULT_PAIR


def pair_of_config_json(text: str | None) -> tuple[str, str] | None:
    """The pair of a stored config_json; None when there is no config to read (empty, "{}" or not JSON)."""
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return None
    return pair_of_config(data) if isinstance(data, dict) and data else None
