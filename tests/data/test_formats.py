"""Every dataset format, awkward rows included, normalised and then rendered with the bundled
SmolLM2 chat template exactly as the trainer sees it (the preview and the engine share that path)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import MODELS_CACHE, build_tiny_model, run_python
from trainer_core.data import formats, readers

FIXTURES = Path(__file__).parents[1] / "fixtures" / "formats"

# SmolLM2's template adds this system turn when a conversation does not start with one.
DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def normalized(name: str, fmt: str = "auto", mapping: dict | None = None, system: str = "") -> formats.NormalizedData:
    return formats.normalize_rows(readers.read_rows(FIXTURES / name), fmt, mapping, system)


# ---------------------------------------------------------------------- normalisation (no tokenizer)
def test_alpaca_extra_columns_missing_input_and_unusable_rows():
    data = normalized("alpaca.jsonl")
    assert (data.format, data.reason) == ("alpaca", "found 'instruction', 'input' and 'output' columns")
    assert data.rows == [
        {"messages": [msg("user", "Add 2 and 3."), msg("assistant", "5")]},  # empty input adds nothing
        {"messages": [msg("user", "Translate to French.\n\ncat"), msg("assistant", "chat")]},
        {"messages": [msg("user", "Name a colour."), msg("assistant", "Blue")]},  # no input key at all
    ]
    assert data.dropped == {"missing output": 1, "missing instruction": 1}


def test_chatml_system_multi_turn_and_empty_turns():
    data = normalized("chatml.jsonl")
    assert (data.format, data.reason) == ("chatml", "found a 'messages' column with role/content turns")
    assert data.rows == [
        {"messages": [msg("system", "You are terse."), msg("user", "Hi"), msg("assistant", "Hello.")]},
        # the empty user turn is left out; the rest of the conversation stays; extra turn keys are dropped
        {"messages": [msg("user", "2+2?"), msg("assistant", "4"), msg("user", "And 3+3?"), msg("assistant", "6")]},
    ]
    assert data.dropped == {"no assistant turn": 1, "empty conversation": 1}


def test_sharegpt_roles_and_an_empty_reply():
    data = normalized("sharegpt.json")
    assert (data.format, data.reason) == ("sharegpt", "found a 'conversations' column with from/value turns")
    assert data.rows == [
        {"messages": [msg("system", "Be kind."), msg("user", "Hello"), msg("assistant", "Hi there!")]},
        {"messages": [msg("user", "Q1"), msg("assistant", "A1"), msg("user", "Q2"), msg("assistant", "A2")]},
    ]
    assert data.dropped == {"no assistant turn": 1}  # its only reply was empty


def test_raw_text_keeps_newlines_and_drops_empty_rows():
    data = normalized("text.jsonl")
    assert (data.format, data.reason) == ("text", "found a 'text' column of raw text")
    assert data.rows == [{"text": "Rivers run to the sea."}, {"text": "A second document\nwith two lines."}]
    assert data.dropped == {"missing text": 1}


def test_column_mapping_with_system_prompt_from_csv():
    mapping = {"instruction": "question", "input": "context", "output": "answer"}
    data = normalized("custom.csv", "auto", mapping, "Answer briefly.")
    assert data.format == "alpaca"
    assert data.reason == ("found 'question' (mapped to 'instruction'), 'context' (mapped to 'input') and "
                           "'answer' (mapped to 'output') columns")
    assert data.rows == [
        {"messages": [msg("system", "Answer briefly."), msg("user", "What is the capital of France?"),
                      msg("assistant", "Paris")]},
        {"messages": [msg("system", "Answer briefly."), msg("user", "Sum these, please\n\n1 and 2"),
                      msg("assistant", "3")]},
    ]


def test_system_prompt_does_not_replace_a_conversation_system_turn():
    data = normalized("chatml.jsonl", system="Override?")
    assert data.rows[0]["messages"][0] == msg("system", "You are terse.")
    assert data.rows[1]["messages"][0] == msg("system", "Override?")


# ---------------------------------------------------------------------- rendered with the bundled tokenizer
RENDER = """
import json, sys
from dataclasses import asdict
from trainer_core.config import TrainConfig
from trainer_core.worker import preview_child
print(json.dumps([asdict(preview_child.compute(TrainConfig(**c), rows_shown=5)) for c in json.loads(sys.argv[1])]))
"""
CASES = {
    "alpaca": {"local_datasets": [str(FIXTURES / "alpaca.jsonl")]},
    "chatml": {"local_datasets": [str(FIXTURES / "chatml.jsonl")], "train_on_completions": True},
    "sharegpt": {"local_datasets": [str(FIXTURES / "sharegpt.json")]},
    "text": {"local_datasets": [str(FIXTURES / "text.jsonl")], "format_type": "text", "adapter": "full"},
    "custom": {"local_datasets": [str(FIXTURES / "custom.csv")], "format_type": "alpaca",
               "custom_format_mapping": {"instruction": "question", "input": "context", "output": "answer"},
               "system_prompt": "Answer briefly."},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, dict]:
    build_tiny_model()  # also converts the bundled model once
    home = tmp_path_factory.mktemp("home")
    env = {"FINETUNE_STUDIO_HOME": str(home), "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE),
           "FINETUNE_STUDIO_ALLOWED_ROOTS": str(FIXTURES), "FINETUNE_STUDIO_FORCE_CPU": "1"}
    done = run_python(RENDER, json.dumps(list(CASES.values())), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(CASES, json.loads(done.stdout.strip().splitlines()[-1])))


def texts(preview: dict) -> list[str]:
    return [row["text"] for row in preview["rows"]]


@pytest.mark.subprocess  # renders through the real tokenizer in a subprocess
def test_alpaca_rendered_with_the_default_system_prompt(rendered):
    assert texts(rendered["alpaca"]) == [
        DEFAULT_SYSTEM + turn("user", "Add 2 and 3.") + turn("assistant", "5"),
        DEFAULT_SYSTEM + turn("user", "Translate to French.\n\ncat") + turn("assistant", "chat"),
        DEFAULT_SYSTEM + turn("user", "Name a colour.") + turn("assistant", "Blue"),
    ]
    assert rendered["alpaca"]["dropped"] == {"missing output": 1, "missing instruction": 1}


@pytest.mark.subprocess  # renders through the real tokenizer in a subprocess
def test_chatml_rendered_and_only_the_last_reply_trained(rendered):
    rows = rendered["chatml"]["rows"]
    assert [row["segments"] for row in rows] == [
        [[turn("system", "You are terse.") + turn("user", "Hi") + "<|im_start|>assistant\n", False],
         ["Hello.<|im_end|>\n", True]],
        [[DEFAULT_SYSTEM + turn("user", "2+2?") + turn("assistant", "4") + turn("user", "And 3+3?")
          + "<|im_start|>assistant\n", False],
         ["6<|im_end|>\n", True]],
    ]
    assert [row["text"] for row in rows] == ["".join(text for text, _ in row["segments"]) for row in rows]


@pytest.mark.subprocess  # renders through the real tokenizer in a subprocess
def test_sharegpt_rendered(rendered):
    assert texts(rendered["sharegpt"]) == [
        turn("system", "Be kind.") + turn("user", "Hello") + turn("assistant", "Hi there!"),
        DEFAULT_SYSTEM + turn("user", "Q1") + turn("assistant", "A1") + turn("user", "Q2") + turn("assistant", "A2"),
    ]


@pytest.mark.subprocess  # renders through the real tokenizer in a subprocess
def test_raw_text_gets_the_eos_token_and_is_trained_whole(rendered):
    rows = rendered["text"]["rows"]
    assert texts(rendered["text"]) == ["Rivers run to the sea.<|im_end|>", "A second document\nwith two lines.<|im_end|>"]
    assert all(row["segments"] == [[row["text"], True]] for row in rows)
    assert rendered["text"]["format"] == "text"


@pytest.mark.subprocess  # renders through the real tokenizer in a subprocess
def test_mapped_csv_rendered_with_the_configured_system_prompt(rendered):
    assert texts(rendered["custom"]) == [
        turn("system", "Answer briefly.") + turn("user", "What is the capital of France?") + turn("assistant", "Paris"),
        turn("system", "Answer briefly.") + turn("user", "Sum these, please\n\n1 and 2") + turn("assistant", "3"),
    ]
    assert rendered["custom"]["format_reason"] == "format_type is set to 'alpaca'"
