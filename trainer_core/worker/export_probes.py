"""What the export's verify asks a model (trainer_core/worker/export_verify.py compares the answers): greedy answers
to chat prompts (and llama.cpp's, where it is installed), answers to the run's own image rows, transcripts of its
clips, its texts to embed, and the sentences a text-to-speech model speaks with the sampler's seed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from trainer_core.worker.export_plan import ExportError



def chat_prompt(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def processor_prompt(processor, prompt: str) -> str:
    """A text-only user turn under a vision model's processor template (its turns hold lists of parts)."""
    return processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": prompt}]}],
                                         tokenize=False, add_generation_prompt=True)


def generate(model, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    """Greedy answer token ids to ``prompt`` under the tokenizer's chat template."""
    return generate_ids(model, tokenizer, chat_prompt(tokenizer, prompt), max_new_tokens)


def generate_ids(model, tokenizer, text: str, max_new_tokens: int) -> list[int]:
    """Greedy answer token ids to an already formatted prompt ``text``, tokenized by ``tokenizer``."""
    import torch

    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                             pad_token_id=tokenizer.pad_token_id)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


VERIFY_CLIPS = 4  # a speech export's verify transcribes this many of the run's own clips


VERIFY_TEXTS = 8  # an embedding export's verify embeds this many of the run's own texts


VERIFY_IMAGES = 4  # a vision export's verify answers this many of the run's own image rows


def vision_prompts(cfg) -> tuple[list[str], list[tuple[list[dict], list]]]:
    """(names, prompts): the first VERIFY_IMAGES image rows of a vision run (its eval rows, else its training rows)
    as (the turns before the first answer, the images they show), read as the run read them."""
    from trainer_core.data import DatasetError, loading

    try:
        data = loading.load_for_training(cfg)
    except (DatasetError, OSError) as exc:
        raise ExportError(f"the run's images cannot be read to verify the merged model ({exc}): restore its data, or "
                          "export with verify off") from None
    names, prompts = [], []
    for row in (data.eval_rows or data.rows):
        turns = row.get("messages") or []
        first_answer = next((i for i, t in enumerate(turns) if t.get("role") == "assistant"), len(turns))
        if not row.get("images") or first_answer == 0:
            continue
        asked = turns[:first_answer]
        text = " ".join(p.get("text", "") for t in asked if isinstance(t.get("content"), list) for p in t["content"]
                        if isinstance(p, dict) and p.get("type") == "text")
        names.append(text[:40] or f"row {len(names) + 1}")
        prompts.append((asked, list(row["images"])))
        if len(prompts) == VERIFY_IMAGES:
            break
    if not prompts:
        raise ExportError("the run's data has no image row with a question to verify the merged model with: export "
                          "with verify off")
    return names, prompts


def answer_image(model, processor, prompt: tuple[list[dict], list], max_new_tokens: int) -> list[int]:
    """Greedy answer token ids of a vision model to (turns, images) under the processor's chat template."""
    import io

    import torch
    from PIL import Image

    turns, images = prompt
    pictures = [Image.open(io.BytesIO(i) if isinstance(i, (bytes, bytearray)) else i).convert("RGB") for i in images]
    text = processor.apply_chat_template(turns, add_generation_prompt=True)
    inputs = processor(text=text, images=pictures, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def embedding_texts(cfg) -> list[str]:
    """Up to VERIFY_TEXTS distinct texts of an embedding run's data (its eval rows, else its training rows), read as
    the run read them. ExportError says why when they cannot be read."""
    from trainer_core.data import DatasetError, loading

    try:
        data = loading.load_for_training(cfg)
    except (DatasetError, OSError) as exc:
        raise ExportError(f"the run's texts cannot be read to verify the export ({exc}): restore its data, or "
                          "export with verify off") from None
    texts = [v for row in (data.eval_rows or data.rows) for v in row.values() if isinstance(v, str) and v.strip()]
    return list(dict.fromkeys(texts))[:VERIFY_TEXTS]


def speech_clips(cfg) -> tuple[list[str], list]:
    """(names, clips): the first VERIFY_CLIPS clips of a speech run's eval rows (else its training rows), read as
    the run read them (paths checked under the allowed roots). ExportError says why when they cannot be read."""
    from trainer_core.data import DatasetError, loading

    try:
        data = loading.load_for_training(cfg)
    except (DatasetError, OSError) as exc:
        raise ExportError(f"the run's clips cannot be read to verify the merged model ({exc}): restore its data, or "
                          "export with verify off") from None
    rows = (data.eval_rows or data.rows)[:VERIFY_CLIPS]
    names = [r["text"][:40] for r in rows]  # the clip's transcript names it in the verify result
    return names, [r["audio"] for r in rows]


def transcribe_clip(model, processor, clip, max_new_tokens: int) -> str:
    """The model's greedy transcript of one clip (decoded and resampled to the processor's rate)."""
    from trainer_core.worker.methods.stt import transcribe

    return transcribe(model, processor, [clip], max_new_tokens)[0]


VERIFY_SENTENCE = "The quick brown fox jumps over the lazy dog."  # spoken when the run names no sample texts


VERIFY_MAX_S = 4.0  # each verify clip is cut here: 50 frames, each one drawn from the one before, prove the weights


def speak_sentences(model, processor, cfg) -> list[tuple[str, object, bool]]:
    """(sentence, samples, ended) for each verify sentence of a text-to-speech run: its tts.sample_texts (up to
    two), else VERIFY_SENTENCE, in its default voice, up to its tts.max_sample_s (at most VERIFY_MAX_S), with the
    sampler's fixed seed."""
    from trainer_core.worker.methods.tts import SEED, speak

    s = cfg.method_settings  # a TtsSettings
    sentences = [t.strip() for t in s.sample_texts[:2]] or [VERIFY_SENTENCE]
    seconds = min(s.max_sample_s, VERIFY_MAX_S)
    return [(text, *speak(model, processor, text, s.speaker, seconds, SEED)) for text in sentences]


def has_llama_cpp() -> bool:
    """The optional ``llamacpp`` extra: xllamacpp, a prebuilt llama.cpp runtime (what Ollama and LM Studio run)."""
    return importlib.util.find_spec("xllamacpp") is not None


def llama_cpp_answers(gguf: Path, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy completions of already chat-formatted ``prompts`` by llama.cpp itself (xllamacpp)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.n_ctx = 2048
    params.n_predict = max_new_tokens
    try:
        server = xllamacpp.Server(params)
        results = [server.handle_completions({"prompt": p, "n_predict": max_new_tokens, "temperature": 0.0,
                                              "top_k": 1, "cache_prompt": False}) for p in prompts]
        return [r["choices"][0]["text"] for r in results]
    except Exception as exc:  # noqa: BLE001 - llama.cpp refusing the file fails the export, with its reason
        raise ExportError(f"llama.cpp cannot run the GGUF {gguf.name} ({type(exc).__name__}: {str(exc)[:300]}): "
                          "the export failed and nothing was published") from None



def llama_cpp_image_answers(gguf: Path, mmproj: Path, prompts: list[tuple[list[dict], list]],
                            max_new_tokens: int) -> list[str]:
    """Greedy answers of llama.cpp itself (xllamacpp) to a vision run's (turns, images), the language GGUF run with
    its mmproj projector: each image goes in as a PNG data URL where its part stands, under the GGUF's own template."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.mmproj.path = str(mmproj)
    params.n_ctx = 2048
    params.n_predict = max_new_tokens
    try:
        server = xllamacpp.Server(params)
        results = [server.handle_chat_completions({"messages": llama_cpp_messages(turns, images),
                                                   "max_tokens": max_new_tokens, "temperature": 0.0, "top_k": 1,
                                                   "cache_prompt": False}) for turns, images in prompts]
        return [r["choices"][0]["message"]["content"] for r in results]
    except Exception as exc:  # noqa: BLE001 - llama.cpp refusing the pair fails the export, with its reason
        raise ExportError(f"llama.cpp cannot run the GGUF {gguf.name} with its projector {mmproj.name} "
                          f"({type(exc).__name__}: {str(exc)[:300]}): the export failed and nothing was "
                          "published") from None


def llama_cpp_messages(turns: list[dict], images: list) -> list[dict]:
    """OpenAI-style messages for llama.cpp: the run's image parts, in order, as PNG data URLs."""
    import base64
    import io

    from trainer_core.worker.vision import load_image

    pictures = iter(images)
    messages = []
    for turn in turns:
        content = turn.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") == "image":
                    png = io.BytesIO()
                    load_image(next(pictures)).save(png, format="PNG")
                    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode("ascii")
                    parts.append({"type": "image_url", "image_url": {"url": url}})
                elif part.get("type") == "text":
                    parts.append({"type": "text", "text": part.get("text", "")})
            content = parts
        messages.append({"role": turn.get("role", "user"), "content": content})
    return messages
