"""Server paths as each role may see them (issue 31, item 9): an admin sees a message as it is, absolute paths and
all; anyone else sees a path under a named root as "datasets/x.jsonl in the data root" and each root by its name,
never the server's folder layout. Only the rendering differs: messages keep their absolute paths, and the CLI (the
local admin, or a token's user at the host's shell) prints them as they are.

A path outside every named root is left as it is: it is what the person typed (or where a link they named leads).
"""
from __future__ import annotations

import re
from pathlib import Path

from trainer_core.auth.access import Actor, Role
from trainer_core.protocol import paths
from ui.auth import current_actor

_STOP = "\\s,;)'\"`"  # what ends a path inside a message


def named_roots() -> list[tuple[Path, str]]:
    """The server folders a message may name, most specific first where one holds another."""
    extra = paths.allowed_data_roots()[1:]
    return [(paths.data_root(), "the data root"), (paths.models_dir(), "the model cache"),
            *((root, f'the allowed folder "{root.name}"') for root in extra),
            (paths.hub_data_roots()[-1], "the datasets cache"), (paths.CHECKOUT, "the Finetune Studio folder"),
            (Path.cwd(), "the server's working folder")]


def relative(text: str, roots: list[tuple[Path, str]]) -> str:
    """``text`` with every path under one of ``roots`` written relative to it, and each root by its name."""
    spelled: dict[str, str] = {}
    for root, name in roots:
        for form in (str(root), str(root.resolve())):
            if len(Path(form).parts) > 1:  # "/" would name every path
                spelled.setdefault(form.rstrip("/"), name)
    if not spelled:
        return text
    alternatives = "|".join(re.escape(s) for s in sorted(spelled, key=len, reverse=True))
    pattern = re.compile(f"(?P<root>{alternatives})(?P<rest>/[^{_STOP}]*[^{_STOP}.:])?(?=[{_STOP}.:/]|$)")

    def named(match: re.Match) -> str:
        name, rest = spelled[match["root"]], match["rest"]
        return f"{rest.lstrip('/')} in {name}" if rest and rest != "/" else name

    return pattern.sub(named, text)


def for_actor(text: object, actor: Actor) -> str:
    """``text`` as ``actor`` may read it: as it is for an admin, with server paths named for anyone else."""
    text = "" if text is None else str(text)
    return text if actor.role is Role.ADMIN else relative(text, named_roots())


def shown(text: object, actor: Actor | None = None) -> str:
    """``for_actor`` for the person of this session (``actor`` when the page already has it)."""
    return for_actor(text, actor or current_actor())
