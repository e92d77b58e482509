"""``python -m trainer_core.worker RUN_DIR``: run the job in RUN_DIR with the entry point of its kind, after taking
the job's secrets from its run folder when its launcher left them there (a Ray job: protocol/secret_file.py), with
its output to worker.log capped and redacted (worker/bounded_log.py)."""
from __future__ import annotations

import importlib
import os
import sys

from trainer_core.protocol import paths, secret_file, secrets
from trainer_core.protocol.status import read_kind
from trainer_core.worker import ENTRY_POINTS
from trainer_core.worker.bounded_log import BoundedOutput


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainer_core.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = paths.resolve_inside(argv[1], [paths.runs_dir()])
    try:
        # one of several ranks keeps the file for the others (and for ranks Ray Train restarts): its driver removes it
        taken = secret_file.load(run_dir, keep=int(os.environ.get("WORLD_SIZE", "1") or 1) > 1)
        if taken:
            print(f"Secrets {', '.join(taken)} taken from the run folder (never from Ray's job table)", file=sys.stderr)
        kind = read_kind(run_dir)
    except (ValueError, secret_file.SecretFileError) as exc:  # process boundary: the job cannot run; worker.log says why
        print(exc, file=sys.stderr)
        return 2
    # every job's output, its children's included, reaches worker.log capped and redacted (bounded_log.py says how)
    # (a torchrun rank's file is tailed into worker.log from its offset: cut back, it would go silent)
    output = BoundedOutput(secrets.job_secret_values(os.environ),
                           trim="TORCHELASTIC_RUN_ID" not in os.environ)
    try:
        return importlib.import_module(ENTRY_POINTS[kind]).main(run_dir)
    finally:
        output.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
