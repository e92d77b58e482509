"""A real API server process on a data root of its own, and the official ``openai`` client against it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from db import users
from db.store import Store
from tests.support import MODELS_CACHE, ROOT, wait_until
from trainer_core.auth.access import Role

SERVER = Path(__file__).with_name("api_server.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ApiServer:
    """``python tests/api/api_server.py`` (or any command given) with the data root ``home``; ``start`` again
    after ``kill`` is a restarted server on the same data."""

    def __init__(self, home: Path, allowed: Path, fake: dict[str, str] | None = None, command: list[str] | None = None,
                 extra_env: dict[str, str] | None = None):
        self.home, self.port = home, free_port()
        self.command = command
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "FINETUNE_STUDIO_"))}
        keep.pop("DATABASE_URL", None)
        self.env = {**keep, "PYTHONPATH": str(ROOT), "FINETUNE_STUDIO_HOME": str(home),
                    "FINETUNE_STUDIO_FORCE_CPU": "1", "FINETUNE_STUDIO_ALLOWED_ROOTS": str(allowed),
                    # the converted bundled model: the memory check reads its config.json, not the 6 s GGUF header
                    "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE),
                    "FAKE_LOSSES": "scripted", "FAKE_STEPS": "5", "FAKE_DELAY": "0", **(fake or {}),
                    **(extra_env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = home.parent / f"api-server-{self.port}.log"
        home.mkdir(parents=True, exist_ok=True)
        self.store = Store(f"sqlite:///{home}/studio.db")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "ApiServer":
        command = self.command or [sys.executable, str(SERVER), str(self.port)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

        def answers() -> bool:
            assert self.proc.poll() is None, f"the API server exited:\n{self.log_text()}"
            try:
                return httpx.get(f"{self.url}/models", timeout=2).status_code == 401
            except httpx.HTTPError:
                return False
        wait_until(answers, timeout=120, what="the API server")
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def token(self, name: str, role: Role) -> str:
        users.ensure_user(self.store, name, role)
        return users.create_token(self.store, name, "test")

    def client(self, name: str, role: Role = Role.OPERATOR) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=self.token(name, role), max_retries=0, timeout=120)


def status_when_ended(client: openai.OpenAI, job_id: str) -> str:
    """Poll once a second (each answer reads the run from the database): the job's status once it has ended."""
    status = client.fine_tuning.jobs.retrieve(job_id).status
    if status in ("queued", "running"):
        time.sleep(1)
    return status
