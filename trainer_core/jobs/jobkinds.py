"""Imports the spec module of every non-training job kind, so ``jobspec.read_spec`` knows their classes.
A new kind adds its spec module here, its worker entry point to ``worker.ENTRY_POINTS`` and its event
handlers to ``jobs.pump.HANDLERS``."""
from __future__ import annotations

import trainer_core.serving.spec  # noqa: E402,F401  (serve)
from trainer_core.evaluation import spec as _eval_spec  # noqa: F401  (JobKind.EVAL)
import trainer_core.export.spec  # noqa: E402,F401  (ExportSpec)
