"""A model folder's JSON files, read once per version of them (dashboard side: no ML imports): the one read of a
model's config.json that its kind (trainer_core.kinds), its modality and model_info's facts share."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from trainer_core.kinds.base import Facts

FIELD = "model_name"
_lock = threading.Lock()


class ModelInfoError(ValueError):
    """A model that cannot be inspected; the message says what to do."""

    def __init__(self, message: str, field: str = FIELD):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def read_json(path: Path, missing_ok: bool = False) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise ModelInfoError(f"{path} is missing: point at a Hugging Face model folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelInfoError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelInfoError(f"{path} does not hold a JSON object")
    return data


def mtime(path: Path | None) -> int:
    try:
        return path.stat().st_mtime_ns if path else 0
    except OSError:
        return 0


# Files of a model folder that decide a kind by their presence (kinds.base.Facts.files)
MARKER_FILES = ("modules.json",)
_FACT_FILES = ("config.json", "preprocessor_config.json", "processor_config.json", *MARKER_FILES)
_facts: dict[tuple, Facts] = {}


def folder_facts(folder: Path) -> Facts:
    """A model folder's JSON files (config.json, the merged (pre)processor config) and marker files, read once per
    version of them: the one read of a model's config that the model kind, the modality and these facts share."""
    key = (str(folder), *(mtime(folder / f) for f in _FACT_FILES))
    with _lock:
        if key in _facts:
            return _facts[key]
    facts = Facts(read_json(folder / "config.json"),
                  {**read_json(folder / "preprocessor_config.json", missing_ok=True),
                   **read_json(folder / "processor_config.json", missing_ok=True)},
                  frozenset(f for f in MARKER_FILES if (folder / f).is_file()))
    with _lock:
        _facts[key] = facts
    return facts
