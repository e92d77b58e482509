"""The chat template a run with tool calls trains with, and saves with its adapter and merged model.

The model's own template is used when it writes the tools into the prompt (a probe conversation with a tool is
rendered and the tool's name looked for). Otherwise the run uses the Hermes tool template, built from the model's
own chat family (``chat_templates.detect``) so a conversation without tools renders exactly as before:

- the tools go into the system turn, after the system message (or the template's default one), as JSON lines
  inside ``<tools></tools>`` with the instruction to answer calls in ``<tool_call>`` tags;
- an assistant turn's calls follow its words as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
- results go into a user turn as ``<tool_response>\\n...\\n</tool_response>``, consecutive results in one turn.

This is the form Hermes 2 Pro and Qwen2.5 use for ChatML models (and ``tool_calls.parse_hermes_calls`` reads back).
A family without a system role (Mistral, Gemma) has nowhere to put the tools: such a model needs its own
tool-aware template. No ML stack here.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from trainer_core.export.chat_templates import (BOS_SENTINEL, CONTENT, PROBE, PROBE_SYSTEM, Detected, detect,
                                                go_text, render_jinja)

PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_zq7", "description": "Probe tool.",
                                               "parameters": {"type": "object", "properties": {}}}}
TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call>")
HERMES_LABEL = "Hermes tool template"


class ToolTemplateError(ValueError):
    """The run's tool_template cannot be honoured; the message says why and what to set."""


@dataclass(frozen=True)
class Choice:
    template: str | None  # the template to train with; None: the model's own
    label: str  # what New run shows


def _lit(text: str) -> str:
    """A jinja string literal (jinja reads backslash escapes as Python does; JSON's are a subset)."""
    return json.dumps(text)


def hermes_template(detected: Detected) -> str:
    """The Hermes tool template over ``detected``'s family, its default system message and BOS kept."""
    family = detected.family
    if not family.has_system:
        raise ToolTemplateError(f"the model's chat format ({family.name}) has no system turn to list tools in")
    sys_before, sys_after = (_lit(p) for p in family.roles["system"].split(CONTENT))
    user_before, user_after = (_lit(p) for p in family.roles["user"].split(CONTENT))
    asst_before, asst_after = (_lit(p) for p in family.roles["assistant"].split(CONTENT))
    return "".join([
        "{%- if messages and messages[0]['role'] == 'system' -%}",
        "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}",
        "{%- else -%}", f"{{%- set system = {_lit(detected.default_system)} -%}}{{%- set rest = messages -%}}",
        "{%- endif -%}",
        "{%- if tools -%}",
        f"{{%- set ns = namespace(text=(system + '\\n\\n' if system else '') + {_lit(TOOLS_HEAD)}) -%}}",
        "{%- for tool in tools -%}{%- set ns.text = ns.text + '\\n' + (tool | tojson) -%}{%- endfor -%}",
        f"{{%- set system = ns.text + {_lit(TOOLS_TAIL)} -%}}",
        "{%- endif -%}",
        "{{- bos_token -}}" if detected.writes_bos else "",
        f"{{%- if system -%}}{{{{- {sys_before} + system + {sys_after} -}}}}{{%- endif -%}}",
        "{%- for message in rest -%}",
        f"{{%- if message['role'] == 'user' -%}}{{{{- {user_before} + message['content'] + {user_after} -}}}}",
        "{%- elif message['role'] == 'assistant' -%}",
        f"{{{{- {asst_before} + (message['content'] or '') -}}}}",
        "{%- for call in (message['tool_calls'] or []) -%}",
        "{%- set f = call['function'] if call['function'] is defined else call -%}",
        "{{- ('\\n' if (message['content'] or not loop.first) else '') + '<tool_call>\\n{\"name\": \"' + f['name'] "
        "+ '\", \"arguments\": ' + (f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson)) "
        "+ '}\\n</tool_call>' -}}",
        "{%- endfor -%}",
        f"{{{{- {asst_after} -}}}}",
        "{%- elif message['role'] == 'tool' -%}",
        f"{{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}}{{{{- {user_before} -}}}}",
        "{%- else -%}{{- '\\n' -}}{%- endif -%}",
        "{{- '<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}",
        f"{{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}}{{{{- {user_after} -}}}}{{%- endif -%}}",
        f"{{%- elif message['role'] == 'system' -%}}{{{{- {sys_before} + message['content'] + {sys_after} -}}}}",
        "{%- endif -%}",
        "{%- endfor -%}",
        f"{{%- if add_generation_prompt -%}}{{{{- {_lit(family.generation)} -}}}}{{%- endif -%}}",
    ])


def choose(own_renders_tools: bool, template: str | None, eos_token: str, setting: str) -> Choice:
    """The template for a run whose data has tools. ``own_renders_tools``: the model's template wrote the probe
    tool into the prompt (the worker renders it with the tokenizer, as training will)."""
    if setting != "hermes" and own_renders_tools:
        return Choice(None, "the model's own chat template (it writes the tools into the prompt)")
    if setting == "model":
        raise ToolTemplateError("tool_template: the model's chat template does not write tools into the prompt, so "
                                "the model would never see them: set tool_template to auto or hermes")
    detected = detect(template, eos_token)
    if detected is None:
        raise ToolTemplateError("tool_template: the model's chat template ignores tools and matches none of the known "
                                "chat formats, so no Hermes tool template can be built for it: use a model whose "
                                "template renders tools")
    try:
        hermes = hermes_template(detected)
    except ToolTemplateError as exc:
        raise ToolTemplateError(f"tool_template: {exc}; use a model whose own template renders tools") from None
    why = "" if setting == "hermes" else ": the model's own template ignores tools"
    return Choice(hermes, f"{HERMES_LABEL} ({detected.family.name}){why}")


# What the Hermes tool template makes the model write, as transformers' response parser reads it back
# (tokenizer.response_template: transformers serve answers ``tool_calls`` with it, and it is saved in
# tokenizer_config.json beside the chat template). The same shape as transformers' own Qwen2.5 fallback.
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<end_of_turn>")


def hermes_response_template(generation: str, eos_token: str = "") -> dict:
    """The response template of a model that writes Hermes calls: its answer starts after ``generation`` (the
    template's generation prompt, e.g. ``<|im_start|>assistant\n``), ``<tool_call>`` JSON objects follow its words,
    and the turn ends at its end-of-turn marker (the template family's, or ``eos_token``)."""
    ends = sorted({*END_MARKERS, *([eos_token] if eos_token else [])}, key=len, reverse=True)
    return {
        "defaults": {"role": "assistant"},
        "start_anchor": generation,
        "fields": {
            # allow_non_json: a call whose JSON does not parse stays its text (serve_tools answers it as content)
            "tool_calls": {"open_pattern": r"\s*<tool_call>", "close": "</tool_call>", "repeats": True,
                           "content": "json", "content_args": {"allow_non_json": True},
                           "transform": {"type": "function", "function": "{content}"}},
            "content": {"close_pattern": r"\s*(?:" + "|".join(re.escape(e) for e in ends) + ")", "content": "text"},
        },
    }

def writes_hermes_calls(rendered_probe: str) -> bool:
    """Whether a template's rendering of a conversation with the probe tool asks for Hermes ``<tool_call>`` calls."""
    return PROBE_TOOL["function"]["name"] in rendered_probe and "<tool_call>" in rendered_probe


def asks_hermes_calls(template: str | None, eos_token: str = "") -> bool:
    """``writes_hermes_calls`` of a chat template's text, rendered as transformers renders it (no tokenizer needed)."""
    try:
        return writes_hermes_calls(render_jinja(template or "", PROBE, "", eos_token, tools=[PROBE_TOOL]))
    except Exception:  # noqa: BLE001 - a template may raise anything on tools it does not take: it asks for no calls
        return False


# ====================================================================== exported: GGUF metadata and Ollama
# A conversation with two calls in one turn, their results, an answer and a new question: what a chat template must
# render exactly as the Hermes tool template does for the Ollama TEMPLATE below to show the model the same prompt.
TOOL_PROBE = [{"role": "user", "content": "Probe question one?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"type": "function", "function": {"name": "probe_tool_zq7", "arguments": {"x": "one"}}},
                  {"type": "function", "function": {"name": "probe_tool_zq7", "arguments": {"x": "two"}}}]},
              {"role": "tool", "content": "Probe result one."}, {"role": "tool", "content": "Probe result two."},
              {"role": "assistant", "content": "Probe answer one."},
              {"role": "user", "content": "Probe question two?"}]


def hermes_tools(template: str | None, eos_token: str = "") -> Detected | None:
    """The chat family of ``template`` when it renders conversations with tools exactly as the Hermes tool template
    over that family does (a run trained with it; a model's own Hermes-style template, such as Qwen2.5's), else
    None: only then does ``go_tool_template`` show Ollama's model the prompts it was trained on."""
    detected = detect(template, eos_token)
    if detected is None or not detected.family.has_system:
        return None
    hermes = hermes_template(detected)
    for messages in (TOOL_PROBE, [{"role": "system", "content": PROBE_SYSTEM}, *TOOL_PROBE]):
        try:
            own = render_jinja(template, messages, BOS_SENTINEL, eos_token, tools=[PROBE_TOOL])
        except Exception:  # noqa: BLE001 - a template may raise anything on tools it does not take
            return None
        if own != render_jinja(hermes, messages, BOS_SENTINEL, eos_token, tools=[PROBE_TOOL]):
            return None
    return detected


def go_tool_template(detected: Detected) -> str:
    """The Ollama TEMPLATE of the Hermes tool template over ``detected``'s family: the same text around the same
    pieces, from Ollama's ``.Messages`` (each with ``.Role``, ``.Content``, ``.ToolCalls``) and ``.Tools``.

    - The tools join the first system message (Ollama adds the Modelfile's SYSTEM as one when a request has none),
      or make a system turn of their own; each is written as Ollama prints an ``api.Tool``: its JSON.
    - An assistant turn writes its words, then each call as ``<tool_call>`` JSON, one per line.
    - Consecutive results share one user turn: ``$prev`` remembers the role before (Go templates have no index
      arithmetic), and the turn closes when a message of another role, or the end, comes.

    No trim markers: every newline is the chat format's. Ollama finds the tag that starts a call (``<tool_call>``) as
    the first text inside ``{{ if .ToolCalls }}`` up to a ``{``, so that text is ``<tool_call>\n`` alone and the
    call's JSON starts with a literal ``{{ "{" }}``; the newline between the words and the calls sits in a
    ``with``, which Ollama does not search for that tag."""
    family = detected.family
    sys_before, sys_after = (go_text(p) for p in family.roles["system"].split(CONTENT))
    user_before, user_after = (go_text(p) for p in family.roles["user"].split(CONTENT))
    asst_before, asst_after = (go_text(p) for p in family.roles["assistant"].split(CONTENT))
    tools = go_text(TOOLS_HEAD) + "{{ range $.Tools }}\n{{ . }}{{ end }}" + go_text(TOOLS_TAIL)
    call = ('<tool_call>\n{{ "{" }}"name": "{{ .Function.Name }}", "arguments": {{ .Function.Arguments }}}\n'
            '</tool_call>{{ if ne (len (slice $calls $j)) 1 }}\n{{ end }}')
    return "".join([
        '{{ $prev := "" }}{{ range $i, $m := .Messages }}',
        f'{{{{ if and (eq $prev "tool") (ne .Role "tool") }}}}{user_after}{{{{ end }}}}',
        f'{{{{ if and (eq $i 0) (ne .Role "system") $.Tools }}}}{sys_before}{tools}{sys_after}{{{{ end }}}}',
        '{{ if eq .Role "system" }}',
        f'{{{{ if eq $i 0 }}}}{{{{ if or .Content $.Tools }}}}{sys_before}{{{{ .Content }}}}',
        f'{{{{ if $.Tools }}}}{{{{ if .Content }}}}\n\n{{{{ end }}}}{tools}{{{{ end }}}}{sys_after}{{{{ end }}}}',
        f'{{{{ else }}}}{sys_before}{{{{ .Content }}}}{sys_after}{{{{ end }}}}',
        f'{{{{ else if eq .Role "user" }}}}{user_before}{{{{ .Content }}}}{user_after}',
        f'{{{{ else if eq .Role "assistant" }}}}{asst_before}{{{{ .Content }}}}',
        '{{ if .Content }}{{ with .ToolCalls }}\n{{ end }}{{ end }}{{ $calls := .ToolCalls }}',
        f'{{{{ if .ToolCalls }}}}{{{{ range $j, $c := .ToolCalls }}}}{call}{{{{ end }}}}{{{{ end }}}}{asst_after}',
        f'{{{{ else if eq .Role "tool" }}}}{{{{ if eq $prev "tool" }}}}\n{{{{ else }}}}{user_before}{{{{ end }}}}',
        '<tool_response>\n{{ .Content }}\n</tool_response>',
        '{{ end }}{{ $prev = .Role }}{{ end }}',
        f'{{{{ if eq $prev "tool" }}}}{user_after}{{{{ end }}}}',
        go_text(family.generation),
    ])
