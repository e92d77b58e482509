"""Tool calls in transformers serve's answers: its chat handler parses the model's output with the model's response
template (``tokenizer.response_template``, or its own fallback for Qwen models) into OpenAI's ``tool_calls``, streamed
as deltas. A run trained with the Hermes tool template saves one (worker/tool_template.py); an older run, a merged
model or a base model whose chat template asks for Hermes calls gets it here when the serve job loads it. A model
whose template renders no tools keeps answering text. With vLLM (``vllm_tool_args``), the run's chat template and
vLLM's own Hermes parser. Serve worker only."""
from __future__ import annotations

import json
from pathlib import Path

from trainer_core.export import chat_templates, tool_templates

VLLM_TEMPLATE_FILE = "chat_template.jinja"  # in the serve job's folder: the template handed to vLLM


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


def is_call(value) -> bool:
    """A parsed tool call transformers serve can answer: a function with a name and object arguments."""
    function = value.get("function") if isinstance(value, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str) \
        and isinstance(function.get("arguments", {}), (dict, str))


def install_lenient_calls() -> None:
    """A call whose JSON does not parse comes back as the model's words, never a 500 (transformers serve raises on it
    when it answers whole, and ends a stream with an error chunk): the answer's parse falls back to its plain text,
    and a stream carries such a call's text as content. Idempotent; patches transformers serve's serving module."""
    from transformers.cli.serving import chat_completion, response, utils

    if getattr(utils, "_studio_lenient_calls", False):
        return
    parse, to_chunks = utils.parse_assistant_message, utils.response_events_to_chunks

    def parse_leniently(processor, model, generated_ids, input_ids, cleaned_content="", tools=None):
        try:
            return parse(processor, model, generated_ids, input_ids, cleaned_content=cleaned_content, tools=tools)
        except (ValueError, TypeError, KeyError, AttributeError):  # a malformed call: the answer as written
            return cleaned_content, None, None

    def chunks_leniently(events: list[dict]) -> list:
        out, kept = [], []
        for event in events:
            if event.get("type") == "region_close" and event.get("field") == "tool_calls" \
                    and not is_call(event.get("value")):
                value = event.get("value")
                raw = value.get("function") if isinstance(value, dict) else value
                raw = raw.strip() if isinstance(raw, str) else ""
                for marker in tool_templates.END_MARKERS:  # a call cut by the end of the turn
                    raw = raw.removesuffix(marker).rstrip()
                out += to_chunks(kept) + [f"<tool_call>{raw}</tool_call>"]
                kept = []
            else:
                kept.append(event)
        return out + to_chunks(kept)

    chat_completion.parse_assistant_message = response.parse_assistant_message = parse_leniently
    utils.response_events_to_chunks = chunks_leniently
    utils._studio_lenient_calls = True


def enable(processor, model) -> str:
    """Make transformers serve parse the model's tool calls; what it parses them with ("" when it cannot)."""
    from transformers.cli.serving.utils import get_response_template

    install_lenient_calls()
    tokenizer = getattr(processor, "tokenizer", processor)
    if get_response_template(processor, model) is not None:
        return "the model's response template"
    template = response_template(tokenizer) if renders_hermes_calls(tokenizer) else None
    if template is None:
        return ""
    tokenizer.response_template = template
    return "Hermes <tool_call> tags"


# ---------------------------------------------------------------------- vLLM
def saved_template(folder: str | Path) -> tuple[str | None, str]:
    """(the chat template a tokenizer folder saved, its eos token), read without loading the tokenizer:
    ``chat_template.jinja``, else tokenizer_config.json's ``chat_template`` text; (None, "") for a folder that is not
    here (a hub id) or holds none."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    eos = config.get("eos_token") if isinstance(config, dict) else None
    eos = eos.get("content", "") if isinstance(eos, dict) else eos if isinstance(eos, str) else ""
    try:
        return (folder / VLLM_TEMPLATE_FILE).read_text(encoding="utf-8"), eos
    except OSError:
        template = config.get("chat_template") if isinstance(config, dict) else None
        return (template if isinstance(template, str) and template else None), eos


def vllm_tool_args(base: str, adapters: list[tuple[str, Path]], job_dir: Path) -> tuple[list[str], list[str]]:
    """vLLM's arguments for the sources' chat template and tool calls, and what to warn of.

    vLLM renders every model it serves (the base and its LoRA adapters) with one chat template, the base folder's
    unless ``--chat-template`` names another, and it never reads an adapter's. A run trained on tool calls saved the
    Hermes tool template with its adapter: that template is written into the job folder and handed to vLLM (it
    renders conversations without tools as the base's own does). Where the template asks for Hermes ``<tool_call>``
    calls, ``--enable-auto-tool-choice --tool-call-parser hermes`` makes vLLM answer them as OpenAI ``tool_calls``.
    Adapters with different templates of their own cannot share one server's: the base's is kept, with a warning."""
    base_template, eos = saved_template(base)
    own = {name: saved_template(folder) for name, folder in adapters}
    differing = {t: name for name, (t, _) in own.items() if t and t != base_template}
    eos = eos or next((e for _, e in own.values() if e), "")
    args, warnings = [], []
    template = base_template
    if len(differing) == 1:
        [(template, _)] = differing.items()
        path = job_dir / VLLM_TEMPLATE_FILE
        path.write_text(template, encoding="utf-8")
        args += ["--chat-template", str(path)]
    elif differing:
        warnings.append(f"the adapters {', '.join(sorted(differing.values()))} saved different chat templates, and "
                        "vLLM renders every model it serves with one: they are served with the base model's. Serve "
                        "them in separate jobs, or with engine: transformers")
    if tool_templates.asks_hermes_calls(template, eos):
        args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    return args, warnings
