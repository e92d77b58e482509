"""Conversations with tools through the real preview subprocess and the bundled tokenizer: the Hermes tool template
chosen (SmolLM2's own ignores tools), the prompt as the model sees it, exactly which tokens are trained (the
assistant's calls and answers; the tool results only when asked), rows without tools trained as before, and rows
whose calls do not fit their tools flagged."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import MODELS_CACHE, bundled_model_folder, run_python

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tools"
SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n# Tools\n\n"
          "You may call one or more functions to assist with the user query.\n\nYou are provided with function "
          "signatures within <tools></tools> XML tags:\n<tools>\n")
TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n")
WEATHER = ('{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": '
           '{"city": {"type": "string"}}, "required": ["city"]}}}')
RENDER = """
import json, sys
from dataclasses import asdict
from trainer_core.config import TrainConfig
from trainer_core.data import DatasetError
from trainer_core.worker import preview_child
out = []
for c in json.loads(sys.argv[1]):
    try:
        out.append(asdict(preview_child.compute(TrainConfig(**c), rows_shown=3)))
    except DatasetError as exc:
        out.append({"field": exc.field, "message": exc.message})
print(json.dumps(out))
"""
DATA = {"local_datasets": [str(FIXTURES / "tool_chat.jsonl")]}
CASES = {"default": DATA, "results": {**DATA, "train_on_tool_results": True},
         "completions": {**DATA, "train_on_completions": True}, "model": {**DATA, "tool_template": "model"}}


@pytest.fixture(scope="module")
def previews(tmp_path_factory) -> dict[str, dict]:
    bundled_model_folder()
    env = {"FINETUNE_STUDIO_HOME": str(tmp_path_factory.mktemp("home")), "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE),
           "FINETUNE_STUDIO_ALLOWED_ROOTS": str(FIXTURES), "FINETUNE_STUDIO_FORCE_CPU": "1"}
    done = run_python(RENDER, json.dumps(list(CASES.values())), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(CASES, json.loads(done.stdout.strip().splitlines()[-1])))


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
PROMPT = SYSTEM + WEATHER + TAIL + "<|im_start|>user\nOslo?<|im_end|>\n<|im_start|>assistant\n"
RESULT = "<|im_start|>user\n<tool_response>\n4C\n</tool_response><|im_end|>\n"


@pytest.mark.subprocess
def test_the_tool_row_is_rendered_with_its_tools_and_trains_the_calls_and_answers(previews):
    p = previews["default"]
    assert p["tool_template"] == "Hermes tool template (chatml): the model's own template ignores tools"
    assert p["rows"][0]["segments"] == [[PROMPT, False], [CALL, True], [RESULT + "<|im_start|>assistant\n", False],
                                        ["Cold.<|im_end|>\n", True]]


@pytest.mark.subprocess
def test_tool_results_are_trained_only_when_asked(previews):
    assert previews["results"]["rows"][0]["segments"] == [[PROMPT, False], [CALL + RESULT, True],
                                                          ["<|im_start|>assistant\n", False],
                                                          ["Cold.<|im_end|>\n", True]]


@pytest.mark.subprocess
def test_a_row_without_tools_is_rendered_and_trained_as_before(previews):
    plain = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n")
    assert previews["default"]["rows"][1]["segments"] == [[plain, True]]  # every token, as without tools
    assert previews["completions"]["rows"][1]["segments"] == [[plain[:-len("Hello.<|im_end|>\n")], False],
                                                              ["Hello.<|im_end|>\n", True]]
    assert previews["completions"]["rows"][0]["segments"] == previews["default"]["rows"][0]["segments"]


@pytest.mark.subprocess
def test_calls_that_do_not_fit_their_tools_are_flagged_and_still_trained(previews):
    p = previews["default"]
    assert p["tool_problems"] == [
        "row 2: calls 'calc', which is not among the row's tools (add): add the tool to the row's tools or correct "
        "the call's name"]
    assert p["total_rows"] == 3


@pytest.mark.subprocess
def test_the_models_own_template_is_refused_when_it_ignores_tools(previews):
    assert previews["model"] == {"field": "tool_template", "message": (
        "the model's chat template does not write tools into the prompt, so the model would never see them: set "
        "tool_template to auto or hermes")}
