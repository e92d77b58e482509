"""Text-to-speech models (dashboard half): Sesame CSM over the Mimi codec, trained with method tts on audio clips
and their texts. Only transformers runs it: no GGUF, no OpenAI-compatible speech route here; the Playground speaks."""
from __future__ import annotations

from trainer_core.kinds.base import SPEAK, NO_ONNX, Facts, ModelKind

MODEL_TYPES = ("csm",)
# Why a text-to-speech run has no GGUF; the export's model card says it too.
NO_GGUF = ("llama.cpp cannot run a Sesame CSM text-to-speech model (its GGUF converter has no CSM and no Mimi "
           "codec), so neither can Ollama or LM Studio; it loads in transformers only "
           "(CsmForConditionalGeneration and AutoProcessor)")


def detect(facts: Facts) -> bool:
    return facts.model_type in MODEL_TYPES


KIND = ModelKind(
    name="tts",
    label="Text-to-speech",
    summary="A model that speaks text (codec frames decoded to audio).",
    detected_by="config.json's model_type is csm",
    detect=detect,
    output="audio",
    data_shapes=("speech",),
    methods=("tts",),
    adapters=("lora", "full"),
    method_fix="choose a Sesame CSM model (e.g. sesame/csm-1b, unsloth/csm-1b): method tts trains those",
    serve_routes=(),
    serve_engine="",
    not_served="served: no server here generates speech over an OpenAI-compatible API (transformers serve has no "
               "/v1/audio/speech route for it, and vLLM does not run CSM)",
    vllm="vLLM serves models that write answers",
    not_evaluated="evaluated by its answers, nor by wer/cer (they score a speech-to-text model's transcripts)",
    eval_instead="its eval loss on the held-out clips is charted during training (Run details), with the spoken "
                 "samples to play",
    exports={"gguf": f"gguf: {NO_GGUF}: export merged", "onnx": NO_ONNX},
    default_exports=("merged",),
    playground=SPEAK,
    samples="spoken WAV clips of the sample sentences",
    memory_inputs=("parameters", "clip length (codec frames)", "batch size", "adapter", "precision"),
    uses="it speaks text and does not write answers: try it in the Playground's Text to speech mode, or load its "
         "weights folder with transformers' CsmForConditionalGeneration and AutoProcessor",
    processor=True,
    worker="trainer_core.worker.methods.tts",
)
