"""Tool calls in transformers serve's answers: its chat handler parses the model's output with the model's response
template (``tokenizer.response_template``, or its own fallback for Qwen models) into OpenAI's ``tool_calls``, streamed
as deltas. A run trained with the Hermes tool template saves one (worker/tool_template.py); an older run, a merged
model or a base model whose chat template asks for Hermes calls gets it here when the serve job loads it. A model
whose template renders no tools keeps answering text. Serve worker only."""
from __future__ import annotations

from trainer_core.export import chat_templates, tool_templates


def renders_hermes_calls(tokenizer) -> bool:
    """Whether the tokenizer's chat template lists a probe tool and asks for ``<tool_call>`` calls."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        text = tokenizer.apply_chat_template(chat_templates.PROBE, tools=[tool_templates.PROBE_TOOL], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template may raise anything on tools it does not take: it takes none
        return False
    return tool_templates.writes_hermes_calls(text)


def generation_prompt(tokenizer) -> str:
    """What the template writes to open the assistant's answer (the response template's start anchor)."""
    turn = [{"role": "user", "content": "Hi"}]
    opened = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    closed = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=False)
    return opened[len(closed):] if opened.startswith(closed) else ""


def response_template(tokenizer) -> dict | None:
    """The Hermes response template for this tokenizer's chat template (None when it has no generation prompt to
    anchor the answer at)."""
    generation = generation_prompt(tokenizer)
    return tool_templates.hermes_response_template(generation, tokenizer.eos_token or "") if generation else None


def enable(processor, model) -> str:
    """Make transformers serve parse the model's tool calls; what it parses them with ("" when it cannot)."""
    from transformers.cli.serving.utils import get_response_template

    tokenizer = getattr(processor, "tokenizer", processor)
    if get_response_template(processor, model) is not None:
        return "the model's response template"
    template = response_template(tokenizer) if renders_hermes_calls(tokenizer) else None
    if template is None:
        return ""
    tokenizer.response_template = template
    return "Hermes <tool_call> tags"
