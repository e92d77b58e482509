"""Who may do what to a job, as the orchestrator asks it: a refusal is a RunRefused whose message says why."""
from __future__ import annotations

from trainer_core.auth import access


class RunRefused(RuntimeError):
    """A run that cannot be started or resumed, with the reason (e.g. no usable checkpoint)."""


def authorize(actor: access.Actor | None, action: access.Action, owner: str) -> None:
    """No actor: a caller inside this process that already decided (tests, the queue itself)."""
    if actor is not None:
        try:
            access.check(actor, action, owner)
        except access.NotAllowed as exc:
            raise RunRefused(f"Not allowed: {exc}") from None


def by_actor(actor: access.Actor | None) -> str:
    return f" by {actor.name}" if actor else ""
