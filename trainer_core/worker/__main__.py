"""``python -m trainer_core.worker RUN_DIR``: run the job in RUN_DIR with the entry point of its kind."""
from __future__ import annotations

import importlib
import sys

from trainer_core.protocol import paths
from trainer_core.protocol.status import read_kind
from trainer_core.worker import ENTRY_POINTS


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainer_core.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = paths.resolve_inside(argv[1], [paths.runs_dir()])
    try:
        kind = read_kind(run_dir)
    except ValueError as exc:  # process boundary: the job cannot run; worker.log says why
        print(exc, file=sys.stderr)
        return 2
    return importlib.import_module(ENTRY_POINTS[kind]).main(run_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
