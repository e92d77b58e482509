"""Chat template families, and the Ollama Modelfile an exported GGUF needs. No ML stack here.

An exported GGUF speaks gibberish in Ollama when its TEMPLATE or stop tokens are missing or wrong. So the
family is detected, never guessed: probe conversations are rendered with the model's own jinja chat template
(the way transformers renders it) and compared, character for character, with what each known family would
write. The Go template of the Modelfile is built from the very same pieces, so what Ollama sends the model is
what the model was trained on. A template that matches no family gets a Modelfile without TEMPLATE that says
why: a warning, never a wrong template.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONTENT = "{content}"


@dataclass(frozen=True)
class Family:
    """One chat format: per role, the text around a message's content; the prefix the model continues from."""

    name: str
    turns: tuple[tuple[str, str], ...]  # (role, "prefix{content}suffix"); no "system" role: not supported
    generation: str
    stops: tuple[str, ...]

    @property
    def roles(self) -> dict[str, str]:
        return dict(self.turns)

    @property
    def has_system(self) -> bool:
        return "system" in self.roles

    def render(self, messages: list[dict[str, str]]) -> str:
        roles = self.roles
        return "".join(roles[m["role"]].replace(CONTENT, m["content"]) for m in messages) + self.generation


FAMILIES: tuple[Family, ...] = (
    Family("chatml", (("system", "<|im_start|>system\n{content}<|im_end|>\n"),
                      ("user", "<|im_start|>user\n{content}<|im_end|>\n"),
                      ("assistant", "<|im_start|>assistant\n{content}<|im_end|>\n")),
           "<|im_start|>assistant\n", ("<|im_start|>", "<|im_end|>")),
    Family("llama3", (("system", "<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>"),
                      ("user", "<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>"),
                      ("assistant", "<|start_header_id|>assistant<|end_header_id|>\n\n{content}<|eot_id|>")),
           "<|start_header_id|>assistant<|end_header_id|>\n\n", ("<|start_header_id|>", "<|end_header_id|>",
                                                                 "<|eot_id|>")),
    Family("mistral", (("user", "[INST] {content} [/INST]"), ("assistant", "{content}</s>")), "",
           ("[INST]", "[/INST]", "</s>")),
    Family("mistral", (("user", "[INST] {content} [/INST]"), ("assistant", "{content}</s> ")), "",
           ("[INST]", "[/INST]", "</s>")),  # Mistral-7B-Instruct-v0.1 writes a space after </s>
    Family("gemma", (("user", "<start_of_turn>user\n{content}<end_of_turn>\n"),
                     ("assistant", "<start_of_turn>model\n{content}<end_of_turn>\n")),
           "<start_of_turn>model\n", ("<start_of_turn>", "<end_of_turn>")),
    Family("zephyr", (("system", "<|system|>\n{content}</s>\n"), ("user", "<|user|>\n{content}</s>\n"),
                      ("assistant", "<|assistant|>\n{content}</s>\n")),
           "<|assistant|>\n", ("<|system|>", "<|user|>", "<|assistant|>", "</s>")),
)
FAMILY_NAMES = tuple(dict.fromkeys(f.name for f in FAMILIES))

# Probe texts: plain words (no surrounding space a template might trim), unlike any template's own text.
PROBE_SYSTEM = "Probe system rule."
PROBE = [{"role": "user", "content": "Probe question one?"}, {"role": "assistant", "content": "Probe answer one."},
         {"role": "user", "content": "Probe question two?"}]
BOS_SENTINEL = "\x02BOS\x03"  # stands for bos_token while probing: tells whether the template writes it


@dataclass(frozen=True)
class Detected:
    family: Family
    default_system: str = ""  # what the template writes as system message when a conversation has none
    writes_bos: bool = False  # the template starts with bos_token (llama.cpp adds BOS itself: not in TEMPLATE)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' ``tojson`` filter: jinja's own sorts the keys and escapes HTML, which no model was trained on."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_jinja(template: str, messages: list[dict], bos_token: str = "", eos_token: str = "",
                 add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """Render a chat template as transformers does (sandboxed, trim_blocks, lstrip_blocks, loop controls, its
    ``tojson``; ``tools`` None when the conversation offers none, as transformers passes it)."""
    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = _tojson
    return env.from_string(template).render(messages=messages, tools=tools, bos_token=bos_token, eos_token=eos_token,
                                            add_generation_prompt=add_generation_prompt)


def _probe(template: str, messages: list[dict[str, str]], eos_token: str) -> tuple[str, bool] | None:
    try:
        text = render_jinja(template, messages, BOS_SENTINEL, eos_token)
    except Exception:  # noqa: BLE001 - a template may raise anything on a conversation it refuses
        return None
    writes_bos = text.startswith(BOS_SENTINEL)
    text = text.removeprefix(BOS_SENTINEL)
    return (None if BOS_SENTINEL in text else (text, writes_bos))


def detect(template: str | None, eos_token: str = "") -> Detected | None:
    """The known family ``template`` renders exactly like, or None (no template, or an unknown one)."""
    if not template:
        return None
    plain = _probe(template, PROBE, eos_token)
    with_system = _probe(template, [{"role": "system", "content": PROBE_SYSTEM}, *PROBE], eos_token)
    if plain is None:
        return None
    for family in FAMILIES:
        if family.has_system:
            if with_system is None or with_system[0] != family.render([{"role": "system", "content": PROBE_SYSTEM},
                                                                      *PROBE]):
                continue
            if plain[0] == family.render(PROBE):
                return Detected(family, "", plain[1])
            default = _default_system(family, plain[0])
            if default is not None:
                return Detected(family, default, plain[1])
        elif plain[0] == family.render(PROBE):
            return Detected(family, "", plain[1])
    return None


def _default_system(family: Family, rendered: str) -> str | None:
    """The system message a template adds when there is none (SmolLM2 does), if ``rendered`` is exactly that
    system turn followed by the conversation."""
    before, after = family.roles["system"].split(CONTENT)
    body = family.render(PROBE)
    if not (rendered.startswith(before) and rendered.endswith(after + body)):
        return None
    return rendered[len(before):len(rendered) - len(after + body)] or None


# ====================================================================== Ollama
def go_text(text: str) -> str:
    """Literal text inside a Go template: ``{{`` would start an action (no family writes it; keep it literal)."""
    return text.replace("{{", '{{ "{{" }}')


def go_template(family: Family) -> str:
    """An Ollama TEMPLATE over ``.Messages`` that writes each message exactly as ``family`` does, then the
    generation prefix. System messages are dropped by families that have no system role (their jinja
    templates refuse them)."""
    branches = []
    for role, turn in family.turns:
        before, after = turn.split(CONTENT)
        branches.append(f'if eq .Role "{role}" }}}}{go_text(before)}{{{{ .Content }}}}{go_text(after)}')
    body = "{{ " + "{{ else ".join(branches) + "{{ end }}"
    return "{{ range .Messages }}" + body + "{{ end }}" + go_text(family.generation)


def modelfile(gguf_name: str, detected: Detected | None, template_text: str | None, label: str = "",
              tools_template: str | None = None) -> str:
    """The Modelfile next to the GGUF: FROM, TEMPLATE, stop PARAMETERs and SYSTEM from the chat template.
    ``tools_template``: the TEMPLATE to write instead of the family's plain one, for a chat template that renders
    tools (export.tool_templates.go_tool_template)."""
    head = [f"# Ollama Modelfile{' for ' + label if label else ''}: `ollama create NAME -f Modelfile`"]
    if detected is None:
        reason = ("the model has no chat template" if not template_text else
                  f"its chat template matches none of the known families ({', '.join(FAMILY_NAMES)})")
        return "\n".join(head + [
            f"# WARNING: no TEMPLATE is written because {reason}. A wrong template makes the model answer",
            "# gibberish, so none is guessed: Ollama falls back on the chat template stored in the GGUF when it",
            "# recognises it. Otherwise write TEMPLATE and PARAMETER stop lines for this model by hand.",
            f"FROM ./{gguf_name}", ""])
    family = detected.family
    lines = head + [f"# Chat format: {family.name} (detected by rendering the model's own chat template)."]
    if not family.has_system:
        lines.append("# This format has no system role: system messages are left out, as its template refuses them.")
    if tools_template is not None:
        lines += ["# Tools: the TEMPLATE writes the request's tools ({{ .Tools }}), the model's earlier calls",
                  "# (.ToolCalls) and the tools' results (role tool) as its chat template does (Hermes <tool_call>",
                  "# form), so `ollama run` / the chat API with tools answer tool_calls."]
    lines += [f"FROM ./{gguf_name}", f'TEMPLATE """{tools_template or go_template(family)}"""']
    lines += [f'PARAMETER stop "{_quoted(stop)}"' for stop in family.stops]
    if detected.default_system:
        lines.append(f'SYSTEM """{detected.default_system.replace(chr(34) * 3, chr(39) * 3)}"""')
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return re.sub(r'(["\\])', r"\\\1", text)
