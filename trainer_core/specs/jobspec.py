"""What a job other than training is asked to do: the ``JobSpec`` base, its fields checked against their annotations,
the registry of every kind's spec class and ``job.json``.

A training job is described by its ``TrainConfig`` (config.yaml). Every other kind (serve, eval, export)
is described by a ``JobSpec`` subclass, saved as ``job.json`` in the job folder next to ``kind.txt``; the
orchestrator's ``submit`` records, queues and launches it like a training run, and the worker entry point
of its kind reads it back with ``read_spec``. The model sources a spec names, and how they are found in run folders,
are ``trainer_core.specs.model_source``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trainer_core.config import ConfigError, FieldError
from trainer_core.protocol.status import JobKind, read_kind
from trainer_core.specs.model_source import ModelSource, SourceError, remote_code_sources, resolve

SPEC_FILE = "job.json"
SPEC_BYTES_MAX = 1 << 20  # a spec is a few fields and prompts; a bigger file is not one of ours


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

    def writable_paths(self) -> list[Path]:
        """Folders outside its own that the job writes (its sandbox makes them writable): none by default."""
        return []

    def needs_network(self) -> bool:
        """Whether the job calls out of its sandbox beyond what its config's fields say (sandbox.NETWORK_FIELDS)."""
        return False

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
    import trainer_core.specs.jobkinds  # noqa: F401  (registers every kind's spec class)

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
