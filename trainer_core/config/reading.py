"""How a configuration is read (trainer_core.config): YAML without aliases, a method's grouped section flattened, the
method's settings section built into its typed settings object, the old fields (training_type, is_embedding) mapped
with one deprecation note (here only: nothing else reads them), secrets refused in files, and each loose value
converted to its field's type with a message that says what was expected."""
from __future__ import annotations

import dataclasses
import difflib
import math
import warnings
from typing import Any

import yaml

from trainer_core import methods
from trainer_core.methods import METHODS, TRAINING_TYPES
from trainer_core.methods.settings import read_settings
from trainer_core.protocol.errors import ConfigError, FieldError
from trainer_core.protocol.secrets import ENV_NAMES, SECRET_FIELDS

class _NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors and aliases: a few hundred characters of nested aliases expand to GBs once the
    config is copied out (to_dict), so an alias is refused where the text is parsed. Configs never need them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(None, None, "aliases (*name) are not allowed in a config: write "
                                                    "the value out", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str):
    """The one way user-written YAML (config files, presets, --set values, the form's method settings) is read:
    safe types only, no aliases. Raises yaml.YAMLError (or RecursionError for absurd nesting)."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def training_type_note(training_type: str, method: str, adapter: str) -> str:
    """The one deprecation note for ``training_type`` (the CLI, presets and the form show it)."""
    return (f"training_type is deprecated: '{training_type}' means method: {method} and adapter: {adapter}; "
            "write those two fields instead (training_type keeps being read).")


class TrainingTypeDeprecation(FutureWarning):
    """Warned once per value when a file or mapping still names training_type (old run folders too)."""


IS_EMBEDDING_NOTE = "is_embedding is deprecated: true means method: embedding"


def read_is_embedding(data: dict[str, Any], errors: list[FieldError]) -> dict[str, Any]:
    """``data`` with an old ``is_embedding: true`` read as ``method: embedding`` (one deprecation note, like
    training_type's; a conflicting method is an error); ``false`` says nothing and is dropped."""
    data = dict(data)
    value = data.pop("is_embedding")
    if value in (False, None, "false", "no", "off", "0", 0):
        return data
    if value not in (True, "true", "yes", "on", "1", 1):
        errors.append(FieldError("is_embedding", "use true or false (better: method: embedding)"))
        return data
    if data.get("method", "embedding") != "embedding":
        errors.append(FieldError("is_embedding", f"{IS_EMBEDDING_NOTE}, but method is {data['method']!r}: remove "
                                                 "is_embedding"))
        return data
    data["method"] = "embedding"
    warnings.warn(f"{IS_EMBEDDING_NOTE}; write method: embedding instead (is_embedding keeps being read).",
                  TrainingTypeDeprecation, stacklevel=3)
    return data


def _training_type_fix() -> str:
    return f"choose one of {', '.join(TRAINING_TYPES)}, or better set method and adapter instead"


def read_training_type(data: dict[str, Any], errors: list[FieldError]) -> dict[str, Any]:
    """``data`` with training_type replaced by method and adapter (problems go to ``errors``; a conflict with
    either is one). ``from_dict`` calls it; so does the CLI before ``--set`` changes method or adapter."""
    data = dict(data)
    value = data.pop("training_type")
    if value not in TRAINING_TYPES:
        errors.append(FieldError("training_type", _training_type_fix()))
        return data
    use_lora = data.get("use_lora", True) not in (False, "false", "no", "off", "0")
    method, adapter = methods.from_training_type(value, use_lora)
    for name, mapped in (("method", method), ("adapter", adapter)):
        if data.get(name, mapped) != mapped:
            errors.append(FieldError("training_type", f"'{value}' means {name} {mapped}, but {name} is "
                                                      f"{data[name]!r}: remove training_type"))
    data.setdefault("method", method)
    data.setdefault("adapter", adapter)
    warnings.warn(training_type_note(value, method, adapter), TrainingTypeDeprecation, stacklevel=3)
    return data


# The YAML sections that hold a method's settings (``dpo: {beta: 0.1}``): one per method with a settings dataclass
SETTINGS_SECTIONS = tuple(name for name, spec in METHODS.items() if spec.settings is not None)
SETTINGS_CLASSES = tuple(METHODS[name].settings for name in SETTINGS_SECTIONS)


def take_settings_sections(data: dict[str, Any], errors: list[FieldError]) -> tuple[dict[str, Any], dict[str, dict]]:
    """(``data`` without the settings sections, each section's mapping by method). Only the chosen method's section
    is read into its settings; another method's (an old form kept every method's text) is dropped. A section that
    is not a mapping is a problem; an empty one (``grpo:``) means the defaults."""
    found = [name for name in SETTINGS_SECTIONS if name in data]
    if not found:
        return data, {}
    sections: dict[str, dict] = {}
    for name in found:
        raw = data[name]
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            errors.append(FieldError(name, f"expected a mapping of {name} settings, e.g. {name}: {{beta: 0.1}}"))
            continue
        sections[name] = dict(raw)
    return {k: v for k, v in data.items() if k not in found}, sections


def read_method_settings(method: str, raw: dict | None) -> tuple[Any, list[FieldError]]:
    """(the method's settings object, problems): ``raw`` (its section, or None for the defaults) read into the
    dataclass its spec names; None for a method without one (or an unknown method, which validate names)."""
    spec = METHODS.get(method)
    if spec is None or spec.settings is None:
        return None, []
    return read_settings(spec.settings, raw, method)


def settings_for(method: str, given: Any) -> Any:
    """``given`` as the settings object of ``method``: kept when it is one, the defaults when it is None or another
    method's (the method changed), None for a method without settings. A mapping is not built here: read it with
    ``TrainConfig.from_dict``, which names each problem."""
    if given is not None and not isinstance(given, SETTINGS_CLASSES):
        raise TypeError(f"method_settings is a method's settings dataclass or None, not {type(given).__name__}: "
                        "read a mapping with TrainConfig.from_dict")
    spec = METHODS.get(method) if isinstance(method, str) else None
    if spec is None or spec.settings is None:
        return None
    return given if isinstance(given, spec.settings) else spec.settings()


def _flatten_sections(data: dict[str, Any], errors: list[FieldError]) -> dict[str, Any]:
    """A method's settings may be grouped under its name (``cpt: {embedding_learning_rate: 5e-5}``): they
    are the flat fields its spec's ``section`` lists, and are read as those."""
    grouped = [name for name in METHODS if name in data and METHODS[name].settings is None]
    if not grouped:
        return data
    flat = {k: v for k, v in data.items() if k not in grouped}
    for name in grouped:
        section, allowed = data[name], METHODS[name].section
        if not isinstance(section, dict):
            errors.append(FieldError(name, f"write the {name} section as a mapping of {', '.join(allowed) or 'no'} "
                                           "settings"))
            continue
        for key, value in section.items():
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" Did you mean '{close[0]}'?" if close else f" It takes {', '.join(allowed) or 'no settings'}."
                errors.append(FieldError(f"{name}.{key}", f"not a setting of the {name} method.{hint}"))
            elif key in data:
                errors.append(FieldError(f"{name}.{key}", f"{key} is set twice (at the top and in {name}): keep one"))
            else:
                flat[key] = value
    return flat


def secrets_in_file(data: dict, file_name: str) -> list[FieldError]:
    """One error per secret field a config file (a run YAML, a preset) holds: secrets are never written to
    files, so one found there is refused rather than used (it may be committed or shared with the file)."""
    return [FieldError(name, f"secrets do not belong in YAML; set {ENV_NAMES} in the environment "
                             f"(or enter it in the form), and remove it from {file_name}")
            for name in SECRET_FIELDS if data.get(name)]


def read_yaml_file(path: str, field: str) -> dict:
    """The mapping a YAML file of the CLI holds (a sweep's, a recipe's); ConfigError naming ``field`` (the option) when
    the path is refused, missing or unreadable, when it holds no mapping, or when it holds a secret."""
    from pathlib import Path

    from trainer_core.protocol import paths

    problem = paths.path_problem(path)
    if problem:
        raise ConfigError([FieldError(field, problem)])
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError([FieldError(field, f"{path} does not exist")]) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ConfigError([FieldError(field, f"cannot read {path}: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError([FieldError(field, f"{path} must hold a mapping of field: value")])
    leaked = secrets_in_file(data, Path(path).name)
    if leaked:
        raise ConfigError(leaked)
    return data


def _coerce(f: dataclasses.Field, raw: Any) -> Any:
    """Convert loose input to the field's type, with a message that says what was expected."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if raw is None:
        raise ValueError("a value is required")
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return raw.strip().lower() in ("true", "yes", "on", "1")
        raise ValueError(f"expected true or false, got {raw!r}")
    if kind == "int":
        if isinstance(raw, bool):
            raise ValueError(f"expected a whole number, got {raw!r}")
        if isinstance(raw, float):
            if not math.isfinite(raw) or raw != int(raw):
                raise ValueError(f"expected a whole number, got {raw!r}")
            return int(raw)
        text = str(raw).strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:  # "1.0e9": YAML 1.1 reads an exponent without a sign as text; accept it when it is whole
            number = float(text)
        except ValueError:
            raise ValueError(f"expected a whole number, got {raw!r}") from None
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"expected a whole number, got {raw!r}")
        return int(number)
    if kind == "float":
        if isinstance(raw, bool):
            raise ValueError(f"expected a number, got {raw!r}")
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {raw!r}") from None
    if kind == "str":
        if isinstance(raw, (dict, list)):
            raise ValueError(f"expected text, got {type(raw).__name__}")
        return str(raw)
    if kind == "list":
        if isinstance(raw, str) and f.metadata.get("whole_items"):
            return [raw] if raw.strip() else []
        if isinstance(raw, str):
            return [part.strip() for part in raw.split(",") if part.strip()]
        if isinstance(raw, (list, tuple)):
            return list(raw)
        raise ValueError(f"expected a list, got {raw!r}")
    if kind == "dict":
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise ValueError("expected a mapping of role names to column names")
        return dict(raw)
    return raw
