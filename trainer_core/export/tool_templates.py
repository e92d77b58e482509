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

from trainer_core.export.chat_templates import CONTENT, PROBE, Detected, detect

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
