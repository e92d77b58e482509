"""What the worker of every job kind other than training shares (serve, eval, export): its event log, SIGTERM
as Cancel, a heartbeat so the dashboard knows it is alive, Stop/Cancel requests, and reporting status, warnings
and failures with its secrets redacted. Training has its own (worker/train.py: ranks, torchrun)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import RunStatus

HEARTBEAT_S = 2.0
TRACEBACK_CHARS = 8000


class JobWorker:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.events = ev.EventWriter(self.run_dir / ev.LOG_NAME)
        self.sigterm = threading.Event()  # the watchdog or the launcher asks it to end: treated as Cancel
        self.done = threading.Event()  # set when the job ends: the heartbeat (and any watcher) stops
        self.secrets: list[str] = []  # values replaced by *** in everything it reports

    def begin(self) -> None:
        """Call first in ``run``: SIGTERM becomes a Cancel request, and the heartbeat starts."""
        signal.signal(signal.SIGTERM, lambda *_: self.sigterm.set())
        threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat").start()

    def end(self) -> None:
        """Call last in ``run`` (a finally): the heartbeat stops and the event log is closed."""
        self.done.set()
        self.events.close()

    def requested(self) -> control.Action | None:
        """Stop or Cancel asked for through control.json, or Cancel by SIGTERM; None to go on."""
        if self.sigterm.is_set():
            return control.Action.CANCEL
        return control.read(self.run_dir)

    def status(self, status: RunStatus, phase: str, message: str = "", **fields: str) -> None:
        self.log(f"[{status.value}] {phase} {message}".rstrip())
        self.events.emit(ev.StatusEvent(status=status.value, phase=phase, message=message, **fields))

    def warn(self, message: str) -> None:
        message = self.redact(message)
        self.log(f"warning: {message}")
        self.events.emit(ev.WarningEvent(message=message))

    def report_error(self, message: str, exc: BaseException) -> None:
        """The job failed: ``message`` for people, the traceback to worker.log and the event."""
        tb = self.redact("".join(traceback.format_exception(exc)))
        print(tb, file=sys.stderr, flush=True)
        self.events.emit(ev.ErrorEvent(message=self.redact(message), exc_type=type(exc).__name__,
                                       traceback=tb[-TRACEBACK_CHARS:]))

    def log(self, message: str) -> None:
        print(self.redact(message), flush=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def _heartbeat(self) -> None:
        pid = os.getpid()
        while not self.done.wait(HEARTBEAT_S):
            self.events.emit(ev.HeartbeatEvent(pid=pid))
