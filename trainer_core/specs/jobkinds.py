"""Imports the settings module of every job kind (its row of ``trainer_core.protocol.status.JOB_KINDS``), so
``jobspec.read_spec`` knows their spec classes."""
from __future__ import annotations

import importlib

from trainer_core.protocol.status import JOB_KINDS

for _entry in JOB_KINDS.values():
    importlib.import_module(_entry.settings)
