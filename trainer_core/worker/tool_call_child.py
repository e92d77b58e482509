"""``python -m trainer_core.worker.tool_call_child``: the Playground's Python tool functions, run for one round of
calls (trainer_core.tryout.python_tools starts it in the sandbox). Reads {"calls": [{"name", "arguments"}], "tools":
{name: {"path", "function", "text", "sha256"}}, "max_chars"} on stdin and writes one JSON line, {"replies":
[{"result", "error"}]}, one per call in order.

Each tool's module is the text the dashboard checked and hashed (run only while its sha256 still matches), loaded once
and named after its file, so tracebacks point at the user's lines. Loading it and every call go through the GRPO
tools' guard (rewards.guard.guard_tool): what it raises, ``sys.exit``/``os._exit`` and a call past
FINETUNE_STUDIO_TOOL_TIMEOUT_S become that call's error, and the model gets ``{"error": ...}`` as its result, as
TRL's tool loop gives it in a GRPO run. What a function prints goes to stderr: stdout carries the reply alone.
"""
from __future__ import annotations

import contextlib
import json
import sys
import types
from typing import Any

from trainer_core.rewards.guard import ToolError, guard_tool
from trainer_core.rewards.spec import sha256_text


def _module(name: str, spec: dict) -> types.ModuleType:
    if sha256_text(spec["text"]) != spec["sha256"]:
        raise ToolError(f"tool '{name}': its code changed after it was checked (sha256 differs): try again")
    module = types.ModuleType(f"playground_tool_{name}")
    module.__file__ = spec["path"]
    code = compile(spec["text"], spec["path"], "exec")
    guard_tool(lambda: exec(code, module.__dict__), name, _quiet)()
    function = module.__dict__.get(spec["function"])
    if not callable(function):
        raise ToolError(f"tool '{name}': {spec['function']} in {spec['path']} is not a function")
    return module


def _quiet(message: str) -> None:
    """The guard's warnings: each error is already the call's own reply."""


def _text(value: Any) -> str:
    """A function's return value as the model reads it: text as it is, anything else as JSON (else its str)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def answer(call: dict, tools: dict, modules: dict, max_chars: int) -> dict:
    name = call["name"]
    try:
        spec = tools[name]
        if name not in modules:
            modules[name] = _module(name, spec)
        arguments = json.loads(call["arguments"]) if isinstance(call["arguments"], str) else call["arguments"]
        if not isinstance(arguments, dict):
            raise ToolError(f"tool '{name}' was called with arguments that are not a JSON object: "
                            f"{str(call['arguments'])[:200]}")
        result = _text(guard_tool(modules[name].__dict__[spec["function"]], name, _quiet)(**arguments))
        if len(result) > max_chars:
            raise ToolError(f"tool '{name}' returned {len(result):,} characters: a result may have at most "
                            f"{max_chars:,}")
        return {"result": result, "error": ""}
    except json.JSONDecodeError as exc:
        error = shown = f"tool '{name}' was called with arguments that are not JSON ({exc.msg})"
    except ToolError as exc:  # the model's context gets no host paths; the panel shows the line too
        error, shown = str(exc), str(exc) + (f" (at {exc.where})" if exc.where else "")
    return {"result": json.dumps({"error": error}, ensure_ascii=False), "error": shown}


def main() -> int:
    request = json.loads(sys.stdin.read())
    modules: dict = {}
    replies = []
    with contextlib.redirect_stdout(sys.stderr):
        for call in request["calls"]:
            replies.append(answer(call, request["tools"], modules, int(request["max_chars"])))
    print(json.dumps({"replies": replies}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
