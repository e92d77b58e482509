"""Dataset files in, one trainable shape out.

Every supported layout (alpaca, chatml, sharegpt, raw text) becomes either chat rows
``{"messages": [{"role": ..., "content": ...}, ...]}`` or text rows ``{"text": ...}``:

- ``sources``: which files a config entry names (paths kept inside the allowed roots, the bundled demo,
  uploads saved under the data root);
- ``readers``: rows out of .jsonl/.json/.csv/.parquet files;
- ``formats``: column mapping, format detection and the converters to the trainer's shape;
- ``loading``: several files (or a hub split) read, sliced, checked and split into train/eval rows;
- ``fingerprint``: a hash of the data a run reads, so Resume can refuse changed files.

Problems are raised as ``DatasetError(field, message)`` so the form can show them next to the field
that fixes them. The dashboard imports this package: no torch, transformers or Hugging Face ``datasets``
at module level (``loading.load_hub`` imports ``datasets`` itself and only runs in the worker).
"""
from __future__ import annotations


class DatasetError(ValueError):
    """A dataset problem, naming the config field that fixes it."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def quoted(names: list[str]) -> str:
    """'a', 'b' and 'c' (at most 20 names shown)."""
    if not names:
        return "(none)"
    shown = [f"'{n}'" for n in names[:20]]
    if len(names) > 20:
        return ", ".join(shown) + f" and {len(names) - 20} more"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + f" and {shown[-1]}"
