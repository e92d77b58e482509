"""Conversations with tool calls read from the layouts people have them in, into ``tool_calls``' normal form:

- OpenAI fine-tuning files: ``messages`` whose assistant turns carry ``tool_calls`` (arguments as JSON text or an
  object; the legacy single ``function_call`` too), ``role: "tool"`` (or ``"function"``) results with
  ``tool_call_id``, and a ``tools`` list per row;
- ShareGPT/Hermes files (LLaMA-Factory's layout): ``conversations`` with ``function_call`` turns whose value is
  the call's JSON (a list for parallel calls) and ``observation`` turns holding results, and a ``tools`` column;
- xLAM rows: ``query``, ``tools`` and ``answers`` (the calls that answer the query).

Each returns (row, None) or (None, reason) as ``data.formats``' converters do, so a bad row is dropped and counted
under its reason, never a crash. Standard library only.
"""
from __future__ import annotations

import json
from typing import Any

from trainer_core.data.tool_calls import (TOOL_ROLE, ToolFormatError, json_value, normalize_call, normalize_tools,
                                          pair_tool_results)

RESULT_ROLES = ("tool", "function", "observation", "ipython")  # a tool's answer
CALL_ROLES = ("function_call", "tool_call")  # ShareGPT: a turn whose value is the assistant's call(s)
BAD_TOOLS = "malformed tools"
BAD_CALL = "malformed tool call"
Converted = tuple[Any, "str | tuple[str, str] | None"]


def tool_row_wanted(row: dict, turns: list, tools_column: str = "tools") -> bool:
    """Whether a chat row involves tools (and so takes this reader): it lists tools, or a turn calls or answers."""
    if row.get(tools_column) not in (None, "", "[]", []):
        return True
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        if turn.get("tool_calls") or turn.get("function_call"):
            return True
        role = next((turn[k] for k in ("role", "from") if isinstance(turn.get(k), str)), "")
        if role.strip().lower() in RESULT_ROLES + CALL_ROLES:
            return True
    return False


def _text(value: Any) -> str | None:
    """A turn's content as text: objects (a tool's JSON answer) as JSON text; None when missing."""
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return json.dumps(value)
    return str(value)


def _calls(value: Any, turn_index: int) -> list[dict]:
    calls = json_value(value)
    calls = calls if isinstance(calls, list) else [calls]
    if not calls:
        raise ToolFormatError("a tool call turn holds no call")
    return [normalize_call(call, f"call_{turn_index}_{k}") for k, call in enumerate(calls)]


def read_conversation(row: dict, turns: list, roles: dict[str, str], role_keys: tuple[str, ...],
                      content_keys: tuple[str, ...], unsupported_role: str, tools_column: str = "tools") -> Converted:
    """An OpenAI ``messages`` or ShareGPT ``conversations`` row with tools, in the normal form (a turn whose role is
    neither a tool's nor in ``roles`` drops the row under ``unsupported_role``)."""
    try:
        tools = normalize_tools(row.get(tools_column))
    except ToolFormatError as exc:
        return None, (BAD_TOOLS, str(exc)[:120])
    messages: list[dict] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return None, "malformed turn"
        role_key = next((k for k in role_keys if isinstance(turn.get(k), str)), None)
        if role_key is None:
            return None, "malformed turn"
        raw_role = turn[role_key].strip().lower()
        content = _text(next((turn[k] for k in content_keys if k in turn), None))
        try:
            if raw_role in CALL_ROLES:
                calls = _calls(next((turn[k] for k in content_keys if k in turn), None), index)
                previous = messages[-1] if messages else None
                if previous and previous["role"] == "assistant" and previous.get("tool_calls") is not None:
                    previous["tool_calls"] += calls  # consecutive call turns: parallel calls of one reply
                elif previous and previous["role"] == "assistant" and not previous.get("tool_calls"):
                    previous["tool_calls"] = calls  # a reply's words, then its call
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": calls})
                continue
            if raw_role in RESULT_ROLES:
                messages.append({"role": TOOL_ROLE, "content": content or "",
                                 "tool_call_id": turn.get("tool_call_id") or None,
                                 "name": turn.get("name") if isinstance(turn.get("name"), str) else None})
                continue
            role = roles.get(raw_role)
            if role is None:
                return None, (unsupported_role, repr(turn[role_key][:40]))
            raw_calls = turn.get("tool_calls") or ([turn["function_call"]] if turn.get("function_call") else None)
            if role == "assistant" and raw_calls:
                messages.append({"role": "assistant", "content": content or "", "tool_calls": _calls(raw_calls, index)})
            elif content is not None and content.strip():
                messages.append({"role": role, "content": content})
        except ToolFormatError as exc:
            return None, (BAD_CALL, str(exc)[:120])
    return _finish(messages, tools)


def read_xlam(row: dict, query_column: str = "query") -> Converted:
    """An xLAM row: the user's query, answered by the calls in ``answers``."""
    query = row.get(query_column)
    if not isinstance(query, str) or not query.strip():
        return None, "missing query"
    try:
        tools = normalize_tools(row.get("tools"))
    except ToolFormatError as exc:
        return None, (BAD_TOOLS, str(exc)[:120])
    try:
        calls = _calls(row.get("answers"), 1)
    except ToolFormatError as exc:
        return None, (BAD_CALL, str(exc)[:120])
    return _finish([{"role": "user", "content": query}, {"role": "assistant", "content": "", "tool_calls": calls}],
                   tools)


def _finish(messages: list[dict], tools: list[dict]) -> Converted:
    roles = {m["role"] for m in messages}
    if not messages:
        return None, "empty conversation"
    if "assistant" not in roles:
        return None, "no assistant turn"
    if "user" not in roles:
        return None, "no user turn"
    paired = [{k: v for k, v in m.items() if v is not None} for m in pair_tool_results(messages)]
    return {"messages": paired, "tools": json.dumps(tools, ensure_ascii=False)}, None
