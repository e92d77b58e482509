"""Engine choice, made in one place. Importing this package does not import torch."""
from __future__ import annotations

from trainer_core import hardware

UNSLOTH = "unsloth"
TRANSFORMERS = "transformers"


def choose_engine() -> str:
    """Unsloth when CUDA and the ``gpu`` extra are present; transformers + peft + trl everywhere else."""
    return UNSLOTH if hardware.unsloth_usable() else TRANSFORMERS
