"""Text models (dashboard half): a causal language model that writes answers — chat, raw text, preference pairs,
prompts for GRPO. The kind every other kind is told apart from: a model folder none of the others claims."""
from __future__ import annotations

from trainer_core.kinds.base import CHAT, NO_ONNX, Facts, ModelKind

TEXT_METRICS = ("exact", "rouge", "bleu", "perplexity", "judge", "preference_accuracy", "reward", "tool_calls")


def detect(facts: Facts) -> bool:
    return True  # last in the registry: what no other kind claims is a language model


KIND = ModelKind(
    name="text",
    label="Text",
    summary="A language model that writes answers: chat, completions, preference and reward-guided tuning.",
    detected_by="any model folder no other kind claims (a causal language model's config.json)",
    detect=detect,
    output="text",
    data_shapes=("chat", "text", "pairs", "kto", "prompts"),
    methods=("sft", "cpt", "dpo", "orpo", "simpo", "kto", "grpo"),
    adapters=("lora", "qlora", "full"),
    method_fix="choose a text model",
    serve_routes=("/v1/chat/completions", "/v1/completions"),
    serve_engine="transformers serve (vLLM on a CUDA host with the vllm extra)",
    eval_metrics=TEXT_METRICS,
    eval_defaults=("exact", "rouge", "bleu", "perplexity"),
    exports={"onnx": NO_ONNX},
    default_exports=("merged", "gguf"),
    playground=CHAT,
    samples="generated answers to the sample prompts",
    worker="trainer_core.worker.engines",
)
