"""The one model-kind registry: name -> ModelKind (dashboard halves; no ML imports, nothing of the studio below it).

Adding a model kind is its module here (one ``KIND = ModelKind(...)``), its worker half (the module ``worker``
names) and one line in ``KINDS`` below; docs/model-kinds.md is regenerated with ``python -m trainer_core.kinds
--write`` (tests/kinds/test_kinds_contract.py checks the page, every row and every refusal).
"""
from __future__ import annotations

from trainer_core.kinds import embedding, reward, speech, text, tts, vision
from trainer_core.kinds.base import EXPORT_TARGETS, NEEDS_WRITER, NO_ONNX, Facts, ModelKind

# In the order the docs list them
KINDS: dict[str, ModelKind] = {k.name: k for k in (
    text.KIND, vision.KIND, speech.KIND, tts.KIND, embedding.KIND, reward.KIND,
)}
# The order a model folder is tried in: the specific claims first, text (which claims everything) last
DETECTION_ORDER = ("tts", "speech", "embedding", "vision", "reward", "text")
TEXT = "text"

__all__ = ["DETECTION_ORDER", "EXPORT_TARGETS", "KINDS", "NEEDS_WRITER", "NO_ONNX", "Facts", "ModelKind", "detect",
           "get", "of_output", "of_run"]


def get(name: str) -> ModelKind:
    """The row of a registered kind; KeyError names the registered ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown model kind {name!r}; registered: {', '.join(KINDS)}") from None


def detect(facts: Facts) -> ModelKind:
    """The kind of a model folder, from its JSON files (the first kind in DETECTION_ORDER that claims it)."""
    return next(KINDS[name] for name in DETECTION_ORDER if KINDS[name].detect(facts))


def of_output(output: str, base: ModelKind | None = None) -> ModelKind:
    """The kind of a run whose method produces ``output`` (MethodSpec.output) from a base model of kind ``base``:
    a method that writes answers keeps its base's kind when that kind writes answers too (a vision model tuned with
    sft is still a vision model), every other method decides the kind itself."""
    if output == "text":
        return base if base is not None and base.writes_answers else KINDS[TEXT]
    return next((k for k in KINDS.values() if k.output == output), KINDS[TEXT])


def of_run(method: str, base: ModelKind | None = None) -> ModelKind:
    """The kind of a run of ``method`` (a registered name) from a base model of kind ``base``."""
    candidates = [k for k in KINDS.values() if k.trains(method)]
    if base is not None and base in candidates:
        return base
    return candidates[0] if candidates else KINDS[TEXT]
