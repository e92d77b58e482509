"""The Playground's tool replies from a Python function (the Tools panel's third way, beside the person and a mock
reply), dashboard side: the file checked as custom rewards are (under the allowed roots, a .py file of at most 1 MB
that parses and defines the function: trainer_core.rewards.files), its text read once and hashed, only for an admin
(a shared server's other roles are refused, as for custom rewards), and every call of a round run in a child
process in the sandbox, ``python -m trainer_core.worker.tool_call_child``: the dashboard never imports user code.

The child runs the text that was checked and hashed (never the file again), each call with the GRPO tools' time limit
(``FINETUNE_STUDIO_TOOL_TIMEOUT_S``, 30 s: rewards.guard). A call that raises, exits or runs past it gives the model
``{"error": "tool 'NAME' raised ..."}`` as its result, and the panel shows the error naming the tool; a child that
does not answer in time is ended, and every call still without a result gets that error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainer_core.auth import access
from trainer_core.auth.access import Actor, Role
from trainer_core.protocol import files, sandbox
from trainer_core.protocol.errors import FieldError
from trainer_core.rewards import files as reward_files
from trainer_core.rewards.guard import TOOL_TIMEOUT_ENV, tool_time_limit
from trainer_core.rewards.spec import function_problem, sha256_text

ROOT = Path(__file__).resolve().parents[2]
RESULT_MAX = 32_000  # characters of one tool result (the person's, a mock's or a function's)
START_S = 60.0  # the child's own start (the sandbox, Python) on a loaded host, beyond the calls' time limits
POLL_S = 0.2  # how often a running child is checked for Stop
ADMIN_REASON = ("a Python tool function runs its code on this host: only an admin may use one on a shared server; "
                "give a mock reply or answer the calls yourself, or ask an admin")


@dataclass(frozen=True)
class PythonTool:
    """A tool answered by ``function`` of a file: the file's text as it was checked, and its sha256."""

    tool: str
    python: str  # the file as it was typed
    path: str  # resolved, under the allowed roots
    function: str
    text: str
    sha256: str

    @property
    def label(self) -> str:
        """Who answered, for the conversation's download: the file, the function and the code's hash."""
        return f"python {self.path}:{self.function} (sha256 {self.sha256[:12]})"


@dataclass(frozen=True)
class Reply:
    result: str  # what the model is given
    error: str = ""  # "" when the call returned; else what went wrong, naming the tool (the panel shows it)


def load(actor: Actor, tool: str, python: str, function: str = "") -> tuple[PythonTool | None, list[FieldError]]:
    """The tool's Python function (``function`` defaults to the tool's name), or the problems naming the field and
    the fix. Only an admin may run user code (a single-user server's local user is one). Nothing is executed."""
    function = function.strip() or tool
    file_field, function_field = f"{tool}: Python file", f"{tool}: function"
    if actor.role is not Role.ADMIN:
        return None, [FieldError(file_field, ADMIN_REASON)]
    path, text, problem = reward_files.read_source(python.strip(), "tool")
    if problem:
        return None, [FieldError(file_field, problem)]
    problem = function_problem(text, function, "tool")
    if problem and problem.startswith("the file does not parse"):
        return None, [FieldError(file_field, f"{python.strip()}: {problem}")]
    if problem:
        return None, [FieldError(function_field, f"{problem}: name a function of {path.name} (left empty, the "
                                                 f"tool's name, {tool}, is used)")]
    return PythonTool(tool, python.strip(), str(path), function, text, sha256_text(text)), []


def run_calls(tools: dict[str, PythonTool], calls: list[dict], cancel: threading.Event | None = None
              ) -> list[Reply] | None:
    """Each call (OpenAI form) answered by its tool's function, in one sandboxed child; None when ``cancel`` was
    set while it ran (the child is ended). Every call's tool must be in ``tools``."""
    request = {"calls": [{"name": call["function"]["name"], "arguments": call["function"].get("arguments") or "{}"}
                         for call in calls],
               "tools": {name: {"path": tool.path, "function": tool.function, "text": tool.text,
                                "sha256": tool.sha256} for name, tool in tools.items()
                         if any(call["function"]["name"] == name for call in calls)},
               "max_chars": RESULT_MAX}
    limit = tool_time_limit()
    deadline_s = START_S + (limit * len(calls) if limit else 300.0)
    env = {**access.child_env(os.environ),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        # the sandbox shows each tool's folder read-only (a function may read files beside it), nothing else of ours
        command = sandbox.child_command([sys.executable, "-m", "trainer_core.worker.tool_call_child"],
                                        {"files": sorted({t["path"] for t in request["tools"].values()})}, env)
    except sandbox.SandboxError as exc:
        return _all_failed(calls, f"the tool could not run: {exc}")
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    stdout, stderr, started = "", "", time.monotonic()
    payload: str | None = json.dumps(request)
    while True:
        try:
            stdout, stderr = proc.communicate(payload, timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            payload = None  # sent with the first call; retries only wait
            if cancel is not None and cancel.is_set():
                _end(proc)
                return None
            if time.monotonic() - started > deadline_s:
                _end(proc)
                return _all_failed(calls, f"the tool process did not answer in {deadline_s:.0f} s and was ended "
                                          f"(each call may take {limit:g} s: {TOOL_TIMEOUT_ENV})")
    reply = files.last_json_line(stdout)
    if not isinstance(reply, dict) or len(reply.get("replies") or []) != len(calls):
        return _all_failed(calls, f"the tool process failed (exit {proc.returncode}): {stderr.strip()[-500:]}")
    return [Reply(str(r["result"]), str(r.get("error") or "")) for r in reply["replies"]]


def _end(proc: subprocess.Popen) -> None:
    proc.kill()  # the sandbox's shell: bubblewrap and the child die with it
    proc.communicate()


def _all_failed(calls: list[dict], why: str) -> list[Reply]:
    out = []
    for call in calls:
        error = f"tool '{call['function']['name']}': {why}"
        out.append(Reply(json.dumps({"error": error}, ensure_ascii=False), error))
    return out
