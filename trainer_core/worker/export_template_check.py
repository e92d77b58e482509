"""The export's check of the chat template a GGUF carries (trainer_core/worker/export_verify.py): llama.cpp, Ollama
(without a Modelfile TEMPLATE) and LM Studio read the jinja template from the GGUF's ``tokenizer.chat_template``, so
it must be the run's own; and where the run's template renders tools (a run trained with the Hermes tool template),
the GGUF's, rendered on a conversation with a tool, a call and its result, must show all three. The metadata is read
back with the ``gguf`` package; the template is rendered as transformers renders it (export.chat_templates)."""
from __future__ import annotations

import json
from pathlib import Path

from trainer_core.export import chat_templates, tool_templates

FIELD = "tokenizer.chat_template"
UNIT = "chat template checks passed"
QUESTION = "What is the weather in Oslo today?"
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}
RESULT = "4 degrees and clear skies"
CONVERSATION = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": RESULT}]


def read_template(path: Path) -> str | None:
    """The GGUF's tokenizer.chat_template (None when it has none)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get(FIELD)
    return bytes(field.parts[field.data[0]]).decode("utf-8") if field is not None else None


def renders_tools(template: str | None, bos: str, eos: str) -> bool:
    """Whether a chat template writes a probe tool's name into the prompt (as worker/tool_template asks a tokenizer)."""
    try:
        text = chat_templates.render_jinja(template or "", chat_templates.PROBE, bos, eos,
                                           tools=[tool_templates.PROBE_TOOL])
    except Exception:  # noqa: BLE001 - a template may raise anything on tools it does not take: it does not render them
        return False
    return tool_templates.PROBE_TOOL["function"]["name"] in text


def _schema_shown(prompt: str) -> bool:
    """The tool in the prompt as JSON: as transformers' tojson writes it (the Hermes template: the whole tool, or its
    function), or indented as some models' own templates write it."""
    forms = [json.dumps(value, indent=indent) for value in (TOOL, TOOL["function"]) for indent in (None, 2, 4)]
    return any(form in prompt for form in forms)


def check(label: str, gguf_template: str | None, run_template: str | None, bos: str, eos: str) -> dict:
    """VerifyEvent fields for the GGUF ``label``: how many of the checks passed, the first that failed."""
    checks = [("its tokenizer.chat_template is the run's chat template", gguf_template == run_template)]
    if renders_tools(run_template, bos, eos):
        try:
            prompt = chat_templates.render_jinja(gguf_template or "", CONVERSATION, bos, eos, tools=[TOOL])
        except Exception:  # noqa: BLE001 - a template that cannot render a tool conversation fails every check below
            prompt = ""
        asked = prompt.find(QUESTION)
        after = prompt[asked:] if asked >= 0 else ""
        checks += [("a tool's JSON schema is in the prompt it renders", _schema_shown(prompt)),
                   ("the model's call (get_weather, city Oslo) follows the question",
                    '"get_weather"' in after and '"Oslo"' in after),
                   ("the tool's result follows the call", RESULT in after[after.find('"Oslo"'):])]
    failed = [name for name, passed in checks if not passed]
    return {"format": f"{label} chat template", "identical": len(checks) - len(failed), "total": len(checks),
            "first_difference": failed[0] if failed else "", "unit": UNIT}
