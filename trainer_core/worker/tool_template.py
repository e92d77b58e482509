"""The chat template a run with tool calls trains with (export.tool_templates decides; this renders the probe with
the run's own tokenizer, as training will). The tokenizer keeps the chosen template, so checkpoints, the adapter
and a merged model are saved with it. Worker and preview subprocess only."""
from __future__ import annotations

from trainer_core.config import TrainConfig
from trainer_core.data.tool_calls import is_tool_row
from trainer_core.export import chat_templates, tool_templates


def own_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's own template writes a probe tool's name into the prompt."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        text = tokenizer.apply_chat_template(chat_templates.PROBE, tools=[tool_templates.PROBE_TOOL], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template may raise anything on tools it does not take: it does not render them
        return False
    return tool_templates.PROBE_TOOL["function"]["name"] in text


def apply(tokenizer, rows: list[dict], cfg: TrainConfig) -> str:
    """Set the run's tool template on ``tokenizer`` when ``rows`` have tools; what New run shows ("" without tools).
    Raises ``tool_templates.ToolTemplateError`` naming tool_template when no template can show the tools."""
    if not any(is_tool_row(row) for row in rows):
        return ""
    return use(tokenizer, cfg)


def use(tokenizer, cfg: TrainConfig) -> str:
    """Set the run's tool template on ``tokenizer`` (the model's own when it renders tools, else Hermes) with the
    response template that reads the model's calls back; what New run shows. GRPO with tools calls it directly:
    its prompts carry no tools, the trainer adds them. Raises ``tool_templates.ToolTemplateError``."""
    choice = tool_templates.choose(own_renders_tools(tokenizer), tokenizer.chat_template, tokenizer.eos_token or "",
                                   cfg.tool_template)
    if choice.template is not None:
        tokenizer.chat_template = choice.template
        # saved beside it: transformers serve (here or wherever the model goes) answers tool_calls with it
        from trainer_core.worker import serve_tools

        tokenizer.response_template = serve_tools.response_template(tokenizer)
    return choice.label
