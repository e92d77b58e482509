"""worker.log stays bounded, and secrets never reach it.

The launcher opens worker.log and hands it to the worker as fd 1 and 2 (trainer_core/launchers/local.py; Ray's
entry does the same). Anything in the worker can write there without limit: a reward that prints per completion
wrote 184 MB in 12 steps. So the worker, first thing (``python -m trainer_core.worker``), points fd 1 and 2 at a
pipe; a thread copies the pipe to the log, with the secrets replaced by ***, and keeps:

* the first ``HEAD_BYTES`` (model load, data, the first steps and warnings), cut at a line's end, then a note
  saying that the log is capped;
* past them, only the newest output: when more than ``2 * TAIL_BYTES`` lie after the note, the file is cut back
  to the note, a line counting the bytes left out so far is written, then the newest ``TAIL_BYTES``.

So the file never passes about HEAD + 2 x TAIL bytes, and its end (what the run did last, its error) is always on
disk, even after kill -9: the dashboard's log tail and error read the end. Libraries, C extensions and child
processes write through the same pipe. A torchrun rank's own file is tailed into worker.log by torchrun, which reads
on from its offset and would go silent on a file cut back: there (``trim=False``) the file only grows, and the newest
TAIL_BYTES are written when the rank ends (worker/launch.py caps worker.log itself). Only a regular file is capped (a terminal or a pipe, when someone runs the
worker by hand, gets everything, redacted). Cost: one copy of the output in memory at most 2 x TAIL_BYTES, and each
byte past the head written about twice.
"""
from __future__ import annotations

import os
import select
import stat
import sys
import threading

HEAD_BYTES = 4 << 20
TAIL_BYTES = 4 << 20
LINE_BYTES = 64 << 10  # a "line" longer than this (no newline) is written in pieces, so pending output stays small


class BoundedOutput:
    """fd 1 and 2 of this process through a pipe to the file they were, redacted and capped. ``close()`` before
    the process ends (what is still in the pipe is written then)."""

    def __init__(self, secrets: list[str], head_bytes: int | None = None, tail_bytes: int | None = None,
                 trim: bool = True):
        self.secrets = [s.encode() for s in secrets if s]
        self.keep = max((len(s) for s in self.secrets), default=1) - 1  # bytes held back: a secret may be cut there
        self.head, self.tail, self.trim = head_bytes or HEAD_BYTES, tail_bytes or TAIL_BYTES, trim
        self._log = os.dup(1)
        self.capped = stat.S_ISREG(os.fstat(self._log).st_mode)
        self.written = 0  # bytes of output in the head so far
        self.cut_at: int | None = None  # the file's size after the head and its note
        self.after = 0  # bytes written after the note
        self.recent = bytearray()  # the newest output past the head (at most 2 x tail)
        self.left_out = 0
        self._closing = threading.Event()
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._read_fd = read_fd
        self._thread = threading.Thread(target=self._copy, daemon=True, name="bounded-log")
        self._thread.start()

    # ------------------------------------------------------------------ the copying thread
    def _copy(self) -> None:
        pending = b""
        while True:
            ready, _, _ = select.select([self._read_fd], [], [], 0.5)
            if not ready:
                if self._closing.is_set():  # a child that outlived us may hold the pipe open: don't wait for it
                    break
                continue
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                break
            pending = self._redact(pending + chunk)
            cut = pending.rfind(b"\n") + 1  # whole lines, so a secret is never split across writes
            if not cut and len(pending) > LINE_BYTES:
                cut = len(pending) - self.keep  # redacted already; a secret cannot end in the bytes held back
            if cut:
                self._write(pending[:cut])
                pending = pending[cut:]
        if pending:
            self._write(pending)
        if not self.trim and self.after:  # the file only grew: the newest output goes at its end now
            newest = bytes(self.recent[-self.tail:])
            self.left_out = self.after - len(newest)
            _write_all(self._log, f"---- {self.left_out:,} bytes of output left out here ----\n".encode() + newest)
        os.close(self._read_fd)

    def _redact(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, b"***")
        return data

    def _write(self, data: bytes) -> None:
        if not self.capped:
            _write_all(self._log, data)
            return
        if self.cut_at is None:
            room = self.head - self.written
            if len(data) <= room:
                _write_all(self._log, data)
                self.written += len(data)
                return
            end = data.rfind(b"\n", 0, room) + 1 or room  # the head ends at a line's end where it can
            _write_all(self._log, data[:end] + self._note())
            self.cut_at = os.fstat(self._log).st_size
            data = data[end:]
        if self.trim:
            _write_all(self._log, data)
        self.after += len(data)
        self.recent += data
        if len(self.recent) > 2 * self.tail:
            del self.recent[:-self.tail]
        if self.trim and self.after > 2 * self.tail:
            self._trim()

    def _note(self) -> bytes:
        newest = (f"the newest {self.tail} to {2 * self.tail}" if self.trim else
                  f"the newest {self.tail}, written when the worker ends")
        return (f"\n---- worker.log is capped: it keeps the first {self.head} bytes of the worker's output and "
                f"{newest}; what lies between is left out, and counted below ----\n").encode()

    def _trim(self) -> None:
        newest = bytes(self.recent[-self.tail:])
        self.left_out += self.after - len(newest)
        os.ftruncate(self._log, self.cut_at)
        os.lseek(self._log, self.cut_at, os.SEEK_SET)  # a file opened without O_APPEND writes on from here
        line = f"---- {self.left_out:,} bytes of output left out here ----\n".encode()
        _write_all(self._log, line + newest)
        self.after = len(newest)

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """Point fd 1 and 2 back at the file and write what is still in the pipe."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._log, 1)  # closes this process's write ends of the pipe
        os.dup2(self._log, 2)
        self._closing.set()
        self._thread.join(timeout=10)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
