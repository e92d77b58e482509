"""A chat request with tools, checked and shaped for the engine (the key gate calls it; no ML stack, no sibling of
the gate at import time: the gate imports this module only when a request carries tools or tool turns, which only
the chat engines' processes see).

OpenAI's fields: ``tools`` (function tools with a JSON Schema each), ``tool_choice`` (``auto``, ``none``,
``required`` or ``{"type": "function", "function": {"name": ...}}``), ``parallel_tool_calls``, assistant turns with
``tool_calls`` and ``role: "tool"`` results. Every problem is a ``ToolRequestError`` naming the field and the fix
(the gate answers 400 with it), never an engine's 500. Results without a ``tool_call_id`` are paired with their
call by the walk-back rule (``data.tool_calls.pair_tool_results``).

transformers serve takes ``tools`` (rendered by the model's chat template) and parses the model's calls back with
the model's response template (worker/serve_tools.py), but rejects ``tool_choice`` and ``parallel_tool_calls``: for
it, ``none`` sends no tools, a named function sends that tool alone, ``required`` is refused (it cannot force a
call; vLLM can), and ``parallel_tool_calls`` is accepted and not sent (the calls the model writes come back).
"""
from __future__ import annotations

import json
import re
from typing import Any

from trainer_core.data.tool_calls import pair_tool_results

MAX_TOOLS = 128
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
CHOICES = ("auto", "none", "required")
# What the transformers engine rejects; the gate decides them here instead
ENGINE_REJECTS = ("tool_choice", "parallel_tool_calls")


class ToolRequestError(ValueError):
    """A request's tool fields that cannot be served; the message names the field and the fix."""


def has_tools(body: dict) -> bool:
    """Whether the request carries tool fields or tool turns (the gate then calls ``shape``)."""
    if any(name in body for name in ("tools", "tool_choice", "parallel_tool_calls")):
        return True
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages)


def _schema_problem(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return "must be a JSON Schema object, e.g. {\"type\": \"object\", \"properties\": {...}}"
    if schema.get("type", "object") != "object":
        return f"must describe an object (its type is {str(schema.get('type'))[:30]!r}): the arguments are one object"
    try:
        import jsonschema  # the dashboard's dependency; the check is its own (meta-schema of the schema's draft)
    except ImportError:  # pragma: no cover - installed with the studio
        return None
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"is not a valid JSON Schema ({exc.message[:200]})"
    return None


def check_tools(tools: Any) -> list[str]:
    """The names of the request's tools; ToolRequestError for the first tool that is not an OpenAI function tool."""
    if not isinstance(tools, list) or not tools:
        raise ToolRequestError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {\"name\", "
                               "\"description\", \"parameters\"}} (or leave tools out)")
    if len(tools) > MAX_TOOLS:
        raise ToolRequestError(f"tools has {len(tools)} entries; at most {MAX_TOOLS} are accepted")
    names = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(tool.get("function"), dict):
            raise ToolRequestError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}: only function "
                                   "tools are served")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ToolRequestError(f"{where}.function.name must be 1-64 letters, digits, _ or -, not "
                                   f"{str(name)[:40]!r}")
        if name in names:
            raise ToolRequestError(f"{where}.function.name {name!r} is given twice: each tool once")
        if "description" in function and not isinstance(function["description"], str):
            raise ToolRequestError(f"{where}.function.description must be text")
        if "parameters" in function:
            problem = _schema_problem(function["parameters"])
            if problem:
                raise ToolRequestError(f"{where}.function.parameters {problem}")
        names.append(name)
    return names


def choice_of(value: Any, names: list[str]) -> str:
    """``auto``, ``none``, ``required`` or the name of the one function the request asks for."""
    if value is None:
        return "auto" if names else "none"
    if isinstance(value, str):
        if value not in CHOICES:
            raise ToolRequestError(f"tool_choice must be auto, none, required or {{\"type\": \"function\", "
                                   f"\"function\": {{\"name\": ...}}}}, not {value[:30]!r}")
        if value != "none" and not names:
            raise ToolRequestError(f"tool_choice {value!r} needs tools: send the tools the model may call")
        return value
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ToolRequestError("tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": "
                               "{\"name\": ...}}")
    if name not in names:
        raise ToolRequestError(f"tool_choice names {name[:64]!r}, which is not in tools ({', '.join(names) or 'none'})")
    return name


def check_turns(messages: list) -> None:
    """Assistant calls as the engine reads them (arguments: a JSON object, as text or as an object) and tool results
    as text: a malformed turn would be the engine's 500."""
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        calls = message.get("tool_calls")
        if calls is not None:
            if message.get("role") != "assistant" or not isinstance(calls, list):
                raise ToolRequestError(f"messages[{i}].tool_calls: only an assistant turn has tool_calls, as a list")
            for j, call in enumerate(calls):
                where = f"messages[{i}].tool_calls[{j}]"
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise ToolRequestError(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": "
                                           "{\"name\", \"arguments\"}}")
                arguments = function.get("arguments", "{}")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments or "{}")
                    except ValueError:
                        raise ToolRequestError(f"{where}.function.arguments is not JSON: send the call's arguments "
                                               "as a JSON object (text or object)") from None
                if not isinstance(arguments, dict):
                    raise ToolRequestError(f"{where}.function.arguments must be a JSON object")
        if message.get("role") == "tool" and not isinstance(message.get("content"), (str, list)):
            raise ToolRequestError(f"messages[{i}].content: a tool result is text (the function's output)")


def shape(body: dict, engine_enforces_choice: bool) -> dict:
    """The request the engine gets: tools checked, results paired with their calls, ``tool_choice`` applied (by the
    engine when it enforces it, vLLM; here otherwise). Raises ToolRequestError."""
    names = check_tools(body["tools"]) if body.get("tools") is not None else []
    choice = choice_of(body.get("tool_choice"), names)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolRequestError(f"parallel_tool_calls must be true or false, not {str(parallel)[:20]!r}")
    messages = body.get("messages")
    if isinstance(messages, list):
        check_turns(messages)
        body = {**body, "messages": pair_tool_results([m for m in messages if isinstance(m, dict)])}
    if engine_enforces_choice:
        return body
    if choice == "required":
        raise ToolRequestError("tool_choice 'required' cannot be enforced by this server's engine (transformers "
                               "serve): send auto, or name the function the model must call")
    body = {k: v for k, v in body.items() if k not in ENGINE_REJECTS}
    if choice == "none":
        body.pop("tools", None)
    elif choice != "auto":  # one named function: the only tool the model is shown
        body["tools"] = [t for t in body["tools"] if t["function"]["name"] == choice]
    return body
