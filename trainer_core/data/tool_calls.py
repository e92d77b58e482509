"""Tool calls in conversations: the one normal form, results paired with their calls, and a model's
Hermes-style calls read back and scored. Standard library only: the data loader, the worker, the preview and
the serving side share it.

The normal form (what a training row holds once ``data.formats`` has read it, whatever the file's layout):

- ``row["tools"]``: JSON text of a list of OpenAI tools, ``{"type": "function", "function": {"name",
  "description", "parameters"}}``;
- an assistant turn that calls: ``{"role": "assistant", "content": "", "tool_calls": [{"id", "type": "function",
  "function": {"name", "arguments"}}]}`` with ``arguments`` as JSON text;
- a result: ``{"role": "tool", "content": "...", "tool_call_id": "...", "name": "..."}``.

Tools and arguments stay JSON text inside the datasets: Arrow merges the rows' schemas into one, so a tool's
parameters stored as nested objects would gain every other row's properties as nulls (a schema that no longer
says what the tool takes). They are parsed only when a conversation is rendered (``template_messages``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_ROLE = "tool"


class ToolFormatError(ValueError):
    """A tool list or call that cannot be read; the message says what is wrong with it."""


# ---------------------------------------------------------------------- the normal form
def json_value(value: Any) -> Any:
    """``value`` parsed when it is JSON text (how CSV, Arrow and the OpenAI format carry objects), else as is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ToolFormatError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
        except RecursionError:
            raise ToolFormatError("JSON nested too deeply") from None
    return value


def normalize_tool(tool: Any) -> dict:
    """One tool in the OpenAI form. Also takes the bare ``{"name", "description", "parameters"}`` of Hermes and
    xLAM files; xLAM's parameters (``{"city": {"type": "str", ...}}``) become a JSON Schema object."""
    if not isinstance(tool, dict):
        raise ToolFormatError("a tool must be an object like {\"type\": \"function\", \"function\": {\"name\": ...}}")
    function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
    if not isinstance(function, dict):
        raise ToolFormatError("a tool's 'function' must be an object with a 'name'")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolFormatError("a tool has no 'name'")
    out = {"name": name}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    parameters = json_value(function.get("parameters", {"type": "object", "properties": {}}))
    out["parameters"] = _schema_of_xlam(parameters) if _is_xlam_parameters(parameters) else parameters
    return {"type": "function", "function": out}


def normalize_tools(value: Any) -> list[dict]:
    """A row's tools (a list, or its JSON text; None or "" for none) in the OpenAI form."""
    if value is None or value == "":
        return []
    tools = json_value(value)
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise ToolFormatError("tools must be a list of tools")
    return [normalize_tool(tool) for tool in tools]


def normalize_call(call: Any, call_id: str) -> dict:
    """One call in the normal form: ``{"id", "type", "function": {"name", "arguments": JSON text}}``. Takes the
    OpenAI form and the bare ``{"name", "arguments"}`` of function_call turns and xLAM answers; arguments may be
    an object or its JSON text. ``call_id`` is used when the call has none."""
    call = json_value(call)
    if not isinstance(call, dict):
        raise ToolFormatError("a tool call must be an object with a function 'name' and 'arguments'")
    function = call.get("function", call)
    if not isinstance(function, dict):
        raise ToolFormatError("a tool call's 'function' must be an object with 'name' and 'arguments'")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolFormatError("a tool call has no function 'name'")
    arguments = json_value(function.get("arguments", function.get("parameters", {})))
    if not isinstance(arguments, dict):
        raise ToolFormatError(f"the arguments of the call to '{name}' must be a JSON object")
    given = call.get("id")
    return {"id": given if isinstance(given, str) and given else call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _is_xlam_parameters(parameters: Any) -> bool:
    return (isinstance(parameters, dict) and "type" not in parameters and bool(parameters)
            and all(isinstance(spec, dict) and isinstance(spec.get("type"), str) for spec in parameters.values()))


_XLAM_TYPES = {"str": "string", "string": "string", "int": "integer", "integer": "integer", "float": "number",
               "number": "number", "bool": "boolean", "boolean": "boolean", "list": "array", "dict": "object"}


def _schema_of_xlam(parameters: dict) -> dict:
    """xLAM's ``{"name": {"type": "List[int], optional", "description", "default"}}`` as a JSON Schema object."""
    properties, required = {}, []
    for name, spec in parameters.items():
        text = spec["type"].strip()
        optional = text.endswith(", optional") or "default" in spec
        base = text.removesuffix(", optional").split("[")[0].strip().lower()
        prop = {"type": _XLAM_TYPES[base]} if base in _XLAM_TYPES else {}
        if isinstance(spec.get("description"), str):
            prop["description"] = spec["description"]
        properties[name] = prop
        if not optional:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def is_tool_row(row: dict) -> bool:
    """Whether a normal-form row involves tools: it lists some, or a turn calls one or answers one."""
    if row.get("tools"):
        return True
    return any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == TOOL_ROLE)
               for m in row.get("messages") or [])


# ---------------------------------------------------------------------- results paired with their calls
def call_name(call: Any) -> str | None:
    """The function name of a call, or None for a malformed one (e.g. ``function`` given as a string)."""
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _call_id(call: Any) -> str | None:
    """The id of a well-formed call; a malformed call owns no result."""
    if call_name(call) is None:
        return None
    given = call.get("id")
    return given if isinstance(given, str) and given else None


def _owner(messages: list[dict], index: int) -> int | None:
    """The most recent assistant turn with tool calls before ``index``, never across a user turn."""
    for j in range(index - 1, -1, -1):
        role = messages[j].get("role")
        if role == "user":
            return None
        if role == "assistant" and messages[j].get("tool_calls"):
            return j
    return None


def pair_tool_results(messages: list[dict]) -> list[dict]:
    """``messages`` with every tool result carrying the id (and name) of the call it answers.

    A result without ``tool_call_id`` belongs to the most recent assistant turn with tool calls (never across
    a user turn): a call whose function name matches the result's ``name`` first, else the first call not yet
    answered. Ids that results give explicitly reserve their calls before any pairing, so ``[call_a, call_b]``
    answered by ``call_a`` and one result without an id resolves to ``call_b``. A malformed call (its
    ``function`` a string, or no name) owns nothing, so a result that only it could own falls through, like a
    result with no owner at all, to a made-up id (``call_<turn index>``, unique in the conversation). The input
    is not changed."""
    out = [dict(m) for m in messages]
    taken: dict[int, set[str]] = {}  # owner turn -> ids answered
    for i, message in enumerate(out):
        if message.get("role") == TOOL_ROLE and message.get("tool_call_id"):
            owner = _owner(out, i)
            if owner is not None:
                taken.setdefault(owner, set()).add(message["tool_call_id"])
    known = {cid for m in out for call in (m.get("tool_calls") or []) if (cid := _call_id(call))}
    known |= {m["tool_call_id"] for m in out if m.get("role") == TOOL_ROLE and m.get("tool_call_id")}
    for i, message in enumerate(out):
        if message.get("role") != TOOL_ROLE:
            continue
        owner = _owner(out, i)
        calls = [c for c in (out[owner]["tool_calls"] if owner is not None else []) if _call_id(c)]
        if not message.get("tool_call_id"):
            answered = taken.setdefault(owner, set()) if owner is not None else set()
            free = [c for c in calls if _call_id(c) not in answered]
            named = [c for c in free if message.get("name") and call_name(c) == message.get("name")]
            chosen = (named or free or [None])[0]
            if chosen is None:
                message["tool_call_id"] = _made_up_id(i, known)
            else:
                message["tool_call_id"] = _call_id(chosen)
                answered.add(message["tool_call_id"])
            known.add(message["tool_call_id"])
        if not message.get("name"):
            match = next((c for c in calls if _call_id(c) == message["tool_call_id"]), None)
            if match is not None:
                message["name"] = call_name(match)
    return out


def _made_up_id(index: int, known: set[str]) -> str:
    candidate, n = f"call_{index}", 0
    while candidate in known:
        n += 1
        candidate = f"call_{index}_{n}"
    return candidate


# ---------------------------------------------------------------------- rendering
def template_messages(row: dict) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) as chat templates take them: the nulls Arrow added to turns dropped, arguments and tools
    parsed from their JSON text (templates write ``arguments | tojson``). Tools None when the row lists none."""
    messages = []
    for message in row["messages"]:
        turn = {k: v for k, v in message.items() if v is not None}
        if turn.get("tool_calls"):
            turn["tool_calls"] = [{**call, "function": {"name": call["function"]["name"],
                                                        "arguments": json_value(call["function"]["arguments"])}}
                                  for call in turn["tool_calls"]]
        else:
            turn.pop("tool_calls", None)
        turn.setdefault("content", "")
        messages.append(turn)
    tools = normalize_tools(row.get("tools"))
    return messages, (tools or None)


def row_calls(row: dict) -> list[tuple[str, dict]]:
    """(name, arguments) of every call the row's assistant makes, in order."""
    return [(call["function"]["name"], json_value(call["function"]["arguments"]))
            for message in row.get("messages") or [] for call in (message.get("tool_calls") or [])]


def first_reply_case(row: dict) -> tuple[list[dict], list[tuple[str, dict]]] | None:
    """(the conversation before the first assistant reply, the calls that reply makes): one held-out question
    for a tool-call accuracy (no calls: the right answer is to call nothing). None without an assistant reply."""
    messages = row.get("messages") or []
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        return None
    return messages[:first], [(call["function"]["name"], json_value(call["function"]["arguments"]))
                              for call in (messages[first].get("tool_calls") or [])]


def tool_names(row: dict) -> list[str]:
    return [tool["function"]["name"] for tool in normalize_tools(row.get("tools"))]


# ---------------------------------------------------------------------- a model's calls read back and scored
_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCalls:
    calls: tuple[tuple[str, dict], ...]  # (name, arguments) of each call that parsed
    invalid: int  # <tool_call> blocks whose JSON did not parse into {"name", "arguments"}


def parse_hermes_calls(text: str) -> ParsedCalls:
    """The ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks of a Hermes-style answer (an
    unclosed last block counts: generation may stop at the end-of-turn token before the closing tag)."""
    calls, invalid = [], 0
    for body in _CALL_RE.findall(text):
        try:
            value = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            invalid += 1
            continue
        arguments = value.get("arguments", {}) if isinstance(value, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                arguments = None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(arguments, dict):
            invalid += 1
            continue
        calls.append((value["name"], arguments))
    return ParsedCalls(tuple(calls), invalid)


@dataclass(frozen=True)
class CallScore:
    name_correct: bool  # the same functions, in order
    exact: bool  # the same functions with exactly the same arguments (compared as JSON values)


def score_calls(expected: list[tuple[str, dict]], generated_text: str) -> CallScore:
    """One answer against the calls the reference makes. No expected calls: right when the model calls none."""
    got = list(parse_hermes_calls(generated_text).calls)
    names = [name for name, _ in got] == [name for name, _ in expected]
    return CallScore(name_correct=names, exact=names and got == list(expected))


def call_accuracy(scores: list[CallScore]) -> dict[str, float]:
    """{"name_accuracy", "exact_accuracy"}: the fraction of answers calling the right functions, and with
    exactly the right arguments too (0.0 for no answers)."""
    if not scores:
        return {"name_accuracy": 0.0, "exact_accuracy": 0.0}
    return {"name_accuracy": sum(s.name_correct for s in scores) / len(scores),
            "exact_accuracy": sum(s.exact for s in scores) / len(scores)}
