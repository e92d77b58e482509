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
from typing import Iterable, Mapping


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
    VOTE = "vote on answers"  # every role, viewers included: votes are the people's own (issue 34)
    EXPORT_FEEDBACK = "export feedback"  # writes a dataset into the data root, to train on: operators and admins


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
EVERYONE = (Action.VOTE,)
NOT_VIEWERS = (Action.START, Action.EXPORT_FEEDBACK)  # no owner: any operator may


def allowed(actor: Actor, action: Action, owner: str = "") -> bool:
    if actor.role is Role.ADMIN or action in EVERYONE:
        return True
    if actor.role is Role.VIEWER or action in ADMIN_ONLY:
        return False
    return action in NOT_VIEWERS or owner == actor.name


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

# What a child process (worker, preview, prompt renderer) inherits from the dashboard: an ALLOW-list. Anything
# else the dashboard's environment holds (DATABASE_URL with its password, PGPASSWORD, AWS_*, OPENAI_API_KEY,
# HUGGING_FACE_HUB_TOKEN, a judge key of another job...) never reaches a child unless its job names it
# (``needs``). A remote model's code (trust_remote_code) runs in the worker and can read all of its environment.
CHILD_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TMP", "TEMP",
    "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "CC", "CXX", "CUDA_HOME", "CUDA_PATH",
    # certificates and proxies for hub downloads
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    # Hugging Face caches and switches (not its tokens)
    "HF_HOME", "HF_ENDPOINT", "HF_MODULES_CACHE", "HF_ASSETS_CACHE", "HF_XET_CACHE", "HF_ALLOW_CODE_EVAL",
    "HUGGINGFACE_HUB_CACHE",
})
# Whole families of settings of the runtime a worker uses (threads, CUDA, NCCL, compilers, caches, logging).
CHILD_ENV_PREFIXES = ("LC_", "PYTHON", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA_", "NCCL_", "NVIDIA_", "CUBLAS_",
                      "CUDNN_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_", "HF_HUB_", "HF_DATASETS_",
                      "TRANSFORMERS_", "TOKENIZERS_", "DATASETS_", "UNSLOTH_", "ACCELERATE_", "BNB_", "ROCM_",
                      "HIP_", "HSA_", "VLLM_", "WANDB_", "TENSORBOARD_", "XDG_", "CONDA_", "COVERAGE_",
                      "FINETUNE_STUDIO_")
# A name with one of these words is a credential even inside an allowed family (WANDB_API_KEY, HF_HUB_TOKEN,
# FINETUNE_STUDIO_TEST_POSTGRES_URL's password): it reaches a child only when its job needs it.
SECRET_WORDS = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH",
                          "POSTGRES", "DATABASE", "DSN", "COOKIE"})


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


def looks_secret(name: str) -> bool:
    return bool(SECRET_WORDS & set(name.upper().split("_")))


# Set by a parent for one child only (Ray's restarted workers: the checkpoint to resume from), never inherited from
# the server's environment, where a leftover value would make every run resume from somewhere it did not choose.
PARENT_ONLY_ENV = frozenset({"FINETUNE_STUDIO_RESUME_FROM"})


def _inherited(name: str) -> bool:
    allowed_name = name in CHILD_ENV_NAMES or name.startswith(CHILD_ENV_PREFIXES)
    return allowed_name and not looks_secret(name) and name not in PARENT_ONLY_ENV


def worker_env(environ: Mapping[str, str], needs: Iterable[str] = ()) -> dict[str, str]:
    """The environment of a child process: the runtime settings of ``CHILD_ENV_NAMES``/``CHILD_ENV_PREFIXES``
    that ``environ`` holds, plus the variables the job ``needs`` (a hub push's HF_TOKEN, a judge key an
    admin declared), never the server's own secrets. Callers add the run's own secrets explicitly."""
    never = set(SERVER_SECRET_ENV) | secrets_file_keys()
    env = {k: v for k, v in environ.items() if _inherited(k) and k not in never}
    env.update({k: environ[k] for k in needs if k in environ and k not in never})
    return env


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """A child's environment without any secret (the preview and prompt children): ``worker_env`` with no needs."""
    return worker_env(environ)


# The sign-in service needs the server's authentication secrets and the database (it keeps the users), and
# nothing a worker or a hub needs: no HF_TOKEN, no W&B or cloud keys, no CLI token.
SIGNIN_ENV_NAMES = frozenset({"DATABASE_URL", "PGPASSWORD", "PGPASSFILE", "PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT",
                              "PGSSLKEY", "PGSERVICEFILE", "PGSERVICE", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE"})


def signin_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The sign-in service's environment: a child's runtime settings, every FINETUNE_STUDIO_* setting but the
    CLI's API token (the password, OIDC secret and session key included) and the database connection."""
    env = {k: v for k, v in environ.items() if _inherited(k) or k in SIGNIN_ENV_NAMES
           or (k.startswith("FINETUNE_STUDIO_") and k != "FINETUNE_STUDIO_TOKEN")}
    return env
