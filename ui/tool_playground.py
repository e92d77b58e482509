"""The Playground's Tools panel, without Streamlit: the tool schemas offered to the models (JSON, checked as the serve
gate checks them; prefilled from a run's training data), the steps of an answer that calls tools (the calls, then
their results: typed by the person, or a fixed mock reply per tool), and those steps as the conversation the model
is asked again with. ``ui/playground.py`` streams the steps; ``pages/playground.py`` lays them out."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from trainer_core.config import FieldError
from trainer_core.data import DatasetError, loading
from trainer_core.data.tool_calls import ToolFormatError, json_value, normalize_tools
from trainer_core.data.tool_schema import schema_problem
from trainer_core.specs import model_source

MAX_TOOL_STEPS = 5  # tool rounds in one answer before the Playground stops asking (a model calling in a loop)
TOOLS_SHOWN = 20  # tools prefilled from a dataset at most
RESULT_MAX = 32_000  # characters of one tool result


@dataclass
class ToolStep:
    """One round of an answer: what the model wrote before its calls, the calls (OpenAI form, arguments as JSON
    text), and their results in order (None until each call has one)."""

    content: str
    calls: list[dict]
    results: list[str] | None = None


@dataclass
class ToolSetup:
    """What the models are offered: the tools, and a mock reply per tool name ("" or absent: the person answers)."""

    tools: list[dict] = field(default_factory=list)
    mocks: dict[str, str] = field(default_factory=dict)


def dataset_tools(run_id: str) -> list[dict]:
    """The tools a run's training data lists (each name once, in order of first use), [] when it lists none or
    cannot be read (the panel then starts empty)."""
    try:
        cfg = model_source.run_config(run_id)
        data = loading.load_local(list(cfg.local_datasets), cfg, field_name="local_datasets", apply_slice=False)
    except (model_source.SourceError, DatasetError, OSError, ValueError):
        return []
    found: dict[str, dict] = {}
    for row in data.rows:
        try:
            tools = normalize_tools(row.get("tools"))
        except ToolFormatError:
            continue
        for tool in tools:
            found.setdefault(tool["function"]["name"], tool)
        if len(found) >= TOOLS_SHOWN:
            break
    return list(found.values())[:TOOLS_SHOWN]


def tools_text(tools: list[dict]) -> str:
    return json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""


def parse_tools(text: str) -> tuple[list[dict], list[FieldError]]:
    """The tools typed in the panel (a JSON list of OpenAI tools, or of bare ``{"name", "parameters"}``), or every
    problem naming the field ``tools`` and the fix. Empty text: no tools."""
    if not text.strip():
        return [], []
    try:
        tools = normalize_tools(text)
    except ToolFormatError as exc:
        return [], [FieldError("tools", f"{exc}: give a JSON list such as [{{\"type\": \"function\", \"function\": "
                                        "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
                                        "\"properties\": {\"city\": {\"type\": \"string\"}}}}}]")]
    errors = [FieldError("tools", problem.removeprefix("tools: ")) for tool in tools
              if (problem := schema_problem(tool))]
    names = [tool["function"]["name"] for tool in tools]
    errors += [FieldError("tools", f"two tools are named '{name}': give each tool its own name")
               for name in dict.fromkeys(n for n in names if names.count(n) > 1)]
    return (tools if not errors else []), errors


def mock_results(calls: list[dict], mocks: dict[str, str]) -> list[str] | None:
    """Each call's mock reply, when every called tool has one; None when the person must answer."""
    replies = [mocks.get(call["function"]["name"], "") for call in calls]
    return replies if all(replies) else None


def call_text(call: dict) -> str:
    """A call as the page shows it (as code, never markup): ``name({...})`` with its arguments pretty-printed, or
    the text the model sent when its arguments are not JSON."""
    function = call.get("function") or {}
    try:
        arguments = json.dumps(json_value(function.get("arguments") or "{}"), indent=2, ensure_ascii=False)
    except ToolFormatError:
        arguments = str(function.get("arguments"))
    return f"{function.get('name', '?')}({arguments})"


def step_messages(steps: list[ToolStep]) -> list[dict]:
    """The answered steps as the conversation continues them: the assistant's calls, then one ``tool`` message per
    result with its call's id and name (a step still waiting for results is left out)."""
    messages: list[dict] = []
    for step in steps:
        if step.results is None:
            continue
        messages.append({"role": "assistant", "content": step.content, "tool_calls": step.calls})
        messages += [{"role": "tool", "tool_call_id": call.get("id") or f"call_{i}",
                      "name": call["function"]["name"], "content": result}
                     for i, (call, result) in enumerate(zip(step.calls, step.results))]
    return messages


def check_results(results: list[str]) -> list[FieldError]:
    """The person's tool results: each given, without NUL, within the size limit."""
    errors = []
    for i, result in enumerate(results, 1):
        if not result.strip():
            errors.append(FieldError("tool result", f"call {i} has no result: type what the tool returned"))
        elif "\x00" in result or len(result) > RESULT_MAX:
            errors.append(FieldError("tool result", f"call {i}'s result must be text of at most {RESULT_MAX:,} "
                                                    "characters without NUL"))
    return errors
