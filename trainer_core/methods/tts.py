"""Text-to-speech (dashboard half): Sesame's CSM (CsmForConditionalGeneration, a Llama backbone and a depth decoder
over the Mimi codec's codebooks, all in transformers) tuned on audio + text (+ speaker) rows. The worker encodes
each clip to codec frames once and caches them like tokenized text; the backbone learns the first codebook of each
frame and the depth decoder the rest (transformers' own CSM loss). Samples during training are spoken WAV clips
kept in the run folder. Its settings are the YAML section ``tts:`` (TtsSettings), read once into
``TrainConfig.method_settings``.

Why CSM: transformers implements the whole family (model, Mimi codec, processor, training loss and generation) with
no package beyond it, so it trains and speaks offline on CPU as on CUDA, where Unsloth also loads it. Orpheus needs
the separate ``snac`` codec package; Spark-TTS and OuteTTS need their own code. llama.cpp cannot run CSM (its
converter has no CSM or Mimi), so a CSM model loads in transformers only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer_core.methods.base import TRAINER_METRICS, MethodSpec, MetricSpec
from trainer_core.methods.settings import setting
from trainer_core.protocol.errors import FieldError

FORMAT = "speech"  # the data shape (trainer_core.data.audio): {"audio", "text", "speaker"?}
MAX_SPEAKER = 99  # CSM's speaker ids are small integers written into the prompt as "[0]"


@dataclass
class TtsSettings:
    speaker: int = setting(0, "The speaker id for rows without one, and the default voice in samples and the "
                              "Playground (CSM writes it as [0] before the text).", low=0, high=MAX_SPEAKER)
    columns: dict = setting({}, "Your column names for the canonical ones, e.g. {audio: clip, text: sentence, "
                                "speaker: voice}.")
    max_clip_s: float = setting(20.0, "The longest clip trained on, in seconds; longer ones are left out and "
                                      "counted (CSM's context holds about 160 s: 12.5 codec frames a second).",
                                low=0.5, high=150.0)
    depth_decoder_ratio: float = setting(1.0, "The share of each clip's frames the depth decoder (codebooks 2 and "
                                              "up) trains on; lower it (e.g. 0.25) to save memory on long clips, as "
                                              "Sesame trained.", low=0.0, high=1.0, low_open=True)
    sample_texts: list = setting([], "Sentences spoken as samples at each evaluation and at the end (empty: the "
                                     "first two eval rows' texts, else the first training row's).")
    max_sample_s: float = setting(10.0, "The longest sample spoken, in seconds (the Playground's cap too).",
                                  low=0.5, high=60.0)
    eval_on_start: bool = setting(True, "Evaluate before the first step: the base model's eval loss, the baseline.")
    lora_target_modules: list = setting(["q_proj", "k_proj", "v_proj", "o_proj"],
                                        "adapter lora: the attention layers to adapt, in the backbone and the depth "
                                        "decoder (the codec stays frozen and out of the adapter).")


def validate(cfg: Any) -> list[FieldError]:
    settings: TtsSettings = cfg.method_settings
    problems: list[FieldError] = []
    if not all(k in ("audio", "text", "speaker") and isinstance(v, str) and v for k, v in settings.columns.items()):
        problems.append(FieldError("tts.columns", "maps audio, text and speaker to your column names, e.g. "
                                                  "{audio: clip, text: sentence, speaker: voice}"))
    texts = settings.sample_texts
    if not all(isinstance(t, str) and t.strip() and len(t) <= 500 and "\x00" not in t for t in texts) \
            or len(texts) > 8:
        problems.append(FieldError("tts.sample_texts", "up to 8 sentences of at most 500 characters each"))
    if getattr(cfg, "packing", False):
        problems.append(FieldError("packing", "speech clips are encoded one by one: turn packing off"))
    if getattr(cfg, "train_on_completions", False):
        problems.append(FieldError("train_on_completions", "the clip's frames are all target: turn this off"))
    return problems


METRICS = (
    MetricSpec("eval_loss", "Eval loss", axis="loss (lower is better)", tile=True),
    MetricSpec("loss", "Train loss", axis="loss", tile=True),
    *TRAINER_METRICS[2:4],
)

SPEC = MethodSpec(
    name="tts",
    label="Text-to-speech (CSM)",
    help="Tune a Sesame CSM text-to-speech model on audio clips and their texts (a speaker id per row, optional): "
         "every clip is encoded once by the model's Mimi codec and cached; the backbone learns each frame's first "
         "codebook and the depth decoder the others. The eval split's loss is measured before the first step (the "
         "base model's) and at every eval step, and the sample sentences are spoken into WAV clips you can play "
         "on Live. Only transformers loads CSM (llama.cpp cannot run it).",
    data_shapes=(FORMAT,),
    data_fix="give an audio column (audio, path or file: a file path, bytes or the datasets Audio feature) and a "
             "text column (text, transcript, transcription or sentence), and optionally a speaker column (speaker "
             "or speaker_id), or map yours with tts.columns",
    validate=validate,
    metric_specs=METRICS,
    adapters=("lora", "full"),
    loads_own_model=True,  # CsmForConditionalGeneration + its processor (worker half load_model)
    settings=TtsSettings,  # the YAML section ``tts:``
    output="audio",
    model_class="text_to_speech",
    preview_fields=("tts",),
)
