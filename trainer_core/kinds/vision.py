"""Vision-language models (dashboard half): an image and text in, text out (SmolVLM, Qwen2.5-VL, Gemma 3, LLaVA...),
trained with sft on image + text rows. Told from config.json: a vision tower's config, or an image-text-to-text
architecture with an image token. GGUF only where llama.cpp's converter writes both the language model and the
mmproj projector file (asked at export time: export.spec.vision_gguf_problem)."""
from __future__ import annotations

from trainer_core.kinds.base import CHAT, NO_ONNX, Facts, ModelKind

ARCH_HINTS = ("ForConditionalGeneration", "ImageTextToText", "VisionText", "Vision2Seq")


def detect(facts: Facts) -> bool:
    if isinstance(facts.config.get("vision_config"), dict):
        return True
    return any(hint in facts.architecture for hint in ARCH_HINTS) and "image_token_index" in facts.config


KIND = ModelKind(
    name="vision",
    label="Vision-language",
    summary="A model that reads images with the text and writes answers.",
    detected_by="config.json has a vision_config, or an image-text-to-text architecture with an image_token_index",
    detect=detect,
    output="text",
    data_shapes=("chat", "images"),
    methods=("sft",),
    adapters=("lora", "qlora", "full"),
    method_fix="choose a vision-language model (e.g. SmolVLM, Qwen2.5-VL, Gemma 3, LLaVA)",
    serve_routes=("/v1/chat/completions",),
    serve_engine="transformers serve (vLLM on a CUDA host with the vllm extra)",
    eval_metrics=("exact", "rouge", "bleu", "perplexity", "judge"),
    eval_defaults=("exact", "rouge", "bleu", "perplexity"),
    exports={"onnx": NO_ONNX},
    default_exports=("merged", "gguf"),
    gguf_needs_converter=True,
    playground=CHAT,  # with images attached to messages (ResolvedSource.sees_images)
    samples="answers to the sample prompts with their images",
    memory_inputs=("parameters", "sequence length", "batch size", "adapter", "precision", "tokens per image"),
    processor=True,
    worker="trainer_core.worker.vision",
)
