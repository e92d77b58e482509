"""The one method registry: name -> MethodSpec (dashboard halves; no ML imports).

Adding a method is its two halves (``trainer_core/methods/<name>.py`` and
``trainer_core/worker/methods/<name>.py``), its form section (the fields in its spec's ``section``) and one
line in ``METHODS`` below (and the worker registry). ``tests/methods/test_contract.py`` runs every entry.

``training_type`` (lora, qlora, full, cpt) was the one field before method and adapter were separate; it is
still read everywhere it was written and mapped by ``trainer_core.protocol.training_type``, in one place.
"""
from __future__ import annotations

from trainer_core.methods import cpt, embedding, grpo, preference, sft, stt, tts
from trainer_core.methods.base import ADAPTERS, SHAPES, MethodSpec, MetricSpec
from trainer_core.protocol import training_type

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    sft.SPEC, cpt.SPEC,
    preference.DPO, preference.ORPO, preference.SIMPO, preference.KTO, preference.REWARD,
    grpo.SPEC, embedding.SPEC, stt.SPEC, tts.SPEC,
)}
DEFAULT_METHOD, DEFAULT_ADAPTER = training_type.DEFAULT_PAIR
TRAINING_TYPES = training_type.TRAINING_TYPES  # the old names, lora, qlora, full and cpt
from_training_type = training_type.pair
pair_of_config = training_type.pair_of_config

__all__ = ["ADAPTERS", "METHODS", "SHAPES", "TRAINING_TYPES", "MethodSpec", "MetricSpec", "get", "from_training_type",
           "to_training_type", "run_label", "pair_of_config"]


def get(name: str) -> MethodSpec:
    """The spec of a registered method; KeyError names the registered ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; registered: {', '.join(METHODS)}") from None


def to_training_type(method: str, adapter: str) -> str:
    """The old name of a (method, adapter) pair: lora, qlora, full or cpt ("" for pairs it could not name)."""
    if method == "sft":
        return adapter
    return "cpt" if method == "cpt" and adapter in ("lora", "full") else ""


def run_label(method: str, adapter: str) -> str:
    """History's Method text. The pairs training_type could name keep their old text ("LoRA",
    "Continued pretraining"), so old and new runs of the same kind read the same."""
    adapter_label = ADAPTERS.get(adapter, adapter)
    if method == "sft":
        return adapter_label
    label = METHODS[method].label if method in METHODS else method
    return label if adapter == "lora" else f"{label} · {adapter_label}"
