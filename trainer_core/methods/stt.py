"""Speech-to-text (dashboard half): a Whisper-style encoder-decoder (WhisperForConditionalGeneration +
WhisperProcessor) tuned on audio + transcript rows (trainer_core.data.audio) with transformers' Seq2SeqTrainer;
word and character error rates (jiwer) on the eval split before the first step (the base model's) and at every
eval step. Its settings are the YAML section ``stt:`` (SttSettings), read once into
``TrainConfig.method_settings``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer_core.methods.base import TRAINER_METRICS, MethodSpec, MetricSpec
from trainer_core.methods.settings import setting
from trainer_core.protocol.errors import FieldError

FORMAT = "speech"  # the data shape (trainer_core.data.audio): {"audio": path | bytes | {array, sampling_rate}, "text"}


@dataclass
class SttSettings:
    language: str = setting("", "The spoken language as Whisper names it (en, de, french...); empty: detected once "
                                "from the first training clips and trained with, as the model will detect it.")
    task: str = setting("transcribe", "transcribe (text in the spoken language) or translate (English text).",
                        choices=("transcribe", "translate"))
    columns: dict = setting({}, "Your column names for the canonical ones, e.g. {audio: clip, text: sentence}.")
    eval_on_start: bool = setting(True, "Evaluate before the first step: the base model's WER, the baseline.")
    generation_max_length: int = setting(225, "Longest transcript generated at evaluation, in tokens.", low=1)
    num_beams: int = setting(1, "Beams when generating at evaluation (1: greedy, the fastest).", low=1)
    lora_target_modules: list = setting(["q_proj", "v_proj"], "adapter lora: the attention layers to adapt "
                                                              "(encoder and decoder).")


def validate(cfg: Any) -> list[FieldError]:
    settings: SttSettings = cfg.method_settings
    problems: list[FieldError] = []
    if not all(k in ("audio", "text") and isinstance(v, str) and v for k, v in settings.columns.items()):
        problems.append(FieldError("stt.columns", "maps audio and text to your column names, e.g. "
                                                  "{audio: clip, text: sentence}"))
    if getattr(cfg, "packing", False):
        problems.append(FieldError("packing", "speech clips are encoded one by one: turn packing off"))
    if getattr(cfg, "train_on_completions", False):
        problems.append(FieldError("train_on_completions", "a transcript is all target: turn this off"))
    return problems


METRICS = (
    MetricSpec("eval_wer", "WER", axis="error rate (lower is better)", format=".3f", tile=True),
    MetricSpec("eval_cer", "CER", axis="error rate (lower is better)", format=".3f", tile=True),
    *TRAINER_METRICS[:4],
)

SPEC = MethodSpec(
    name="stt",
    label="Speech-to-text (Whisper)",
    help="Tune a Whisper-style speech model on audio clips and their transcripts: Seq2SeqTrainer trains the "
         "decoder to write the transcript, and the eval split is transcribed before the first step (the base "
         "model's word and character error rates) and at every eval step, so WER and CER are charted as they "
         "fall. Clips longer than the model's window (30 s for Whisper) are left out and counted.",
    data_shapes=(FORMAT,),
    data_fix="give an audio column (audio, path or file: a file path, bytes or the datasets Audio feature) and a "
             "text column (text, transcript, transcription or sentence), or map yours with stt.columns",
    validate=validate,
    metric_specs=METRICS,
    adapters=("lora", "full"),
    loads_own_model=True,  # WhisperForConditionalGeneration + WhisperProcessor (worker half load_model)
    settings=SttSettings,  # the YAML section ``stt:``
    output="speech",
    model_class="speech_seq2seq",
    preview_fields=("stt",),
)
