"""The one table of secret config fields and the environment variables that carry them.

Secrets are never stored (DESIGN rule 7): a worker gets them in its environment, the CLI reads them from
its own, and a queued or resumed run takes them from memory or, failing that, from the server's
environment. Adding a secret is one line here."""
from __future__ import annotations

from typing import Mapping

# config field -> environment variable
SECRET_ENV = {"hf_token": "HF_TOKEN", "wandb_token": "WANDB_API_KEY"}
SECRET_FIELDS = tuple(SECRET_ENV)
ENV_NAMES = " / ".join(SECRET_ENV.values())  # for messages: "set HF_TOKEN / WANDB_API_KEY ..."


def from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Secret field values found in ``environ`` ("" when unset)."""
    return {name: environ.get(var, "") for name, var in SECRET_ENV.items()}


def to_env(values: Mapping[str, str]) -> dict[str, str]:
    """Environment variables for the secret field values that are set."""
    return {SECRET_ENV[name]: value for name, value in values.items() if name in SECRET_ENV and value}
