"""The Ollama Modelfile's TEMPLATE renders a conversation exactly like the model's own jinja chat template.

The Go templates are evaluated here by a small evaluator of the subset ``chat_templates.go_template`` writes
(range over .Messages, if/else if on eq .Role, .Content, string literals), written independently of it; the
jinja templates are the real ones of each family's models."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainer_core.export import chat_templates as ct

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
# file -> (family, bos_token, eos_token, whether the family has a system role)
CASES = {
    "smollm2.jinja": ("chatml", "<|im_start|>", "<|im_end|>", True),  # SmolLM2's bos is <|im_start|> itself
    "llama3.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>", True),
    "mistral.jinja": ("mistral", "<s>", "</s>", False),
    "gemma.jinja": ("gemma", "<bos>", "<eos>", False),
    "zephyr.jinja": ("zephyr", "<s>", "</s>", True),
}
CONVERSATION = [
    {"role": "user", "content": "Hi there, what is 2+2?"},
    {"role": "assistant", "content": "It is 4.\nAnything else?"},
    {"role": "user", "content": 'Write "{{ .Content }}" and <b>bold</b> literally.'},
]


# ---------------------------------------------------------------- a Go text/template evaluator (our subset)
ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


def parse_go(template: str) -> list:
    tokens, pos = [], 0
    for match in ACTION.finditer(template):
        assert not match.group(1) and not match.group(3), "trim markers would eat the newlines of the chat format"
        tokens += [("text", template[pos:match.start()]), ("action", match.group(2))]
        pos = match.end()
    tokens.append(("text", template[pos:]))
    nodes, rest, end = _parse(tokens, 0)
    assert rest == len(tokens) and end is None, "unbalanced template"
    return nodes


def _parse(tokens, i):
    nodes = []
    while i < len(tokens):
        kind, value = tokens[i]
        i += 1
        if kind == "text":
            nodes.append(("text", value))
        elif value in ("end",) or value.startswith("else"):
            return nodes, i, value
        elif value == "range .Messages":
            body, i, end = _parse(tokens, i)
            assert end == "end"
            nodes.append(("range", body))
        elif value.startswith("if "):
            branches, cond = [], value[3:]
            while True:
                body, i, end = _parse(tokens, i)
                branches.append((cond, body))
                if end == "end":
                    break
                cond = end[len("else if "):] if end.startswith("else if ") else None
            nodes.append(("if", branches))
        elif re.fullmatch(r'"[^"]*"', value):
            nodes.append(("text", value[1:-1]))
        elif value in (".Content", ".Role"):
            nodes.append(("field", value[1:]))
        else:
            raise AssertionError(f"unsupported action {value!r}")
    return nodes, i, None


def _true(cond, ctx) -> bool:
    if cond is None:
        return True
    match = re.fullmatch(r'eq \.Role "([^"]*)"', cond)
    assert match, f"unsupported condition {cond!r}"
    return ctx["Role"] == match.group(1)


def run_go(nodes, ctx) -> str:
    out = []
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "field":
            out.append(ctx[node[1]])
        elif node[0] == "range":
            out += [run_go(node[1], {"Role": m["role"], "Content": m["content"]}) for m in ctx["Messages"]]
        else:
            out += [run_go(body, ctx) for cond, body in node[1] if _true(cond, ctx)][:1]
    return "".join(out)


def modelfile_parts(text: str) -> tuple[str | None, str | None, list[str]]:
    template = re.search(r'^TEMPLATE """(.*?)"""$', text, re.S | re.M)
    system = re.search(r'^SYSTEM """(.*?)"""$', text, re.S | re.M)
    stops = re.findall(r'^PARAMETER stop "(.*)"$', text, re.M)
    return template and template.group(1), system and system.group(1), stops


def ollama_render(modelfile: str, messages: list[dict]) -> str:
    """What Ollama sends the model: the Modelfile's SYSTEM joins a conversation that has no system message."""
    template, system, _ = modelfile_parts(modelfile)
    if system is not None and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": system}, *messages]
    return run_go(parse_go(template), {"Messages": messages})


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_template_renders_each_conversation_exactly_like_the_chat_template(name):
    family, bos, eos, has_system = CASES[name]
    jinja = (TEMPLATES / name).read_text()
    detected = ct.detect(jinja, eos)
    assert detected is not None and detected.family.name == family
    modelfile = ct.modelfile("model-q8_0.gguf", detected, jinja)
    conversations = [CONVERSATION, CONVERSATION[:1]]
    if has_system:
        conversations += [[{"role": "system", "content": "Be brief."}, *CONVERSATION]]
    for messages in conversations:
        expected = ct.render_jinja(jinja, messages, bos, eos)
        # llama.cpp adds the BOS token itself (the GGUF says so): a template that writes it leaves it out.
        prefix = bos if detected.writes_bos else ""
        assert prefix + ollama_render(modelfile, messages) == expected, messages


def test_the_modelfile_names_the_gguf_the_stop_tokens_and_the_default_system_prompt():
    jinja = (TEMPLATES / "smollm2.jinja").read_text()
    text = ct.modelfile("run-q8_0.gguf", ct.detect(jinja, "<|im_end|>"), jinja, "my run · final")
    assert "\nFROM ./run-q8_0.gguf\n" in text
    _, system, stops = modelfile_parts(text)
    assert stops == ["<|im_start|>", "<|im_end|>"]
    assert system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_llama3_stops_at_its_end_of_turn_token():
    jinja = (TEMPLATES / "llama3.jinja").read_text()
    _, system, stops = modelfile_parts(ct.modelfile("m.gguf", ct.detect(jinja, "<|eot_id|>"), jinja))
    assert "<|eot_id|>" in stops and system is None


@pytest.mark.parametrize("template", [(TEMPLATES / "llama2.jinja").read_text(),
                                      "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
                                      "{{ raise_exception('no chat') }}", "{% for %}"])
def test_an_unknown_template_gets_no_template_and_a_warning_never_a_wrong_one(template):
    assert ct.detect(template, "</s>") is None
    text = ct.modelfile("m.gguf", None, template)
    directives = [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert directives == ["FROM"]
    assert "# WARNING: no TEMPLATE is written because its chat template matches none of the known families" in text
    assert "FROM ./m.gguf" in text


def test_a_model_without_chat_template_says_so():
    assert ct.detect(None) is None and ct.detect("") is None
    assert "because the model has no chat template" in ct.modelfile("m.gguf", None, None)
