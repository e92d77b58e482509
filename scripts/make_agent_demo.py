"""Write the GRPO-with-tools demo on the bundled model into a folder under the data root: the prompts, the tool, the
reward and the run's config (docs/tool-calling.md, "A rising reward on the bundled model").

The bundled SmolLM2-135M-Instruct never calls a tool unprompted, even when its system prompt says to (0 of 32
sampled answers), so GRPO had no reward spread to learn from. Each prompt here is a few-shot conversation: two
earlier questions answered with a ``<tool_call>`` to ``multiply`` (the calls are kept in the prompt:
trainer_core.data.preference), then the new question. With that the model calls the tool in most answers, though not
always with the right name, arguments or follow-up, and the reward has something to rise on. The numbers have four
digits: the model cannot multiply them itself, so only a trajectory that used the tool can end with the product.

The reward gives partial credit along the way: 0.25 for a call that ran, 0.5 when the tool returned the product,
1.0 when the final answer states it. The tool and reward files are user code (docs/tool-calling.md): the folder must
be under the allowed roots, which the data root always is.

    python scripts/make_agent_demo.py [FOLDER]            # default: <data root>/agent-demo
    python -m trainer_core run --config FOLDER/agent.yaml
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make trainer_core importable

from trainer_core.protocol import paths  # noqa: E402 - after the path fix above

PROMPTS, SEED = 64, 7
SYSTEM = "You are a calculator assistant. Always call the multiply tool."
QUESTIONS = ("What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} times {b}.",
             "What do you get when you multiply {a} by {b}?")
SHOTS = (("What is 1234 times 5678?", 1234, 5678), ("Multiply 402 by 7713.", 402, 7713))

TOOL_PY = '''def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b
'''

REWARD_PY = '''def solved(prompts, completions, answer, **_):
    """Partial credit along the way to the answer: 0.25 for a tool call that ran, 0.5 when a tool returned the
    product, 1.0 when the final answer states it. The completions are trajectories: calls, results, answer."""
    scores = []
    for messages, product in zip(completions, answer):
        results = [str(m.get("content", "")).strip() for m in messages if m.get("role") == "tool"]
        last = messages[-1] if messages else {}
        final = str(last.get("content") or "") if last.get("role") == "assistant" else ""
        if product in final.replace(",", ""):
            scores.append(1.0)
        elif product in results:
            scores.append(0.5)
        else:  # an error result (a bad name or arguments) is a JSON object: {"error": ...}
            scores.append(0.25 if any(r and not r.startswith("{") for r in results) else 0.0)
    return scores
'''


def call(a: int, b: int) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}]}


def rows() -> list[dict]:
    """The prompts: the system turn, two answered examples, the question; ``answer`` holds the product."""
    shots = [{"role": "system", "content": SYSTEM}]
    for question, a, b in SHOTS:
        shots += [{"role": "user", "content": question}, call(a, b)]
    rng = random.Random(SEED)
    out = []
    for index in range(PROMPTS):
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        question = QUESTIONS[index % len(QUESTIONS)].format(a=a, b=b)
        out.append({"prompt": shots + [{"role": "user", "content": question}], "answer": str(a * b)})
    return out


def config(folder: Path) -> str:
    """The run: LoRA on the bundled model, 8 completions a step (2 prompts x 4), at most 2 rounds of calls."""
    return f"""\
# GRPO with a tool on the bundled model (docs/tool-calling.md): few-shot prompts, the multiply tool, a reward with
# partial credit. Written by scripts/make_agent_demo.py.
run_name: agent demo
model_name: "bundled:SmolLM2-135M-Instruct"
method: grpo
adapter: lora
local_datasets: [{json.dumps(str(folder / "train.jsonl"))}]
max_seq_length: 512
max_steps: 20
batch_size: 8
learning_rate: 0.001
warmup_steps: 0
logging_steps: 1
save_steps: 0
lora_r: 16
lora_alpha: 32
grpo:
  num_generations: 4
  max_prompt_length: 400
  max_completion_length: 96
  temperature: 1.0
  max_tool_turns: 2
  tools: [{json.dumps(str(folder / "calc.py"))}]
  rewards:
    - {{python: {json.dumps(str(folder / "reward.py"))}, function: solved}}
  sample_every: 1
"""


def write(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows()))
    (folder / "calc.py").write_text(TOOL_PY)
    (folder / "reward.py").write_text(REWARD_PY)
    (folder / "agent.yaml").write_text(config(folder))
    return folder / "agent.yaml"


if __name__ == "__main__":
    target = Path(sys.argv[1]).expanduser().resolve() if len(sys.argv) > 1 else paths.data_root() / "agent-demo"
    print(write(target))
