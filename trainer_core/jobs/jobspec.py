"""What a job other than training is asked to do, and the model sources such jobs work on.

A training job is described by its ``TrainConfig`` (config.yaml). Every other kind (serve, eval, export)
is described by a ``JobSpec`` subclass, saved as ``job.json`` in the job folder next to ``kind.txt``; the
orchestrator's ``submit`` records, queues and launches it like a training run, and the worker entry point
of its kind reads it back with ``read_spec``.

A ``ModelSource`` names what to load: a base model, the final model of a run (its adapter, or its full
weights), or one completed ``checkpoint-<step>`` of a run. ``resolve`` turns it into folders, or a
``SourceError`` naming what is missing and the fix. Nothing here imports the ML stack: the dashboard, the
CLI and the worker all use it.

Kept whole: what every job kind other than training shares: the model source and its resolution (with the run-folder
checks), and the JobSpec base with its field conversion and registry; splitting the source from the spec would make
every job kind import two modules for one contract.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trainer_core.jobs import checkpoints
from trainer_core.config import BUNDLED_MODEL, ConfigError, FieldError, TrainConfig
from trainer_core import kinds
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, read_kind

SPEC_FILE = "job.json"
SPEC_BYTES_MAX = 1 << 20  # a spec is a few fields and prompts; a bigger file is not one of ours


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


# ====================================================================== job specs
@dataclass
class JobSpec:
    """The base of every non-training job's spec. Subclasses set ``KIND``, add fields (JSON-friendly
    types, nested ``ModelSource``s allowed) and extend ``validate``.

    ``env_names`` lists the environment variables the worker needs from the dashboard's environment (an
    HF token for a hub push, a judge's API key): the launcher passes those and nothing else secret."""

    KIND: ClassVar[JobKind]
    name: str = ""
    source: ModelSource = field(default_factory=ModelSource)
    # Devices, read by the scheduler and the launcher as for training (parallel.run_gpus): by default a job
    # holds the first GPU on a GPU host, and "cpu" on a CPU host (so it waits while a run trains there).
    gpu_ids: list[int] = field(default_factory=list)
    num_processes: int = 1

    def secrets(self) -> dict[str, str]:
        """Secret config fields (training's hf_token, ...): a spec holds none; see ``env_names``."""
        return {}

    # ---- labels the queue and History show (override as fits)
    @property
    def model_label(self) -> str:
        return self.source.key

    @property
    def dataset_label(self) -> str:
        return ""

    @property
    def total_steps(self) -> int:
        return 0

    def env_names(self) -> list[str]:
        return []

    def model_sources(self) -> list[ModelSource]:
        """The models this job loads (a serve job: several)."""
        return [self.source]

    def admin_only(self) -> list[str]:
        """Why this spec needs an admin (settings only an admin may submit); the orchestrator refuses it
        from anyone else. Empty: any operator may submit it. A subclass adds its own reasons to these."""
        return [f"source: {name} loads code shipped with its model (trust_remote_code), which runs on this host: only "
                "an admin may load it; ask an admin" for name in remote_code_sources(self.model_sources())]

    def validate(self) -> list[FieldError]:
        """Every problem at once (field errors), like TrainConfig.validate. Checks the source exists."""
        errors: list[FieldError] = []
        if not isinstance(self.name, str) or len(self.name) > 80 or "\x00" in self.name:
            errors.append(FieldError("name", "at most 80 characters, no NUL"))
        if not isinstance(self.gpu_ids, list) or not all(isinstance(g, int) and 0 <= g < 1024 for g in self.gpu_ids):
            errors.append(FieldError("gpu_ids", "a list of GPU indices like [0]"))
        if self.num_processes != 1:
            errors.append(FieldError("num_processes", f"{self.KIND.label} jobs run in one process"))
        try:
            resolve(self.source)
        except SourceError as exc:
            errors.append(FieldError(exc.field, str(exc)))
        return errors

    # ---- the file
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobSpec":
        """Build from job.json's object. Every field is checked against its annotation first (a hand-edited
        ``"targets": [["adapter"]]`` is a field error, not a TypeError in validate or the worker), so a field
        a subclass adds is checked without code of its own. Every problem is reported together."""
        known = field_types(cls)
        unknown = sorted(set(data) - set(known))
        errors = [FieldError(k, "unknown field") for k in unknown[:10]]
        values: dict[str, Any] = {}
        for name, raw in data.items():
            if name not in known:
                continue
            try:
                values[name] = _convert(raw, known[name])
            except SourceError as exc:
                errors.append(FieldError(exc.field if exc.field != "source" else name, str(exc)))
            except ValueError as exc:
                errors.append(FieldError(name, str(exc)))
        if errors:
            raise ConfigError(errors)
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError([FieldError("job.json", str(exc))]) from None


MEMORY_HEADROOM = 1.2  # weights plus activations and the KV cache of short generations


def memory_errors(sources: list[ModelSource], gpu_ids: list[int], doing: str) -> list[FieldError]:
    """The weights of ``sources`` (each loaded as one model: 16-bit on a GPU, 32-bit on a CPU) must fit the
    device's free memory (the GPUs in ``gpu_ids``, or RAM on a CPU host), so a job is refused with the figures
    and what to change instead of dying while it loads. ``doing`` names the job in the message."""
    from trainer_core.planning import memory, model_info
    from trainer_core.host import hardware  # model_info reads configs only: no ML stack

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


# ---- generic type checks of spec fields, driven by the dataclass annotations
class _Scalar:
    """The items of a bare ``list`` and the values of a bare ``dict``: one JSON value that is no container."""


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation (the spec modules use ``from __future__ import annotations``)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if hint is list or origin is list:
        args = typing.get_args(hint)
        return f"a list of {_describe(args[0])}" if args else "a list"
    if hint is dict or origin is dict:
        return "an object"
    return {str: "text", int: "a whole number", float: "a number", bool: "true or false", _Scalar: "a plain value",
            ModelSource: "a model source"}.get(hint, getattr(hint, "__name__", str(hint)))


def _convert(value: Any, hint: Any) -> Any:
    """``value`` (from JSON) as the field annotated ``hint`` holds it; ValueError says what was expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        choices = [a for a in args if a is not type(None)]
        for choice in choices:
            try:
                return _convert(value, choice)
            except ValueError:
                continue
        expected = " or ".join(_describe(c) for c in choices) + (" or null" if type(None) in args else "")
        raise ValueError(f"expected {expected}, got {_shown(value)}")
    if hint is ModelSource:
        if isinstance(value, ModelSource):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"expected a model source (an object with run_id, checkpoint, model), got {_shown(value)}")
        return ModelSource.from_dict(value)
    if hint is list or origin is list:
        if not isinstance(value, list):
            raise ValueError(f"expected {_describe(hint)}, got {_shown(value)}")
        item = args[0] if args else _Scalar
        converted = []
        for i, part in enumerate(value):
            try:
                converted.append(_convert(part, item))
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        return converted
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {_shown(value)}")
        key_hint, value_hint = args if len(args) == 2 else (str, _Scalar)
        converted = {}
        for key, part in value.items():
            try:
                converted[_convert(key, key_hint)] = _convert(part, value_hint)
            except ValueError as exc:
                raise ValueError(f"key {_shown(key)}: {exc}") from None
        return converted
    checks = {
        str: lambda v: isinstance(v, str),
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        _Scalar: lambda v: v is None or isinstance(v, (str, int, float, bool)),
    }
    check = checks.get(hint)
    if check is None:
        return value  # an annotation without a JSON shape (Any): the spec's validate checks it
    if not check(value):
        raise ValueError(f"expected {_describe(hint)}, got {_shown(value)}")
    return float(value) if hint is float else value


SPEC_TYPES: dict[JobKind, type[JobSpec]] = {}


def register(cls: type[JobSpec]) -> type[JobSpec]:
    """Class decorator: ``read_spec`` builds specs of ``cls.KIND`` with ``cls``."""
    SPEC_TYPES[cls.KIND] = cls
    return cls


def write_spec(run_dir: Path, spec: JobSpec) -> None:
    (Path(run_dir) / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True))


def export_roots(run_dir: Path) -> list[Path]:
    """Folders outside the job's own folder that its files may be in: the export target its job.json recorded at
    submit (``output_dir`` of its spec, itself held inside the allowed roots). Empty for other kinds, or when the
    spec cannot be read (then only the job's folder counts)."""
    try:
        spec = read_spec(run_dir)
        output_dir = getattr(spec, "output_dir", None)
        return [Path(output_dir(Path(run_dir)))] if callable(output_dir) else []
    except (ConfigError, OSError, ValueError):
        return []


def read_spec(run_dir: Path) -> JobSpec:
    """The spec in ``run_dir/job.json`` as its kind's class (ConfigError names the problem)."""
    import trainer_core.jobs.jobkinds  # noqa: F401  (registers every kind's spec class)

    kind = read_kind(run_dir)
    cls = SPEC_TYPES.get(kind)
    if cls is None:
        raise ConfigError([FieldError("kind", f"{kind.value} jobs have no job.json spec")])
    path = Path(run_dir) / SPEC_FILE
    try:
        if path.stat().st_size > SPEC_BYTES_MAX:
            raise ConfigError([FieldError(SPEC_FILE, f"{path} is larger than {SPEC_BYTES_MAX:,} bytes")])
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError([FieldError(SPEC_FILE, f"{path} cannot be read: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError([FieldError(SPEC_FILE, f"{path} must hold a JSON object")])
    return cls.from_dict(data)
