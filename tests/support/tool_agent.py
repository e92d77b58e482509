"""A GRPO agent job for tests and bench/overhead.py (issue 32): the tiny Llama taught (in a child process, once per
checkout, cached under .test-cache) to answer "Add 2 and 3." with a Hermes call to ``add`` and then "The sum is 5.",
a tool file whose ``add`` raises on its second call, a reward that reads the trajectory, and the run's config. A
random model never writes a call, and the bundled SmolLM2 does not either (0 of 16 sampled answers): this model is
what lets a short run show calls, results and a failing call."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.support.env import ROOT, run_python
from tests.support.models import build_tiny_model, built_once
from trainer_core.config import TrainConfig
from trainer_core.methods.grpo_settings import GRPOSettings

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


@built_once
def build_tool_caller(target: Path = CALLER) -> Path:
    """The tiny Llama taught to call ``add`` (about 2 minutes on a loaded 2-core machine, once per checkout)."""
    if not (target / "config.json").exists():
        result = run_python(TEACH_CALLS, str(build_tiny_model()), str(target), timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
    return target


def agent_config(folder: Path, **overrides) -> TrainConfig:
    """A GRPO run of the tool caller with the ``add`` tool and the ``got_five`` reward, its files written into
    ``folder`` (which must be under the allowed roots): 2 prompts, 2 completions each, at most 2 rounds of calls."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "calc.py").write_text(TOOLS_PY)
    (folder / "reward.py").write_text(REWARD_PY)
    train = folder / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in ("Add 2 and 3.", "Sum 2 and 3.")))
    settings = GRPOSettings(num_generations=2, max_completion_length=128, max_prompt_length=384, sample_every=1,
                            max_tool_turns=2, temperature=0.3, tools=[str(folder / "calc.py")],
                            rewards=[{"python": str(folder / "reward.py"), "function": "got_five"}])
    return TrainConfig(**{"run_name": "grpo tools", "model_name": str(build_tool_caller()), "method": "grpo",
                          "max_steps": 2, "batch_size": 2, "max_seq_length": 512, "warmup_steps": 0,
                          "logging_steps": 1, "save_steps": 0, "learning_rate": 1e-4,
                          "local_datasets": [str(train)], "eval_fraction": 0.0, "method_settings": settings,
                          **overrides})


