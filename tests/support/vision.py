"""Helpers for vision tests: a tiny LLaVA built offline (random SigLIP tower, a tiny Llama with the bundled SmolLM2
tokenizer, its processor and chat template saved), and coloured-shape images drawn with Pillow with questions about
them; a tiny Idefics3 (SmolVLM's architecture) for the GGUF export with its mmproj file. The models are built in a
subprocess (this process plays the dashboard, which never imports torch) and cached per checkout under .test-cache,
like tests/support/models.py's tiny Llama."""
from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

from PIL import Image, ImageDraw

from tests.support.env import MODELS_CACHE, ROOT, run_python
from tests.support.models import built_once

TINY_VLM = ROOT / ".test-cache" / "tiny-llava"
IMAGE_SIZE, PATCH_SIZE = 32, 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # 16: SigLIP has no CLS token, the strategy keeps every patch
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 210, 20)}
SHAPES = ("circle", "square")
QUESTION = "What colour is the shape?"

# ChatML with image parts: each {"type": "image"} becomes the processor's <image>, which it expands to 16 tokens.
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
                 "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                 "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>' }}"
                 "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
                 "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")

BUILD_TINY_VLM = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    from transformers import (AutoTokenizer, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, SiglipVisionConfig)
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    from trainer_core.host import hardware
    from trainer_core.protocol import paths
    from trainer_core.worker import model_files

    target, size, patch, template = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    bundled = model_files.convert_gguf(hardware.bundled_gguf_path(), paths.models_dir() / "SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(bundled)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    torch.manual_seed(0)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=size, patch_size=patch, vision_use_head=False)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=True, initializer_range=0.4, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="full", vision_feature_layer=-1,
                         image_seq_length=(size // patch) ** 2, tie_word_embeddings=True)
    LlavaForConditionalGeneration(config).save_pretrained(target)
    processor = LlavaProcessor(image_processor=SiglipImageProcessorPil(size={"height": size, "width": size}),
                               tokenizer=tokenizer, patch_size=patch, vision_feature_select_strategy="full",
                               chat_template=template, num_additional_image_tokens=0)
    processor.save_pretrained(target)
    print("ok", target)
""")


@built_once
def build_tiny_vlm(target: Path = TINY_VLM, models_cache: Path = MODELS_CACHE) -> Path:
    """A 3M-parameter LLaVA (SigLIP 32 px / 8 px patches: 16 image tokens; 2-layer Llama) that loads with
    AutoModelForImageTextToText and AutoProcessor. Built once per checkout. The language model's weights are drawn
    wider than usual (initializer_range 0.4): with the default 0.02 its tied embeddings give near-uniform logits
    that a LoRA adapter on a frozen base cannot sharpen, so a test could not tell learning from noise."""
    if (target / "processor_config.json").exists() and (target / "model.safetensors").exists():
        return target
    result = run_python(BUILD_TINY_VLM, str(target), str(IMAGE_SIZE), str(PATCH_SIZE), json.dumps(CHAT_TEMPLATE),
                        env={"FINETUNE_STUDIO_MODELS": str(models_cache)})
    assert result.returncode == 0, result.stderr[-3000:]
    return target


TINY_IDEFICS3 = ROOT / ".test-cache" / "tiny-idefics3"

# An Idefics3 (SmolVLM's architecture): its own vision tower (32 px / 8 px patches) and a pixel-shuffle connector
# (scale 2: 16 patches -> 4 image tokens) before a tiny Llama with the bundled tokenizer. The text config names
# VLlama3ForCausalLM as SmolVLM's does: llama.cpp's converter reads that name to write the language GGUF, and
# Idefics3ForConditionalGeneration for the mmproj projector file.
BUILD_TINY_IDEFICS3 = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    from transformers import (AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor,
                              Idefics3VisionConfig, LlamaConfig)
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from trainer_core.host import hardware
    from trainer_core.protocol import paths
    from trainer_core.worker import model_files

    target, size, patch, template = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    bundled = model_files.convert_gguf(hardware.bundled_gguf_path(), paths.models_dir() / "SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(bundled)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>",
                                                                "<end_of_utterance>", "<global-img>"]})
    torch.manual_seed(0)
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=size, patch_size=patch)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=True, initializer_range=0.4, pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       architectures=["VLlama3ForCausalLM"])
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2, tie_word_embeddings=True,
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                            pad_token_id=tokenizer.pad_token_id)
    Idefics3ForConditionalGeneration(config).save_pretrained(target)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": size}, max_image_size={"longest_edge": size},
                                                do_image_splitting=False)
    Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=(size // patch) ** 2 // 4,
                      chat_template=template).save_pretrained(target)
    print("ok", target)
""")


@built_once
def build_tiny_idefics3(target: Path = TINY_IDEFICS3, models_cache: Path = MODELS_CACHE) -> Path:
    """A 3M-parameter Idefics3 (SmolVLM's architecture) that llama.cpp's converter turns into a language GGUF and an
    mmproj projector file, as it does not for the SigLIP LLaVA above. Built once per checkout."""
    if (target / "processor_config.json").exists() and (target / "model.safetensors").exists():
        return target
    result = run_python(BUILD_TINY_IDEFICS3, str(target), str(IMAGE_SIZE), str(PATCH_SIZE), json.dumps(CHAT_TEMPLATE),
                        env={"FINETUNE_STUDIO_MODELS": str(models_cache)})
    assert result.returncode == 0, result.stderr[-3000:]
    return target


def draw_shape(colour: str, shape: str, rng: random.Random, size: int = 48) -> Image.Image:
    """A filled circle or square of ``colour`` at a random place and size on white."""
    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    x, y, side = rng.randint(0, size // 3), rng.randint(0, size // 3), rng.randint(size // 2, 2 * size // 3)
    box = [x, y, x + side, y + side]
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=COLOURS[colour])
    return image


def shape_rows(folder: Path, count: int, seed: int, prefix: str = "img") -> list[dict]:
    """``count`` images saved under ``folder`` and their flat rows {image (relative path), question, answer,
    shape}: the colour is the answer."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        name = f"{prefix}-{i:04d}.png"
        draw_shape(colour, shape, rng).save(folder / name)
        rows.append({"image": name, "question": QUESTION, "answer": colour, "shape": shape})
    return rows



def as_messages(row: dict) -> dict:
    """A flat row as a conversation whose user turn holds an image part."""
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": row["image"]},
                                                      {"type": "text", "text": row["question"]}]},
                         {"role": "assistant", "content": row["answer"]}]}
