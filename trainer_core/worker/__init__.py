"""The worker side: the only package that imports torch, transformers, peft, trl, unsloth and Hugging Face
datasets. One process per job, started as ``python -m trainer_core.worker RUN_DIR``; it picks the entry
point of the job's kind (its row of ``trainer_core.protocol.status.JOB_KINDS``, the one table of job kinds).

Importing this package (or ``worker.engines``) imports no part of the ML stack: entry points import it
when they run.
"""
from __future__ import annotations

from trainer_core.protocol.status import JOB_KINDS, JobKind

ENTRY_POINTS: dict[JobKind, str] = {kind: entry.worker for kind, entry in JOB_KINDS.items()}
