"""Python validators: a recipe's own row checks, under the rules of custom GRPO rewards (rule 16).

The file must lie under the allowed roots, parse and define the function (checked with ``ast``, never imported, on
the dashboard side); ``snapshot`` copies it into the run folder's ``validators/`` with its sha256, and the worker
runs only that copy while its hash still matches. A recipe with one needs an admin in shared mode
(``validators.needs_admin``). The function takes the row (a dict, as JSON gives it) and returns True or None to
pass, False or a reason (text) to fail.

The functions run in a child process of the worker (``ValidatorProcess``), one call at a time with a time limit:
a call that raises fails its row with the exception's type and message; one that hangs past the limit, exits or
crashes the process fails its row too, and the next call starts a fresh process. Neither the job nor the thread
that checks rows can be held or ended by the user's code, and the child gets no secret (``access.child_env``).
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_core.auth import access
from trainer_core.protocol import paths
from trainer_core.rewards.spec import function_problem, read_reward_file, sha256_text

if TYPE_CHECKING:  # the spec is read by attribute: validators.py imports this module
    from trainer_core.recipes.validators import ValidatorSpec

FOLDER = "validators"
MANIFEST = "manifest.json"
TIMEOUT_ENV = "FINETUNE_STUDIO_VALIDATOR_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0  # one row: a check that takes longer is stuck, not thorough
LOAD_TIMEOUT_S = 60.0  # starting Python and loading the files (at least the call limit): a loaded host is slow
ADMIN_REASON = ("a Python validator runs its code on this host, so only an admin may start a recipe with one; use "
                "the json_schema, regex, length and sql validators, or ask an admin to start it.")
ROOT = Path(__file__).resolve().parents[2]


def parse_entry(entry: dict, at: str, problems: list, check_files: bool) -> tuple[str, str]:
    """(file, function) of a python validator entry; problems name ``at``.file or ``at``.function."""
    file, function = entry.get("file"), entry.get("function")
    if not isinstance(file, str) or not file.strip():
        problems.append((f"{at}.file", "give the path of a .py file under the allowed roots"))
        return "", ""
    if not isinstance(function, str) or not function.isidentifier():
        problems.append((f"{at}.function", "give the name of a function defined in the file"))
        return "", ""
    if check_files:
        for key, problem in source_problems(file.strip(), function):
            problems.append((f"{at}.{key}", problem))
    return file.strip(), function


def source_problems(file: str, function: str) -> list[tuple[str, str]]:
    """("file" or "function", why) for a validator file that cannot be used; nothing is executed."""
    path, problem = _source(file)
    if problem:
        return [("file", problem)]
    text = read_reward_file(path, "validator")
    try:
        ast.parse(text)
    except SyntaxError as exc:
        return [("file", f"{file} does not parse: line {exc.lineno}: {exc.msg}")]
    problem = function_problem(text, function, "validator")
    return [("function", f"{file}: {problem}")] if problem else []


def _source(file: str) -> tuple[Path | None, str | None]:
    problem = paths.path_problem(file)
    if problem:
        return None, problem
    try:
        path = paths.resolve_inside(Path(file).expanduser(), paths.allowed_data_roots())
    except paths.UnsafePathError as exc:
        return None, f"{exc}: a validator file must be under the allowed roots (FINETUNE_STUDIO_ALLOWED_ROOTS)"
    if path.suffix != ".py" or not path.is_file():
        return None, f"{file} is not a .py file"
    try:
        read_reward_file(path, "validator")
    except (OSError, ValueError) as exc:
        return None, str(exc)
    return path, None


def snapshot(specs: list[ValidatorSpec], run_dir: Path) -> list[dict]:
    """Copy every Python validator's file into ``run_dir/validators/``; returns the manifest rows (name, source,
    function, sha256). Raises ValueError naming a file that cannot be used."""
    rows = []
    for spec in specs:
        if spec.kind != "python":
            continue
        problems = source_problems(spec.file, spec.function)
        if problems:
            raise ValueError(f"validator {spec.name}: {problems[0][1]}")
        text = read_reward_file(_source(spec.file)[0], "validator")
        target = run_dir / FOLDER / f"{spec.name}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        rows.append({"name": spec.name, "source": spec.file, "function": spec.function, "sha256": sha256_text(text)})
    if rows:
        (run_dir / FOLDER / MANIFEST).write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return rows


def checked_copy(run_dir: Path, spec: ValidatorSpec) -> Path:
    """The run folder's copy of a validator file, refused when it no longer matches the hash taken at submit."""
    try:
        manifest = {row["name"]: row for row in json.loads((run_dir / FOLDER / MANIFEST).read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        raise RuntimeError(f"validator {spec.name}: the run folder has no readable {FOLDER}/{MANIFEST}; start the "
                           "recipe again so the validator file is copied") from None
    copy, row = run_dir / FOLDER / f"{spec.name}.py", manifest.get(spec.name)
    if row is None or not copy.is_file() or sha256_text(copy.read_text(encoding="utf-8")) != row.get("sha256"):
        raise RuntimeError(f"validator {spec.name}: {FOLDER}/{copy.name} is missing or was changed after the recipe "
                           "was submitted (its sha256 differs); start a new job with the edited file")
    return copy


def time_limit() -> float:
    """Seconds one call may take (FINETUNE_STUDIO_VALIDATOR_TIMEOUT_S, default 10)."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if 0 < value < float("inf") else DEFAULT_TIMEOUT_S


class _Ended(Exception):
    """The child process ended (or its pipe broke) before it answered."""


class ValidatorProcess:
    """The Python validators loaded in a child process; ``call(i, row)`` runs the i-th on a row. Loading (at start)
    that raises is a RuntimeError naming the validator: the recipe cannot check rows without it."""

    def __init__(self, specs: list[ValidatorSpec], run_dir: Path, timeout_s: float | None = None):
        self.specs = list(specs)
        self.timeout_s = time_limit() if timeout_s is None else timeout_s
        self._load = [{"name": s.name, "path": str(checked_copy(run_dir, s)), "function": s.function} for s in specs]
        self._process: subprocess.Popen | None = None
        self._buffer = b""
        self._lock = threading.Lock()  # one call at a time: the requests and replies share one pipe each way
        failure = self._start()
        if failure:
            raise RuntimeError(failure)

    def call(self, index: int, row: dict) -> str | None:
        """None when validator ``index`` passes ``row``, else why not."""
        with self._lock:
            return self._call(index, row)

    def _call(self, index: int, row: dict) -> str | None:
        try:
            request = json.dumps({"i": index, "row": row}, default=_jsonable).encode() + b"\n"
        except (TypeError, ValueError) as exc:  # a key that is not text, a row that holds itself
            return f"the row cannot be given to the validator as JSON ({exc})"
        if self._process is None:
            failure = self._start()  # after a call that hung or ended the process
            if failure:
                return failure
        try:
            reply = self._ask(request, self.timeout_s)
        except TimeoutError:
            self.close()
            return f"took longer than {self.timeout_s:g} s on this row and was ended (raise {TIMEOUT_ENV} if it " \
                   "needs longer)"
        except _Ended:
            code = self.close()
            return f"ended the validator process (exit code {code}): a validator returns its result and never exits"
        return reply.get("fail")

    def close(self) -> int | None:
        """End the child process (killed if a call still runs: the one that timed out); returns its exit code."""
        process, self._process, self._buffer = self._process, None, b""
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        code = process.wait()
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()
            except OSError:  # a request half written to a process that ended
                pass
        return code

    def _start(self) -> str | None:
        env = {**access.child_env(os.environ),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen([sys.executable, "-m", "trainer_core.recipes.user_code"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        limit = max(self.timeout_s, LOAD_TIMEOUT_S)
        try:
            reply = self._ask(json.dumps({"load": self._load}).encode() + b"\n", limit)
        except TimeoutError:
            self.close()
            return f"loading the Python validators took longer than {limit:g} s and was ended"
        except _Ended:
            code = self.close()
            return f"loading the Python validators ended their process (exit code {code}; see the worker log)"
        if "error" in reply:
            self.close()
            return reply["error"]
        return None

    def _ask(self, request: bytes, limit: float) -> dict:
        """The child's reply to one request line, within ``limit`` seconds (TimeoutError past it)."""
        try:
            self._process.stdin.write(request)
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Ended() from None
        deadline, out = time.monotonic() + limit, self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise TimeoutError()
            data = os.read(out, 1 << 16)
            if not data:
                raise _Ended()
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:  # the protocol's pipe written to by something else: the process cannot be trusted
            raise _Ended() from None


def _jsonable(value: Any) -> Any:
    """numpy and pandas values (a DataFrame's rows) as JSON gives them; anything else as its text."""
    for method in ("tolist", "item", "isoformat"):
        if hasattr(value, method):
            return getattr(value, method)()
    return str(value)


# ---------------------------------------------------------------------- the child process
def _result(function: Any, row: dict) -> dict:
    try:
        result = function(row)
    except BaseException as exc:  # noqa: BLE001 - user code, in its own process: whatever it raises fails the row
        return {"fail": f"raised {type(exc).__name__}: {exc}"[:1000]}
    if result is True or result is None:
        return {}
    if result is False:
        return {"fail": "returned False"}
    if isinstance(result, str):
        return {"fail": result[:1000] or "returned an empty reason"}
    return {"fail": f"returned a value of type {type(result).__name__}: return True or None to pass, False or a "
                    "reason (text) to fail"}


def _load(entry: dict) -> Any:
    module_spec = importlib.util.spec_from_file_location(f"studio_validator_{entry['name']}", entry["path"])
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    function = getattr(module, entry["function"], None)
    if not callable(function):
        raise TypeError(f"{entry['function']} is not a function")
    return function


def _serve() -> None:
    """Answer the parent's requests, one JSON line each; the user's prints go to stderr (the worker log)."""
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdin, sys.stdout = open(os.devnull), sys.stderr

    def reply(message: dict) -> None:
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    functions = []
    for entry in json.loads(requests.readline())["load"]:
        try:
            functions.append(_load(entry))
        except BaseException as exc:  # noqa: BLE001 - user code: the parent reports it, naming the validator
            reply({"error": f"validator {entry['name']}: loading its file raised {type(exc).__name__}: {exc}"[:1000]})
            return
    reply({})
    for line in requests:  # ends when the parent closes the pipe or ends
        request = json.loads(line)
        reply(_result(functions[request["i"]], request["row"]))


if __name__ == "__main__":
    _serve()
