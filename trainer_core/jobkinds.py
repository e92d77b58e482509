"""Imports the spec module of every non-training job kind, so ``jobspec.read_spec`` knows their classes.
A new kind adds its spec module here, its worker entry point to ``worker.ENTRY_POINTS`` and its event
handlers to ``jobs.pump.HANDLERS``."""
from __future__ import annotations

import trainer_core.export.spec  # noqa: E402,F401  (ExportSpec)
