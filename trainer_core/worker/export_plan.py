"""What an export works with (trainer_core/worker/export.py): the plan preflight makes, the artifacts it stages, and
the two ways it stops early (an ExportError naming the fix; Stop or Cancel between stages)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainer_core.specs import model_source
from trainer_core.export.spec import ExportSpec
from trainer_core.protocol import control


class ExportError(RuntimeError):
    """An export that cannot go on: the message names the problem and the fix."""


class Interrupted(Exception):
    def __init__(self, action: control.Action):
        self.action = action


@dataclass
class Staged:
    """One artifact in the staging folder: its name there, its kind and detail for the artifacts table."""

    name: str
    artifact: str
    detail: str = ""
    what: str = ""  # for the model card's file list


@dataclass
class Plan:
    spec: ExportSpec
    resolved: model_source.ResolvedSource
    final: Path
    staging: Path
    base_dir: str  # the base model's folder (or hub id)
    tokenizer: object = None
    staged: list[Staged] = field(default_factory=list)
    verify: list[dict] = field(default_factory=list)
    # a text-to-speech export with verify on: (sentence, samples, ended) the model spoke before it was saved
    spoken: list[tuple[str, object, bool]] = field(default_factory=list)
    hub_repo_exists: bool = False  # found by preflight: the push updates it instead of creating it

    @property
    def stem(self) -> str:
        return self.resolved.served_name or "model"

    @property
    def merged_dir(self) -> Path:
        return self.staging / "merged" if "merged" in self.spec.targets else self.staging / ".work" / "merged"

