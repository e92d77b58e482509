"""Engine choice, made in one place. Importing this package does not import torch."""
from __future__ import annotations

from trainer_core.planning import hardware

UNSLOTH = "unsloth"
TRANSFORMERS = "transformers"


def choose_engine(processes: int = 1, vision: bool = False) -> str:
    """Unsloth when CUDA and the ``gpu`` extra are present and the run trains on one process (Unsloth pins
    its model to one GPU); transformers + peft + trl everywhere else, data-parallel runs included, and for
    vision-language models (the Unsloth engine here loads text models only: FastVisionModel is not wired)."""
    return UNSLOTH if processes == 1 and not vision and hardware.unsloth_usable() else TRANSFORMERS
