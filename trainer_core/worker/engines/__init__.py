"""Engine choice, made in one place. Importing this package does not import torch."""
from __future__ import annotations

import os

from trainer_core.host import hardware

UNSLOTH = "unsloth"
TRANSFORMERS = "transformers"
# "transformers" here trains with the transformers engine even where Unsloth is usable (to compare the engines, or
# to avoid Unsloth on a model it mistrains); unset or any other value: the choice below.
ENGINE_ENV = "FINETUNE_STUDIO_ENGINE"


class UnslothCannotLoad(RuntimeError):
    """Unsloth could not load this model; the worker says so and trains with the transformers engine."""


def choose_engine(processes: int = 1, vision: bool = False, continues_adapter: bool = False) -> str:
    """Unsloth when CUDA and the ``gpu`` extra are present and the run trains on one process (Unsloth pins
    its model to one GPU): FastLanguageModel for text, FastVisionModel for vision-language models (``vision``);
    transformers + peft + trl everywhere else, data-parallel runs included, and for a run that continues a saved
    adapter (``init_adapter``: Unsloth's get_peft_model starts new adapters; peft loads a saved one trainable)."""
    if os.environ.get(ENGINE_ENV) == TRANSFORMERS or continues_adapter:
        return TRANSFORMERS
    return UNSLOTH if processes == 1 and hardware.unsloth_usable() else TRANSFORMERS
