"""The Playground's Tools panel, without Streamlit: the tool schemas offered to the models (JSON, checked as the serve
gate checks them; prefilled from a run's training data), the steps of an answer that calls tools (the calls, then
their results: typed by the person, a fixed mock reply per tool, or a Python function per tool run in a sandboxed
child: trainer_core/tryout/python_tools.py), and those steps as the conversation the model is asked again with.
``ui/playground.py`` streams the steps; ``pages/playground.py`` lays them out."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from trainer_core.auth.access import Actor
from trainer_core.config import FieldError
from trainer_core.data import DatasetError, loading
from trainer_core.data.tool_calls import ToolFormatError, json_value, normalize_tools
from trainer_core.data.tool_schema import schema_problem
from trainer_core.specs import model_source
from trainer_core.tryout import python_tools
from trainer_core.tryout.python_tools import RESULT_MAX, PythonTool

MAX_TOOL_STEPS = 5  # tool rounds in one answer before the Playground stops asking (a model calling in a loop)
TOOLS_SHOWN = 20  # tools prefilled from a dataset at most
MOCK, PERSON = "mock", "person"  # who answered a call (ToolStep.replied_by), beside a PythonTool's label


@dataclass
class ToolStep:
    """One round of an answer: what the model wrote before its calls, the calls (OpenAI form, arguments as JSON
    text), and their results in order (None until each call has one)."""

    content: str
    calls: list[dict]
    results: list[str] | None = None
    errors: list[str] | None = None  # per call: what went wrong in its Python function ("" when it returned)
    replied_by: list[str] | None = None  # per call: "person", "mock" or the Python function (file, name, sha256)


@dataclass
class ToolSetup:
    """What the models are offered: the tools, a mock reply per tool name, or a Python function ("" or absent in
    both: the person answers)."""

    tools: list[dict] = field(default_factory=list)
    mocks: dict[str, str] = field(default_factory=dict)
    python: dict[str, PythonTool] = field(default_factory=dict)

    def answers_itself(self, calls: list[dict]) -> bool:
        """Whether every call's tool has a mock reply or a Python function (else the person answers the round)."""
        return all(self.mocks.get(c["function"]["name"]) or c["function"]["name"] in self.python for c in calls)


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


def python_setup(actor: Actor, wanted: dict[str, tuple[str, str]], mocks: dict[str, str]
                 ) -> tuple[dict[str, PythonTool], list[FieldError]]:
    """The Python functions the panel names (tool -> (file, function); an empty file: none), each checked as a custom
    reward's file and only for an admin, or the problems naming the field and the fix."""
    found, errors = {}, []
    for tool, (python, function) in wanted.items():
        if not python.strip():
            continue
        if mocks.get(tool):
            errors.append(FieldError(f"{tool}: Python file", "the tool has a mock reply too: clear one of them"))
            continue
        loaded, problems = python_tools.load(actor, tool, python, function)
        errors += problems
        if loaded is not None:
            found[tool] = loaded
    return found, errors


def automatic_step(content: str, calls: list[dict], setup: ToolSetup,
                   cancel: threading.Event | None = None) -> ToolStep | None:
    """The round's step with every call answered by its mock reply or its Python function (run now, in a sandboxed
    child); None when Stop came while the functions ran. Only for calls ``setup.answers_itself``."""
    results, errors, by = [""] * len(calls), [""] * len(calls), [MOCK] * len(calls)
    python = [i for i, c in enumerate(calls) if c["function"]["name"] in setup.python]
    if python:
        replies = python_tools.run_calls(setup.python, [calls[i] for i in python], cancel)
        if replies is None:
            return None
        for i, reply in zip(python, replies):
            results[i], errors[i], by[i] = reply.result, reply.error, setup.python[calls[i]["function"]["name"]].label
    for i, call in enumerate(calls):
        if i not in python:
            results[i] = setup.mocks[call["function"]["name"]]
    return ToolStep(content, calls, results, errors, by)


def copy_step(step: ToolStep) -> ToolStep:
    """A step whose lists the caller may change (a streaming thread keeps writing to its own)."""
    return ToolStep(step.content, list(step.calls), *(None if v is None else list(v)
                                                      for v in (step.results, step.errors, step.replied_by)))


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
