"""The worker side: the only package that imports torch, transformers, peft, trl, unsloth and Hugging Face
datasets. One process per job, started as ``python -m trainer_core.worker RUN_DIR``; it picks the entry
point of the job's kind below. A new kind of job is a module here with ``main(run_dir) -> int``, its event
handlers in trainer_core.jobs.pump and its page.

Importing this package (or ``worker.engines``) imports no part of the ML stack: entry points import it
when they run.
"""
from __future__ import annotations

from trainer_core.protocol.status import JobKind

ENTRY_POINTS: dict[JobKind, str] = {
    JobKind.TRAIN: "trainer_core.worker.train",
    JobKind.SERVE: "trainer_core.worker.serve",
    JobKind.EVAL: "trainer_core.worker.evaluate",
    JobKind.EXPORT: "trainer_core.worker.export",
}
