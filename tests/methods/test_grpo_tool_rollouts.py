"""An agent trained with rewards (issue 32): a GRPO run with ``grpo.tools`` calls the tool during its rollouts, the
tool's results go back to the model, a tool that raises is an error result the model sees (one warning naming it)
and the run goes on, the rewards read the whole trajectory, and the samples carry the trajectory's turns into the
database. The model is the tiny Llama taught (in a child process, once per checkout) to answer "Add 2 and 3." with a
Hermes call to ``add`` and then "The sum is 5.": a random model never writes a call, and the bundled SmolLM2 does
not either (0 of 16 sampled answers) — so this proves the wiring, not that GRPO teaches tool use."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.support import ROOT, build_tiny_model, cache_lock, run_python
from trainer_core.config import TrainConfig
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train

CALLER = ROOT / ".test-cache" / "tiny-tool-caller"

TEACH_CALLS = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trainer_core.export import tool_templates

    torch.set_num_threads(1)  # a 32-wide model: more threads only fight the other processes of a loaded host
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source)
    tokenizer.chat_template = tool_templates.choose(False, tokenizer.chat_template, tokenizer.eos_token,
                                                    "hermes").template
    tool = {"type": "function", "function": {"name": "add", "description": "Add two whole numbers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "description": "The first number."},
                                         "b": {"type": "integer", "description": "The second number."}},
        "required": ["a", "b"]}, "return": {"type": "integer"}}}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}

    def length(messages, generation=False):
        text = tokenizer.apply_chat_template(messages, tools=[tool], add_generation_prompt=generation, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    examples = []
    for question in ("Add 2 and 3.", "What is 2 plus 3?", "Sum 2 and 3."):
        user = [{"role": "user", "content": question}]
        for result in ("5", "error"):
            result_turn = {"role": "tool", "name": "add", "content": result}
            talk = user + [call, result_turn, {"role": "assistant", "content": "The sum is 5."}]
            ids = tokenizer(tokenizer.apply_chat_template(talk, tools=[tool], tokenize=False),
                            add_special_tokens=False)["input_ids"]
            asked, called, answered = length(user, True), length(user + [call]), length(user + [call, result_turn], True)
            labels = [-100] * asked + ids[asked:called] + [-100] * (answered - called) + ids[answered:]  # calls, answer
            examples.append((torch.tensor([ids]), torch.tensor([labels])))
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(120):
        ids, labels = examples[step % len(examples)]
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)  # its own template: the run picks Hermes itself
""")

TOOLS_PY = '''
calls = []


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    calls.append((a, b))
    if len(calls) == 2:
        raise ValueError("the adder is out of order")
    return a + b
'''

REWARD_PY = '''
def got_five(prompts, completions, **_):
    """1 when a tool result in the trajectory says 5: the reward sees the calls and results, not only the answer."""
    return [float(any(m.get("role") == "tool" and m.get("content") == "5" for m in c)) for c in completions]
'''


def tool_caller(tiny_model: Path) -> Path:
    with cache_lock(CALLER):
        if not (CALLER / "config.json").exists():
            result = run_python(TEACH_CALLS, str(tiny_model), str(CALLER), timeout=900)
            assert result.returncode == 0, result.stderr[-3000:]
    return CALLER


def test_a_grpo_run_with_a_tool_records_trajectories(studio, tmp_path):
    model = tool_caller(build_tiny_model())
    (tmp_path / "calc.py").write_text(TOOLS_PY)
    (tmp_path / "reward.py").write_text(REWARD_PY)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in ("Add 2 and 3.", "Sum 2 and 3.")))
    cfg = TrainConfig(run_name="grpo tools", model_name=str(model), method="grpo", max_steps=2, batch_size=2,
                      max_seq_length=512, warmup_steps=0, logging_steps=1, save_steps=0, learning_rate=1e-4,
                      local_datasets=[str(train)], eval_fraction=0.0,
                      method_settings=GRPOSettings(
                          num_generations=2, max_completion_length=128, max_prompt_length=384, sample_every=1,
                          max_tool_turns=2, temperature=0.3, tools=[str(tmp_path / "calc.py")],
                          rewards=[{"python": str(tmp_path / "reward.py"), "function": "got_five"}]))
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 60)}"

    run_dir = paths.run_dir(run_id)
    assert json.loads((run_dir / "tools" / "manifest.json").read_text())[0]["functions"] == ["add"]
    events, _ = ev.read_new(run_dir / ev.LOG_NAME, 0)
    warnings = [e.message for e in events if isinstance(e, ev.WarningEvent) and "tool 'add'" in e.message]
    assert len(warnings) == 1 and warnings[0].startswith("tool 'add' raised ValueError: the adder is out of order")
    progress = [e.metrics for e in events if isinstance(e, ev.ProgressEvent) and "tools/call_frequency" in e.metrics]
    assert progress and all(m["tools/call_frequency"] > 0 for m in progress)

    turns = [s.turns for s in studio.samples(run_id) if s.turns]
    calls = [c for t in turns for turn in t for c in turn.get("calls", ())]
    results = [turn["content"] for t in turns for turn in t if turn["role"] == "tool"]
    assert calls and all(c["name"] == "add" for c in calls)
    assert {json.dumps(json.loads(c["arguments"]), sort_keys=True) for c in calls} == {'{"a": 2, "b": 3}'}
    assert "5" in results
    assert "{'error': \"tool 'add' raised ValueError: the adder is out of order\"}" in results
    scored = {s.flags.get("reward:got_five") for s in studio.samples(run_id) if s.turns}
    assert scored <= {"0", "1"} and "1" in scored
