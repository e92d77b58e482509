"""The Ollama Modelfile of a run trained with the Hermes tool template: its TEMPLATE, evaluated by a Go template
evaluator (tests/support/go_template.py), renders conversations with tools, calls and results exactly as the run's
jinja template does; Ollama finds ``<tool_call>`` as the tag that starts a call and sees the tools capability; and
only templates that render tools in the Hermes form get it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support import go_template as go
from tests.support.go_template import ollama_render
from trainer_core.export import chat_templates as ct
from trainer_core.export import tool_templates as tt

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
FAMILIES = {"smollm2.jinja": ("<|im_start|>", "<|im_end|>"), "llama3.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
            "zephyr.jinja": ("<s>", "</s>")}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


PARALLEL = [{"role": "user", "content": "Oslo and Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", city="Oslo"),
                                                                call("get_weather", city="Rome")]},
            {"role": "tool", "content": "4C"}, {"role": "tool", "content": "19C"},
            {"role": "assistant", "content": "Cold in Oslo, warm in Rome."},
            {"role": "user", "content": "And 2+3?"}]
MULTI_STEP = [{"role": "user", "content": "Weather in Lima, plus 2 degrees?"},
              {"role": "assistant", "content": "Checking Lima.", "tool_calls": [call("get_weather", city="Lima")]},
              {"role": "tool", "content": '{"temp": 18}'},
              {"role": "assistant", "content": "", "tool_calls": [call("add", a=18, b=2)]},
              {"role": "tool", "content": "20"}]
CASES = [  # (messages, tools)
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
     []),
    (PARALLEL, [WEATHER, ADD]),
    ([{"role": "system", "content": "Be brief."}, *PARALLEL], [WEATHER, ADD]),
    (MULTI_STEP, [WEATHER, ADD]),
    ([{"role": "system", "content": "Be brief."}, *MULTI_STEP[:1]], [WEATHER]),
]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_tool_template_renders_like_the_runs_jinja_template(name):
    bos, eos = FAMILIES[name]
    detected = ct.detect((TEMPLATES / name).read_text(), eos)
    hermes = tt.hermes_template(detected)
    assert tt.hermes_tools(hermes, eos) == detected
    modelfile = ct.modelfile("run-q8_0.gguf", detected, hermes, tools_template=tt.go_tool_template(detected))
    for messages, tools in CASES:
        expected = ct.render_jinja(hermes, messages, bos, eos, tools=tools or None)
        prefix = bos if detected.writes_bos else ""  # llama.cpp adds the BOS token itself
        assert prefix + ollama_render(modelfile, messages, tools) == expected, (messages, tools)


def test_what_ollama_reads_from_it_and_the_modelfile_around_it():
    detected = ct.detect((TEMPLATES / "smollm2.jinja").read_text(), "<|im_end|>")
    template = tt.go_tool_template(detected)
    assert go.tool_call_tag(template) == "<tool_call>"  # Ollama's parser waits for this tag, then reads the JSON
    assert ".Tools" in template  # a template that names .Tools gives the model Ollama's "tools" capability
    modelfile = ct.modelfile("run-q8_0.gguf", detected, tt.hermes_template(detected), "tool run · final",
                             tools_template=template)
    assert f'TEMPLATE """{template}"""' in modelfile and "\nFROM ./run-q8_0.gguf\n" in modelfile
    assert "# Tools: the TEMPLATE writes the request's tools ({{ .Tools }})" in modelfile
    assert re.findall(r'^PARAMETER stop "(.*)"$', modelfile, re.M) == ["<|im_start|>", "<|im_end|>"]
    rendered = ollama_render(modelfile, PARALLEL[:1], [WEATHER])
    assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n"
                        + tt.TOOLS_HEAD + "\n" + json.dumps(WEATHER) + tt.TOOLS_TAIL + "<|im_end|>\n"
                        "<|im_start|>user\nOslo and Rome?<|im_end|>\n<|im_start|>assistant\n")


def test_only_templates_that_render_hermes_tools_get_the_tool_template():
    plain = (TEMPLATES / "smollm2.jinja").read_text()
    assert tt.hermes_tools(plain, "<|im_end|>") is None  # SmolLM2's own template ignores tools
    assert tt.hermes_tools((TEMPLATES / "mistral.jinja").read_text(), "</s>") is None  # no system turn for tools
    assert tt.hermes_tools(None) is None and tt.hermes_tools("{% for %}") is None
    hermes = tt.hermes_template(ct.detect(plain, "<|im_end|>"))
    other = hermes.replace("<tool_response>", "<result>")  # another tool form: Ollama's template would differ
    assert tt.hermes_tools(other, "<|im_end|>") is None


def test_the_verify_check_of_a_ggufs_chat_template_names_the_first_check_that_failed():
    from trainer_core.worker import export_template_check as check

    plain = (TEMPLATES / "smollm2.jinja").read_text()
    hermes = tt.hermes_template(ct.detect(plain, "<|im_end|>"))
    assert check.check("gguf q8_0", hermes, hermes, "", "<|im_end|>") == {
        "format": "gguf q8_0 chat template", "identical": 4, "total": 4, "first_difference": "",
        "unit": "chat template checks passed"}
    # a GGUF that kept the base model's template: llama.cpp would never show the model its tools
    lost = check.check("gguf q8_0", plain, hermes, "", "<|im_end|>")
    assert (lost["identical"], lost["total"]) == (0, 4)
    assert lost["first_difference"] == "its tokenizer.chat_template is the run's chat template"
    assert check.check("gguf f16", None, hermes, "", "<|im_end|>")["identical"] == 0
    # a run without tools: the template is the run's, nothing more to check
    assert (check.check("gguf f16", plain, plain, "", "<|im_end|>")["identical"],
            check.check("gguf f16", plain, plain, "", "<|im_end|>")["total"]) == (1, 1)
