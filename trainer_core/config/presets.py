"""Presets: whole TrainConfigs saved as YAML, built-in ones shipped with the code and the user's own.

Built-in presets live in ``presets/`` at the repository root (installed as
``trainer_core/builtin_presets/``); user presets in ``<data root>/presets/<name>.yaml``. A preset's
description is its leading ``#`` comment. Presets never hold secrets: ``save_preset`` writes
``TrainConfig.to_yaml`` (tokens stripped) and ``load_preset`` refuses a file that carries one.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainer_core.protocol import paths
from trainer_core.config import ConfigError, FieldError, TrainConfig, load_yaml, secrets_in_file

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SUFFIX = ".yaml"


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    builtin: bool
    description: str


class PresetError(ConfigError):
    """A preset that cannot be found, loaded or saved; ``errors`` name the field and the fix."""

    @classmethod
    def one(cls, message: str, field: str = "preset") -> PresetError:
        return cls([FieldError(field, message)])


def builtin_dir() -> Path:
    """The built-in presets: inside the package when installed, else the repository's ``presets/``."""
    installed = Path(__file__).resolve().parents[1] / "builtin_presets"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "presets"


def user_dir() -> Path:
    return paths.data_root() / "presets"


def check_name(name: str) -> str:
    """The preset name without a trailing .yaml; raises PresetError for names that are not plain file names."""
    name = str(name).strip()
    name = name.removesuffix(SUFFIX)
    if not NAME_RE.fullmatch(name):  # fullmatch: `$` alone would accept a trailing newline
        raise PresetError.one("name a preset with letters, digits, - _ and . only (no slashes or spaces, "
                          f"at most 64 characters, not starting with a dot); got {name!r}", field="preset_name")
    return name


def description_of(text: str) -> str:
    """The leading ``#`` comment lines, joined: a preset's description."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(line for line in lines if line)


def _presets_in(folder: Path, builtin: bool) -> list[Preset]:
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*" + SUFFIX)):
        name = path.name[: -len(SUFFIX)]
        if not NAME_RE.fullmatch(name) or not path.is_file():
            continue  # a file that could not be named back (e.g. a stray ".x.yaml") is not offered
        try:
            description = description_of(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            description = "(unreadable)"
        found.append(Preset(name=name, path=path, builtin=builtin, description=description))
    return found


def list_presets() -> list[Preset]:
    """Built-in presets first, then the user's, each sorted by name. A user preset never shadows a built-in one."""
    builtin = _presets_in(builtin_dir(), builtin=True)
    taken = {p.name for p in builtin}
    return builtin + [p for p in _presets_in(user_dir(), builtin=False) if p.name not in taken]


def find_preset(name: str) -> Preset:
    name = check_name(name)
    presets = list_presets()
    for preset in presets:
        if preset.name == name:
            return preset
    known = ", ".join(p.name for p in presets) or "none"
    raise PresetError.one(f"no preset named '{name}'; the presets are: {known}")


def load_preset(name: str) -> TrainConfig:
    """The TrainConfig a preset holds; PresetError names the file, the field and the fix."""
    preset = find_preset(name)
    if not preset.builtin:
        try:  # a symlink in the presets folder must not read a file from elsewhere
            paths.resolve_inside(preset.path, [user_dir()])
        except paths.UnsafePathError as exc:
            raise PresetError.one(f"{exc}. Copy the file into {user_dir()} instead of linking it.") from None
    try:
        text = TrainConfig.read_text(preset.path, "preset")
    except ConfigError as exc:
        raise PresetError(exc.errors) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PresetError.one(f"cannot read {preset.path}: {exc}") from None
    try:
        data = load_yaml(text) or {}
    except (yaml.YAMLError, RecursionError) as exc:
        raise PresetError.one(f"{preset.path.name} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise PresetError.one(f"{preset.path.name} must hold a mapping of field: value")
    leaked = secrets_in_file(data, preset.path.name)
    if leaked:
        raise PresetError(leaked)
    try:
        return TrainConfig.from_dict(data)
    except ConfigError as exc:
        raise PresetError([FieldError(e.field, f"in preset {preset.path.name}: {e.message}")
                           for e in exc.errors]) from None


def save_preset(name: str, cfg: TrainConfig, description: str = "", overwrite: bool = False) -> Path:
    """Write ``cfg`` (without secrets) to ``<data root>/presets/<name>.yaml`` and return the path."""
    name = check_name(name)
    if (builtin_dir() / (name + SUFFIX)).exists():
        raise PresetError.one(f"'{name}' is a built-in preset; choose another name", field="preset_name")
    folder = user_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (name + SUFFIX)
    if target.exists() and not overwrite:
        raise PresetError.one(f"a preset named '{name}' exists; tick 'Overwrite' or choose another name",
                          field="preset_name")
    header = "".join(f"# {line.strip()}\n" for line in description.strip().splitlines() if line.strip())
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    partial.write_text(header + cfg.to_yaml(), encoding="utf-8")
    os.replace(partial, target)  # a reader never sees half a preset
    return target
