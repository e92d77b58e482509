"""Model sources, the part of a job spec that reads run folders: a ``ModelSource`` names what a non-training job loads
(a base model, the final model of a run, or one completed ``checkpoint-<step>`` of a run); ``resolve`` finds it in
the run's folder (its config.yaml, adapter or full weights, checkpoints) as a ``ResolvedSource``, or raises a
``SourceError`` naming what is missing and the fix. Nothing here imports the ML stack: the dashboard, the CLI and the
worker all use it. The spec that names sources is ``trainer_core.specs.jobspec``.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_core.config import BUNDLED_MODEL, ConfigError, FieldError, TrainConfig
from trainer_core import kinds
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, read_kind
from trainer_core.specs import checkpoints


class SourceError(ValueError):
    """A model source that cannot be loaded: names what is missing and the fix."""

    def __init__(self, message: str, field: str = "source"):
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class ModelSource:
    """``run_id`` empty: the base model ``model`` (the bundled model, a local folder or a hub id).
    ``run_id`` set: that run's final model, or its ``checkpoint-<checkpoint>`` when ``checkpoint`` is set."""

    run_id: str = ""
    checkpoint: int | None = None
    model: str = ""

    @property
    def is_base(self) -> bool:
        return not self.run_id

    @property
    def key(self) -> str:
        """A stable text form: ``base:<model>``, ``run:<id>`` or ``run:<id>@<step>`` (parse with ``from_key``)."""
        if self.is_base:
            return f"base:{self.model}"
        return f"run:{self.run_id}" + (f"@{self.checkpoint}" if self.checkpoint is not None else "")

    @classmethod
    def from_key(cls, key: str) -> "ModelSource":
        if key.startswith("base:") and len(key) > 5:
            return cls(model=key[5:])
        match = re.fullmatch(r"run:([A-Za-z0-9][A-Za-z0-9_-]{0,63})(?:@(\d{1,9}))?", key)
        if not match:
            raise SourceError(f"{key[:80]!r} is not a model source; use base:<model>, run:<id> or run:<id>@<step>")
        return cls(run_id=match.group(1), checkpoint=int(match.group(2)) if match.group(2) else None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "ModelSource":
        if not isinstance(data, dict):
            raise SourceError("a model source must be an object with run_id, checkpoint and model")
        run_id, checkpoint, model = data.get("run_id") or "", data.get("checkpoint"), data.get("model") or ""
        if not isinstance(run_id, str) or not isinstance(model, str):
            raise SourceError("run_id and model of a model source are text")
        if checkpoint is not None and (isinstance(checkpoint, bool) or not isinstance(checkpoint, int) or checkpoint < 0):
            raise SourceError(f"checkpoint must be a step number, not {checkpoint!r}", "checkpoint")
        if not run_id and not model:
            raise SourceError("a model source names a run or a base model")
        return cls(run_id=run_id, checkpoint=checkpoint, model=model)


@dataclass(frozen=True)
class ResolvedSource:
    """A model source, found on disk. ``adapter_dir`` is a PEFT adapter folder to apply on ``base_model``;
    ``model_dir`` a folder of full weights (a full fine-tune); both None for a base model. ``base_model``
    is a model name as ``TrainConfig.model_name`` takes it (the worker's ``resolve_model`` makes it a folder)."""

    source: ModelSource
    label: str
    base_model: str
    adapter_dir: Path | None = None
    model_dir: Path | None = None
    run_name: str = ""
    config: TrainConfig | None = None

    @property
    def weights_dir(self) -> Path | None:
        return self.adapter_dir or self.model_dir

    @property
    def served_name(self) -> str:
        """The model name a client asks an OpenAI-compatible endpoint for: short, stable, no slashes."""
        if self.source.is_base:
            return slug(self.base_model.removeprefix("bundled:").rsplit("/", 1)[-1]) or "base"
        name = slug(self.run_name) or self.source.run_id
        return name + (f"-step{self.source.checkpoint}" if self.source.checkpoint is not None else "")


    @property
    def kind(self) -> kinds.ModelKind:
        """What the model is (trainer_core.kinds' capability row): a run's method decides it (MethodSpec.output),
        keeping its base model's kind when both write answers (a vision model tuned with sft); a base model is told
        by its config files (a Whisper model: speech; a CSM model: tts; a sentence-transformers folder: embedding).
        Text when the files cannot be read (the worker names what is wrong when it loads the model; output_problem
        says it here)."""
        if self.config is not None and self.config.method_spec.output != "text":
            return kinds.of_output(self.config.method_spec.output)
        from trainer_core.planning import model_info, modality  # reads JSON config files only

        try:
            base = modality.detect_kind(self.base_model)
        except (model_info.ModelInfoError, OSError, ValueError):
            base = kinds.get(kinds.TEXT)
        return kinds.of_output("text", base) if self.config is not None else base

    @property
    def output(self) -> str:
        """What the model produces, in MethodSpec.output's words: text, reward, embedding, speech or audio."""
        return self.kind.output

    @property
    def sees_images(self) -> bool:
        """Whether the model is a vision-language model (a run of a method that writes answers on one, or the base)."""
        return self.kind.sees_images

    @property
    def output_problem(self) -> str:
        """Why a base model's kind could not be told from its config files ("" for a run, or when it could): a
        folder outside the allowed roots, a hub id that is not cached and cannot be reached."""
        if self.config is not None:
            return ""
        from trainer_core.planning import model_info, modality

        try:
            modality.detect_modality(self.base_model)
        except (model_info.ModelInfoError, OSError, ValueError) as exc:
            return str(exc) or type(exc).__name__
        return ""

    def not_a_writer(self, doing: str) -> str | None:
        """Why this source cannot be ``doing`` ("served", "evaluated by its answers", "merged for export"): None
        for a model that writes answers. Serving, the Playground, generation metrics and GGUF all need one."""
        kind = self.kind
        if kind.writes_answers:
            return None
        use = kind.uses or "it does not write answers"
        where = f" (its weights: {self.weights_dir})" if self.weights_dir is not None else ""
        return (f"{self.label} was trained with {self.config.method_label if self.config else 'its method'}, so it "
                f"cannot be {doing}: {use}{where}")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def run_config(run_id: str) -> TrainConfig:
    """The saved config of run ``run_id`` (SourceError when its folder or config is gone)."""
    try:
        folder = paths.run_dir(run_id)
    except paths.UnsafePathError as exc:
        raise SourceError(str(exc), "run") from None
    if not folder.is_dir():
        raise SourceError(f"run {run_id}: its folder {folder} is gone (deleted from disk); pick another run", "run")
    try:
        if read_kind(folder) is not JobKind.TRAIN:
            raise SourceError(f"{run_id} is not a training run: pick a run that trained a model", "run")
        return TrainConfig.from_yaml((folder / "config.yaml").read_text())
    except (OSError, ValueError, ConfigError) as exc:
        if isinstance(exc, SourceError):
            raise
        raise SourceError(f"run {run_id}: its config.yaml cannot be read ({exc})", "run") from None


def checkpoint_steps(run_id: str) -> list[int]:
    """Steps of the completed checkpoints of a run, oldest first (empty when none, or no folder)."""
    try:
        found = checkpoints.completed_checkpoints(paths.run_dir(run_id) / "checkpoints")
    except (OSError, paths.UnsafePathError):
        return []
    return [int(checkpoints.CHECKPOINT_RE.fullmatch(p.name).group(1)) for p in found]


def has_weights(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()


def final_dir(run_id: str, cfg: TrainConfig) -> Path:
    return paths.run_dir(run_id) / ("adapter" if cfg.effective_use_lora else "model")


def _links_in(folder: Path, limit: int = 10_000) -> list[Path]:
    """The symbolic links under a weights folder (files or folders, not followed; at most ``limit`` entries looked
    at: a weights folder holds a few dozen)."""
    links, pending, seen = [], [folder], 0
    while pending and seen < limit:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if entry.is_symlink():
                links.append(Path(entry.path))
            elif entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
    return links


def remote_code_sources(sources: list[ModelSource]) -> list[str]:
    """The runs among ``sources`` whose model runs code from its repository (trust_remote_code): loading it runs that
    code, which only an admin may start (the rule of a custom Python reward)."""
    names = []
    for source in sources:
        try:
            config = resolve(source).config if source.run_id else None
        except (SourceError, OSError, ValueError):
            continue  # validate() names a missing or unreadable run
        if config is not None and config.trust_remote_code is True:
            names.append(f"run {source.run_id}")
    return names


def resolve(source: ModelSource, run_name: str = "") -> ResolvedSource:
    """Where the weights of ``source`` are, or SourceError naming what is missing and the fix."""
    if source.is_base:
        model = source.model.strip()
        if not model:
            raise SourceError("name a base model: the bundled model, a local folder or a hub id", "model")
        label = "Bundled SmolLM2-135M-Instruct" if model == BUNDLED_MODEL else model
        return ResolvedSource(source, f"Base · {label}", model)
    cfg = run_config(source.run_id)
    name = run_name or cfg.run_name or source.run_id
    if source.checkpoint is None:
        folder = final_dir(source.run_id, cfg)
        if not has_weights(folder):
            steps = checkpoint_steps(source.run_id)
            hint = (f"pick one of its checkpoints ({', '.join(map(str, steps[-5:]))})" if steps
                    else "wait until it finishes, or train it again")
            raise SourceError(f"run '{name}' has no saved {'adapter' if cfg.effective_use_lora else 'model'} yet "
                              f"(it is queued, still training, or failed before saving): {hint}", "run")
        label = f"{name} · final"
    else:
        folder = paths.run_dir(source.run_id) / "checkpoints" / f"checkpoint-{source.checkpoint}"
        if not has_weights(folder) or not checkpoints.is_complete(folder):  # still being saved, or a killed save
            steps = checkpoint_steps(source.run_id)
            known = f"its checkpoints are at steps {', '.join(map(str, steps))}" if steps else "it has no checkpoints"
            raise SourceError(f"run '{name}' has no checkpoint at step {source.checkpoint}: {known}", "checkpoint")
        label = f"{name} · step {source.checkpoint}"
    what = "its weights folder"
    try:  # the weights are the run's own: a folder replaced by a link out of the run would serve or export anything,
        # and so would one file in it (model.safetensors) replaced by a link
        paths.inside_run(paths.run_dir(source.run_id), folder)
        for link in _links_in(folder):
            what = "a file in its weights folder"
            paths.inside_run(paths.run_dir(source.run_id), link)
    except paths.UnsafePathError as exc:
        where = "checkpoint" if source.checkpoint is not None else "run"
        raise SourceError(f"run '{name}': {what} {exc}: a run's weights stay in its folder; train it "
                          "again, or copy the weights there", where) from None
    is_adapter = (folder / "adapter_config.json").is_file()
    if is_adapter:  # a damaged file failed later, in the worker, as a bare JSONDecodeError
        try:
            if not isinstance(json.loads((folder / "adapter_config.json").read_text()), dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            where = "checkpoint" if source.checkpoint is not None else "run"
            raise SourceError(f"{folder / 'adapter_config.json'} cannot be read ({str(exc)[:120]}): the adapter is "
                              "damaged; pick another checkpoint, or train again", where) from None
    return ResolvedSource(source, label, cfg.model_name, adapter_dir=folder if is_adapter else None,
                          model_dir=None if is_adapter else folder, run_name=name, config=cfg)



MEMORY_HEADROOM = 1.2  # weights plus activations and the KV cache of short generations


def memory_errors(sources: list[ModelSource], gpu_ids: list[int], doing: str) -> list[FieldError]:
    """The weights of ``sources`` (each loaded as one model: 16-bit on a GPU, 32-bit on a CPU) must fit the
    device's free memory (the GPUs in ``gpu_ids``, or RAM on a CPU host), so a job is refused with the figures
    and what to change instead of dying while it loads. ``doing`` names the job in the message."""
    from trainer_core.host import hardware
    from trainer_core.planning import memory, model_info  # model_info reads configs only: no ML stack

    params, names = 0, []
    for source in sources:
        try:
            resolved = resolve(source)
            params += model_info.inspect_model(resolved.base_model).num_parameters
        except (SourceError, model_info.ModelInfoError):
            return []  # nothing to estimate from (an unreachable hub id): the worker reports what happens
        names.append(resolved.base_model)
    cuda = hardware.cuda_available()
    need_gb = params * (2 if cuda else 4) * MEMORY_HEADROOM / memory.GB
    dev = memory.device_memory(TrainConfig(gpu_ids=list(gpu_ids)))
    if not sources or not math.isfinite(dev.free_gb) or need_gb <= dev.free_gb:
        return []
    what = names[0] if len(set(names)) == 1 and len(names) == 1 else f"{len(names)} models"
    return [FieldError("memory", f"{what} need{'s' if what == names[0] else ''} about {need_gb:,.1f} GB to {doing} "
                                 f"({params / 1e9:,.2f}B parameters in {'16' if cuda else '32'}-bit), but {dev.label} "
                                 f"has {dev.free_gb:,.1f} GB free: stop other jobs, pick a GPU with more free memory "
                                 f"(gpu_ids), or use {'fewer or ' if len(names) > 1 else ''}smaller models")]

