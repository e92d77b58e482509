"""Secrets never reach worker.log: fd-level redaction of everything the worker process prints."""
from __future__ import annotations

import os
import sys
import threading


class OutputRedactor:
    """Everything this process writes to stdout/stderr (libraries and C extensions included) passes
    through a pipe and reaches worker.log with the secrets replaced by ***.

    File descriptors 1 and 2 are pointed at the pipe; a thread copies it to the original log file."""

    def __init__(self, secrets: list[str]):
        self.secrets = [s.encode() for s in secrets if s]
        self._log_fd = os.dup(1)  # worker.log, opened by the orchestrator
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._reader = os.fdopen(read_fd, "rb", buffering=0)
        self._thread = threading.Thread(target=self._copy, daemon=True, name="redactor")
        self._thread.start()

    def _copy(self) -> None:
        pending = b""
        while True:
            chunk = self._reader.read(65536)
            if not chunk:
                break
            pending += chunk
            cut = pending.rfind(b"\n") + 1  # whole lines only, so a secret is never split across writes
            if cut:
                self._write(pending[:cut])
                pending = pending[cut:]
        if pending:
            self._write(pending)

    def _write(self, data: bytes) -> None:
        for secret in self.secrets:
            data = data.replace(secret, b"***")
        os.write(self._log_fd, data)

    def close(self) -> None:
        """Restore stdout/stderr to the log and drain the pipe (call before exiting)."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._log_fd, 1)  # closes the pipe's write ends held by fds 1 and 2
        os.dup2(self._log_fd, 2)
        self._thread.join(timeout=10)
