"""``python -m trainer_core.kinds [--write]``: print docs/model-kinds.md from the registry, or write it."""
from __future__ import annotations

import sys
from pathlib import Path

from trainer_core.kinds.docs import DOC_PATH, markdown

if __name__ == "__main__":
    page = markdown()
    if "--write" in sys.argv[1:]:
        target = Path(__file__).resolve().parents[2] / DOC_PATH
        target.write_text(page, encoding="utf-8")
        print(f"wrote {target}")
    else:
        sys.stdout.write(page)
