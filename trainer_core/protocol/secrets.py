"""The one table of secret config fields and the environment variables that carry them.

Secrets are never stored (DESIGN rule 7): a worker gets them in its environment, the CLI reads them from
its own, and a queued or resumed run takes them from memory or, failing that, from the server's
environment. Adding a secret is one line here."""
from __future__ import annotations

from typing import Mapping

# config field -> environment variable
SECRET_ENV = {"hf_token": "HF_TOKEN", "wandb_token": "WANDB_API_KEY"}
SECRET_FIELDS = tuple(SECRET_ENV)
ENV_NAMES = " / ".join(SECRET_ENV.values())
# Secrets of other job kinds, never config fields of a run: a recipe's teacher key (the studio's serve job's).
JOB_SECRET_ENV = {"teacher_key": "FINETUNE_STUDIO_TEACHER_KEY"}  # for messages: "set HF_TOKEN / WANDB_API_KEY ..."


def from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Secret field values found in ``environ`` ("" when unset)."""
    return {name: environ.get(var, "") for name, var in SECRET_ENV.items()}


def to_env(values: Mapping[str, str]) -> dict[str, str]:
    """Environment variables for the secret field values that are set."""
    known = {**SECRET_ENV, **JOB_SECRET_ENV}
    return {known[name]: value for name, value in values.items() if name in known and value}


def job_secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of the run's and job's secrets a worker holds (to redact from its output)."""
    return [environ[var] for var in (*SECRET_ENV.values(), *JOB_SECRET_ENV.values()) if environ.get(var)]
