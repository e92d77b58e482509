"""The starter recipes (starters/*.yaml): a label, what they need, a description, and a RecipeSpec's fields. The Data
page and ``data preview|generate --starter NAME`` start from them; each is an ordinary recipe once loaded."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import yaml

FOLDER = Path(__file__).resolve().parent / "starters"


@dataclass(frozen=True)
class Starter:
    name: str
    label: str
    needs: str
    description: str
    spec: dict


@functools.cache
def _all() -> dict[str, Starter]:
    found = {}
    for path in sorted(FOLDER.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        found[path.stem] = Starter(path.stem, data["label"], data.get("needs", ""), " ".join(data["description"].split()),
                                   data["spec"])
    return found


def names() -> list[str]:
    return list(_all())


def get(name: str) -> Starter:
    """The starter ``name``; KeyError names the known ones."""
    try:
        return _all()[name]
    except KeyError:
        raise KeyError(f"no starter recipe {name!r}; known: {', '.join(_all())}") from None


def spec_fields(name: str) -> dict:
    """A fresh copy of the starter's RecipeSpec fields, ``starter`` set."""
    import copy

    return {**copy.deepcopy(get(name).spec), "starter": name}
