"""GRPO tools (issue 32): grpo.tools read and checked without running the files (each problem naming its field and the
fix), admin-only like Python rewards, copied into the run with their sha256, and every call guarded (a tool that
raises, exits or hangs is an error result naming it and one warning, never a dead worker); the trajectory of a rollout
travels in its sample event, is stored, and reads back as turns."""
from __future__ import annotations

import inspect
import json
import os
import sys
import time

import pytest

from trainer_core.config import TrainConfig
from trainer_core.methods import grpo as grpo_method
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.protocol import events as ev
from trainer_core.rewards import tools
from trainer_core.rewards.guard import TOOL_TIMEOUT_ENV, ToolError, guard_tool

GOOD = '''
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def _helper():
    return 1
'''


@pytest.fixture
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path))
    return tmp_path


def config(**grpo) -> TrainConfig:
    return TrainConfig(model_name="m", method="grpo", batch_size=4, max_seq_length=512,
                       method_settings=GRPOSettings(**{"rewards": [{"type": "length"}], **grpo}))


def tool_problems(cfg: TrainConfig) -> list[tuple[str, str]]:
    return [(e.field, e.message) for e in grpo_method.validate(cfg) if e.field.startswith("grpo.tools")
            or e.message.startswith("tools run")]


def test_tool_entries_are_files_or_picked_functions():
    specs, problems = tools.parse_tools(["calc.py", {"python": " web.py ", "functions": ["search"]}])
    assert specs == [tools.ToolFile("calc.py"), tools.ToolFile("web.py", ("search",))] and problems == []
    _, problems = tools.parse_tools([42, {"python": ""}, {"python": "a.py", "functions": ["not a name"]},
                                     {"python": "a.py", "timeout": 3}])
    assert problems == [
        ("grpo.tools[0]", "must be a file path or {python: FILE, functions: [NAME, ...]}"),
        ("grpo.tools[1].python", "give the path of a .py file under the allowed roots"),
        ("grpo.tools[2].functions", "a list of function names defined in the file (leave it out for every public "
                                    "function)"),
        ("grpo.tools[3].timeout", "a tool file takes python and functions only")]
    assert tools.parse_tools("calc.py")[1] == [("grpo.tools", "must be a list of Python files, e.g. [tools/calc.py]")]


def test_a_good_tool_file_passes_and_offers_its_public_functions(roots):
    (roots / "calc.py").write_text(GOOD)
    assert tool_problems(config(tools=[str(roots / "calc.py")])) == []
    assert tools.source_problem(tools.ToolFile(str(roots / "calc.py")))[1] == ["add"]


def test_bad_tool_files_name_the_field_and_the_fix(roots, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "calc.py"
    outside.write_text(GOOD)
    (roots / "empty.py").write_text("X = 1\n\ndef _private():\n    pass\n")
    (roots / "loose.py").write_text('def look(query, *rest):\n    """Search.\n\n    Args:\n        other: x\n    """\n'
                                    "\n\nasync def fetch(url: str) -> str:\n    return url\n\n\ndef bare(x: int):\n"
                                    "    return x\n")
    found = tool_problems(config(tools=[str(outside), str(roots / "empty.py"), str(roots / "loose.py"),
                                        str(roots / "calc.py")], use_vllm=True))
    fields = [field for field, _ in found]
    assert fields == ["grpo.tools[0].python", "grpo.tools[1].python", "grpo.tools[2].python", "grpo.tools[3].python",
                      "grpo.use_vllm"]
    assert "a tool file must be under the allowed roots (FINETUNE_STUDIO_ALLOWED_ROOTS)" in found[0][1]
    assert found[1][1].startswith(f"{roots / 'empty.py'} defines no tool (a public top-level function with a docstring "
                                  "and typed parameters), e.g.\ndef add(a: int, b: int) -> int:")
    assert found[2][1] == (
        f"{roots / 'loose.py'}: look: takes *args or **kwargs: name every parameter (the model calls tools with JSON "
        "arguments); look: parameter 'query' has no type hint (e.g. query: int); look: parameter 'query' is not "
        "described under Args: in the docstring; fetch is async: a tool must be a plain def (each call runs with a "
        "time limit); bare: has no docstring: the model learns what a tool does from it (a first line, then Args:)")
    assert found[3][1] == f"{roots / 'calc.py'} is not a .py file"
    assert found[4][1] == "tools run with the trainer's own generate here: turn use_vllm off, or leave out grpo.tools"


def test_a_tool_name_in_two_files_is_refused(roots):
    (roots / "a.py").write_text(GOOD)
    (roots / "b.py").write_text(GOOD)
    assert tool_problems(config(tools=[str(roots / "a.py"), {"python": str(roots / "b.py"), "functions": ["add"]}])) == [
        ("grpo.tools[1].functions", f"a tool named 'add' is already in {roots / 'a.py'}: the model calls tools by "
                                    "name, so each name once")]


def test_tools_are_an_admins_and_their_files_are_copied_with_their_hash(roots):
    (roots / "calc.py").write_text(GOOD)
    cfg = config(tools=[str(roots / "calc.py")])
    assert grpo_method.admin_reasons(cfg) == [grpo_method.TOOLS_REASON]
    assert grpo_method.admin_reasons(config()) == []
    run = roots / "run"
    run.mkdir()
    grpo_method.job_files(cfg, run)
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == ["tools", "tools/0.py", "tools/manifest.json"]
    assert tools.checked_copies(run) == [(run / "tools" / "0.py", ["add"])]
    (run / "tools" / "0.py").write_text(GOOD + "\nimport os\n")
    with pytest.raises(RuntimeError, match=r"tools/0.py is missing or was changed after the run was submitted"):
        tools.checked_copies(run)


def test_tool_metrics_are_charted_only_for_runs_with_tools():
    keys = [s.key for s in grpo_method.metrics_for({"grpo": {"tools": ["calc.py"]}})]
    assert "tools/call_frequency" in keys and "tools/failure_frequency" in keys
    assert not any(k.startswith("tools/") for k in (s.key for s in grpo_method.metrics_for({"grpo": {}})))


# ---------------------------------------------------------------------- the guard around each call
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    if a < 0:
        raise ValueError("no negatives")
    if a == 7:
        sys.exit(3)
    if a == 8:
        os._exit(4)
    if a == 9:
        while True:
            time.sleep(0.01)
    return a + b


def test_a_guarded_tool_keeps_what_its_schema_is_built_from_and_answers():
    warnings: list[str] = []
    tool = guard_tool(add, "add", warnings.append)
    assert tool.__name__ == "add" and tool.__doc__ == add.__doc__
    assert inspect.signature(tool) == inspect.signature(add)
    assert tool(a=2, b=3) == 5 and warnings == []


def test_a_tool_that_raises_exits_or_hangs_is_an_error_naming_it_and_one_warning_per_fault(monkeypatch):
    monkeypatch.setenv(TOOL_TIMEOUT_ENV, "0.2")
    warnings: list[str] = []
    tool = guard_tool(add, "add", warnings.append)
    errors = []
    for a in (-1, -2, 7, 8, 9):
        with pytest.raises(ToolError) as caught:
            tool(a=a, b=1)
        errors.append(str(caught.value))
    assert errors[0] == "tool 'add' raised ValueError: no negatives"  # what the model sees: no host paths
    lines, first = inspect.getsourcelines(add)
    raised_at = first + next(i for i, line in enumerate(lines) if "raise ValueError" in line)
    assert errors[2] == "tool 'add' called sys.exit(3): a tool returns its result and never ends the worker"
    assert errors[3] == "tool 'add' called os._exit(4): a tool returns its result and never ends the worker"
    assert errors[4] == f"tool 'add' took longer than 0.2 s: it was ended (raise {TOOL_TIMEOUT_ENV} if it needs longer)"
    assert len(warnings) == 4  # the second ValueError is the same fault: no second warning
    assert warnings[0] == (f"{errors[0]} (at {__file__} line {raised_at}). The model got this error as the tool's "
                           "result and training goes on; fix the tool (tools/failure_frequency counts failed calls).")
    assert tool(a=1, b=1) == 2  # the alarm was cleared: the next call runs as usual


# ---------------------------------------------------------------------- the trajectory in the sample event
TURNS = [{"role": "assistant", "content": "", "calls": [{"name": "add", "arguments": '{"a": 2, "b": 3}'}]},
         {"role": "tool", "name": "add", "content": "5"},
         {"role": "assistant", "content": "The sum is 5.", "calls": []}]


def test_a_sample_event_carries_the_trajectory_and_refuses_a_malformed_one():
    event = ev.SampleEvent(step=1, index=0, prompt="Add 2 and 3.", text="The sum is 5.", turns=TURNS)
    assert ev.decode(ev.encode(event)).turns == TURNS
    assert ev.decode(ev.encode(ev.SampleEvent(step=1, index=0, prompt="p", text="t"))).turns == []
    line = json.loads(ev.encode(event))
    for bad in ([{"role": "system", "content": "x"}], [{"role": "tool", "content": 5}], "turns",
                [{"role": "assistant", "content": "", "calls": [{"name": "add", "arguments": {"a": 1}}]}]):
        with pytest.raises(ev.InvalidEvent, match="turns"):
            ev.decode(json.dumps({**line, "turns": bad}))


def test_built_in_rewards_score_the_models_words_not_the_tools_results():
    from trainer_core.rewards.builtin import BUILTINS

    trajectory = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "search", "arguments": {"q": "x"}}}]},
                  {"role": "tool", "name": "search", "content": "forbidden " * 50},
                  {"role": "assistant", "content": "The answer is 5."}]
    assert BUILTINS["length"]([None], [trajectory], target=4) == BUILTINS["length"]([None], ["The answer is 5."],
                                                                                       target=4)
    assert BUILTINS["not_contains"]([None], [trajectory], keywords=["forbidden"]) == [-0.0]
