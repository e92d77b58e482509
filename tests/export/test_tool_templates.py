"""The Hermes tool template: built over each chat family that has a system turn, it renders conversations without
tools exactly as the model's own template does (same family, same default system message, same BOS), and the
choice between it and the model's own template follows tool_template."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer_core.export import chat_templates as ct
from trainer_core.export import tool_templates as tt

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
EOS = {"smollm2.jinja": "<|im_end|>", "llama3.jinja": "<|eot_id|>", "zephyr.jinja": "</s>", "mistral.jinja": "</s>",
       "gemma.jinja": "<eos>"}
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]


@pytest.mark.parametrize("name", ["smollm2.jinja", "llama3.jinja", "zephyr.jinja"])
def test_without_tools_the_hermes_template_renders_as_the_models_own(name):
    own = (TEMPLATES / name).read_text()
    detected = ct.detect(own, EOS[name])
    hermes = tt.hermes_template(detected)
    assert ct.detect(hermes, EOS[name]) == detected
    for messages in (CONVERSATION, CONVERSATION[1:]):
        assert ct.render_jinja(hermes, messages, "<BOS>", EOS[name]) == ct.render_jinja(own, messages, "<BOS>", EOS[name])


def test_calls_and_results_in_the_hermes_form():
    hermes = tt.hermes_template(ct.detect((TEMPLATES / "smollm2.jinja").read_text(), "<|im_end|>"))
    messages = [{"role": "user", "content": "Oslo and Rome?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}},
                    {"type": "function", "function": {"name": "w", "arguments": '{"city": "Rome"}'}}]},
                {"role": "tool", "content": "4C"}, {"role": "tool", "content": "19C"},
                {"role": "assistant", "content": "Cold, warm."}]
    assert ct.render_jinja(hermes, messages, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nOslo and Rome?<|im_end|>\n"
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "w", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "w", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n4C\n</tool_response>\n<tool_response>\n19C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nCold, warm.<|im_end|>\n")


def test_the_choice_follows_tool_template():
    own = (TEMPLATES / "smollm2.jinja").read_text()
    assert tt.choose(True, own, "<|im_end|>", "auto") == tt.Choice(
        None, "the model's own chat template (it writes the tools into the prompt)")
    assert tt.choose(True, own, "<|im_end|>", "model").template is None
    forced = tt.choose(True, own, "<|im_end|>", "hermes")
    assert forced.label == "Hermes tool template (chatml)" and "<tool_call>" in forced.template
    fallback = tt.choose(False, own, "<|im_end|>", "auto")
    assert fallback.label == "Hermes tool template (chatml): the model's own template ignores tools"
    with pytest.raises(tt.ToolTemplateError) as refused:
        tt.choose(False, own, "<|im_end|>", "model")
    assert str(refused.value) == ("tool_template: the model's chat template does not write tools into the prompt, so "
                                  "the model would never see them: set tool_template to auto or hermes")


@pytest.mark.parametrize("template, message", [
    ((TEMPLATES / "mistral.jinja").read_text(), "tool_template: the model's chat format (mistral) has no system turn "
                                                "to list tools in; use a model whose own template renders tools"),
    ("{{ messages[0]['content'] }}", "tool_template: the model's chat template ignores tools and matches none of the "
                                     "known chat formats, so no Hermes tool template can be built for it: use a model "
                                     "whose template renders tools"),
])
def test_no_hermes_template_without_a_known_family_with_a_system_turn(template, message):
    with pytest.raises(tt.ToolTemplateError) as refused:
        tt.choose(False, template, "</s>", "auto")
    assert str(refused.value) == message
