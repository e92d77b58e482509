"""Speech-to-text models (dashboard half): Whisper-style encoder-decoders, trained with method stt on audio clips and
their transcripts, scored by word and character error rates, served on /v1/audio/transcriptions."""
from __future__ import annotations

from trainer_core.kinds.base import TRANSCRIBE, NO_ONNX, Facts, ModelKind

MODEL_TYPES = ("whisper",)  # and its fine-tunes: distil-whisper, whisper-large-v3-turbo...
ARCH_HINTS = ("WhisperForConditionalGeneration", "ForSpeechSeq2Seq")


def detect(facts: Facts) -> bool:
    return facts.model_type in MODEL_TYPES or any(hint in facts.architecture for hint in ARCH_HINTS)


KIND = ModelKind(
    name="speech",
    label="Speech-to-text",
    summary="A model that transcribes (or translates) audio into text.",
    detected_by="config.json's model_type is whisper, or its architecture is a speech seq2seq model",
    detect=detect,
    output="speech",
    data_shapes=("speech",),
    methods=("stt",),
    adapters=("lora", "full"),
    method_fix="choose a Whisper model (e.g. openai/whisper-tiny, openai/whisper-small)",
    serve_routes=("/v1/audio/transcriptions",),
    serve_engine="transformers serve",
    vllm="speech-to-text models are served by transformers serve (/v1/audio/transcriptions)",
    eval_metrics=("wer", "cer"),
    eval_defaults=("wer", "cer"),
    exports={"gguf": "gguf: a speech-to-text model is not converted to GGUF here (llama.cpp's converter takes "
                     "language models): export merged",
             "onnx": NO_ONNX},
    default_exports=("merged",),
    playground=TRANSCRIBE,
    samples="transcripts of the eval clips (WER and CER)",
    memory_inputs=("parameters", "audio window", "batch size", "adapter", "precision"),
    uses="it transcribes audio and does not write chat answers: load its weights folder with transformers' "
         "WhisperForConditionalGeneration and WhisperProcessor",
    processor=True,
    worker="trainer_core.worker.methods.stt",
)
