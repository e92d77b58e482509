"""A served model that was trained with the Hermes tool template answers OpenAI tool_calls: the run's tokenizer
carries a response template that transformers serve parses the model's <tool_call> output with (saved at training;
set at serve time for a model whose template asks for Hermes calls), and a model whose template renders no tools is
left answering text. Each check imports transformers, so it runs in a child process (tests.support.run_in_child)."""
from __future__ import annotations

import json
from types import SimpleNamespace

from tests.support import run_in_child
from trainer_core.config import TrainConfig

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
ROW = {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]}],
       "tools": json.dumps(TOOLS)}
LLAMA = SimpleNamespace(config=SimpleNamespace(model_type="llama"))


def hermes_parsing_in_child(tiny_model: str, tmp_path: str) -> None:
    from transformers import AutoTokenizer

    from trainer_core.worker import serve_tools, tool_template

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    assert serve_tools.enable(tokenizer, LLAMA) == ""  # SmolLM2's own template renders no tools: text answers
    label = tool_template.apply(tokenizer, [ROW], TrainConfig(model_name=str(tiny_model)))
    assert label.startswith("Hermes tool template")
    tokenizer.save_pretrained(tmp_path)  # as the adapter and the merged model are saved
    saved = AutoTokenizer.from_pretrained(str(tmp_path))
    assert saved.response_template == tokenizer.response_template
    assert serve_tools.enable(saved, LLAMA) == "the model's response template"

    prompt = saved.apply_chat_template(ROW["messages"][:1], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "<tools>" in prompt and "get_weather" in prompt  # what the model reads before it answers
    answer = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bergen"}}\n</tool_call><|im_end|>')
    parsed = saved.parse_response(saved(answer, add_special_tokens=False)["input_ids"], prefix=prompt)
    assert parsed["content"] == "Let me check."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed["tool_calls"]] == \
        [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Bergen"})]
    plain = saved.parse_response(saved("It is sunny.<|im_end|>", add_special_tokens=False)["input_ids"], prefix=prompt)
    assert plain["content"] == "It is sunny." and not plain.get("tool_calls")


def serve_time_parser_in_child(tiny_model: str) -> None:
    from transformers import AutoTokenizer

    from trainer_core.worker import serve_tools, tool_template

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    tool_template.apply(tokenizer, [ROW], TrainConfig(model_name=str(tiny_model)))
    tokenizer.response_template = None  # saved before runs carried one
    assert serve_tools.enable(tokenizer, LLAMA) == "Hermes <tool_call> tags"
    prompt = tokenizer.apply_chat_template(ROW["messages"][:1], tools=TOOLS, add_generation_prompt=True,
                                           tokenize=False)
    ids = tokenizer('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>',
                    add_special_tokens=False)["input_ids"]
    assert tokenizer.parse_response(ids, prefix=prompt)["tool_calls"][0]["function"]["arguments"] == {"city": "Rome"}


def lenient_calls_in_child(tiny_model: str) -> None:
    from transformers import AutoTokenizer
    from transformers.cli.serving import chat_completion, utils
    from transformers.utils.chat_parsing.response_parser import ResponseParser

    from trainer_core.worker import serve_tools, tool_template

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    tool_template.apply(tokenizer, [ROW], TrainConfig(model_name=str(tiny_model)))
    serve_tools.enable(tokenizer, LLAMA)
    prompt = tokenizer.apply_chat_template(ROW["messages"][:1], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    bad = "Use the <tool_call> XML tags.<|im_end|>"
    ids = tokenizer(bad, add_special_tokens=False)["input_ids"]
    content, _, calls = chat_completion.parse_assistant_message(tokenizer, LLAMA, ids, prompt_ids,
                                                                cleaned_content="Use the <tool_call> XML tags.",
                                                                tools=TOOLS)
    assert (content, calls) == ("Use the <tool_call> XML tags.", None)

    stream = ResponseParser(tokenizer.response_template, prefix=prompt, tools=TOOLS)
    events = [e for piece in ("Use the ", "<tool_call> XML", " tags.<|im_end|>") for e in stream.feed(piece)]
    events += stream.finalize()[1]
    streamed = utils.response_events_to_chunks(events)
    assert "".join(c for c in streamed if isinstance(c, str)) == "Use the<tool_call>XML tags.</tool_call>"
    good = ResponseParser(tokenizer.response_template, prefix=prompt, tools=TOOLS)
    events = good.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>')
    calls = [c for c in utils.response_events_to_chunks(events + good.finalize()[1]) if not isinstance(c, str)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


def test_a_hermes_trained_tokenizer_parses_calls_as_transformers_serve_does(tiny_model, tmp_path):
    run_in_child(hermes_parsing_in_child, str(tiny_model), str(tmp_path))


def test_an_older_run_whose_template_asks_for_hermes_calls_gets_the_parser_at_serve_time(tiny_model):
    run_in_child(serve_time_parser_in_child, str(tiny_model))


def test_a_call_whose_json_does_not_parse_comes_back_as_words_never_a_500(tiny_model):
    """Found serving the tuned demo run: an answer echoing "<tool_call> XML tags." from the tools' instructions made
    transformers serve's parser raise (HTTP 500); streamed, it ended the stream with an error chunk."""
    run_in_child(lenient_calls_in_child, str(tiny_model))
