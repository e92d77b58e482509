"""Who may do what, and which secrets of the server never reach a child process.

Roles: a viewer watches; an operator starts runs and stops, cancels, resumes, deletes and reorders
its own; an admin does everything to every run and manages users. The orchestrator checks these
rules for every action that names an actor (the pages and the CLI always do).
"""
from __future__ import annotations

import enum
import getpass
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping


class Role(str, enum.Enum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


class Action(str, enum.Enum):
    START = "start"
    STOP = "stop"
    CANCEL = "cancel"
    RESUME = "resume"
    DELETE = "delete"
    REORDER = "reorder"  # move or remove a queued run
    MANAGE_USERS = "manage users"
    MAINTAIN = "rebuild the database"


PAST_TENSE = {Action.STOP: "stop requested", Action.CANCEL: "cancel requested", Action.RESUME: "resumed",
              Action.DELETE: "deleted", Action.REORDER: "moved in the queue", Action.START: "started"}


@dataclass(frozen=True)
class Actor:
    name: str
    role: Role

    @staticmethod
    def local() -> "Actor":
        """The OS user running the dashboard or the CLI without a token: it owns the data root anyway."""
        return Actor(getpass.getuser(), Role.ADMIN)


class NotAllowed(PermissionError):
    """The actor's role does not allow the action; the message says why."""


ADMIN_ONLY = (Action.MANAGE_USERS, Action.MAINTAIN)


def allowed(actor: Actor, action: Action, owner: str = "") -> bool:
    if actor.role is Role.ADMIN:
        return True
    if actor.role is Role.VIEWER or action in ADMIN_ONLY:
        return False
    return action is Action.START or owner == actor.name


def check(actor: Actor, action: Action, owner: str = "") -> None:
    if allowed(actor, action, owner):
        return
    if actor.role is Role.VIEWER:
        raise NotAllowed(f"{actor.name} is a viewer and cannot {action.value} runs; an admin can make you an operator.")
    if action in ADMIN_ONLY:
        raise NotAllowed(f"only admins can {action.value}.")
    raise NotAllowed(f"this run belongs to {owner or 'nobody'}; operators can only {action.value} their own runs "
                     "(an admin can do it).")


# Secrets of the server itself: the shared password, the OIDC client secret, the session signing key
# and an API token the CLI was given. Workers and the preview child never need them (and remote code
# loaded with trust_remote_code could read them), so child environments are built without them.
SERVER_SECRET_ENV = ("FINETUNE_STUDIO_PASSWORD", "FINETUNE_STUDIO_OIDC_CLIENT_SECRET", "FINETUNE_STUDIO_SESSION_KEY",
                     "FINETUNE_STUDIO_TOKEN", "studio_password")
RUN_SECRET_ENV = ("HF_TOKEN", "WANDB_API_KEY")  # passed to a child only when its run was given them


def secrets_files(cwd: Path | None = None) -> list[Path]:
    """The files Streamlit reads for ``st.secrets``, later ones winning."""
    return [Path.home() / ".streamlit" / "secrets.toml", (cwd or Path.cwd()) / ".streamlit" / "secrets.toml"]


def secrets_file_keys() -> set[str]:
    """Root-level keys of the secrets files: Streamlit copies each one into its own os.environ at start
    (``studio_password`` included), from where a plain copy of the environment would hand it to a worker."""
    keys: set[str] = set()
    for path in secrets_files():
        try:
            keys |= {k for k, v in tomllib.loads(path.read_text(encoding="utf-8")).items() if not isinstance(v, dict)}
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue  # missing: nothing promoted; unparsable: Streamlit promotes nothing either
    return keys


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``environ`` without any secret; callers add the run's own secrets explicitly."""
    dropped = set(SERVER_SECRET_ENV + RUN_SECRET_ENV) | secrets_file_keys()
    return {k: v for k, v in environ.items() if k not in dropped}
