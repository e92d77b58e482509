"""Model resolver (worker-only): a model's config -> the auto class that loads it and its processing class
(a tokenizer for a text model, an AutoProcessor for a vision-language model), and the LoRA targets that the
vision/language/attention/MLP switches select in it.

The dashboard tells the same two kinds apart from the JSON files alone (``trainer_core.planning.modality``); here the
answer comes from transformers' own auto mappings, so a model transformers knows is loaded by the class it names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText,
                          AutoModelForSequenceClassification, AutoModelForSpeechSeq2Seq, AutoProcessor)
from transformers.models.auto.modeling_auto import (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                                                    MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)

from trainer_core.config import TrainConfig
from trainer_core.planning.modality import SPEECH, TEXT, VISION

# Module path parts that mark the vision side of a vision-language model (tower and projector) across families:
# LLaVA (vision_tower, multi_modal_projector), Qwen-VL (visual, merger), Idefics3/SmolVLM (vision_model,
# connector), Gemma 3 (vision_tower, multi_modal_projector), Mllama (vision_model, multi_modal_projector).
VISION_PARTS = ("vision_tower", "vision_model", "visual", "vision_encoder", "image_encoder")
PROJECTOR_PARTS = ("multi_modal_projector", "mm_projector", "connector", "merger", "projector")
# Linear layers of a vision tower, by what they are (names differ from the language model's).
VISION_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "qkv", "proj", "query", "key", "value")
VISION_MLP = ("fc1", "fc2", "gate_proj", "up_proj", "down_proj", "linear_fc1", "linear_fc2")


@dataclass(frozen=True)
class Resolved:
    kind: str  # TEXT, VISION or SPEECH
    model_class: type
    model_type: str


def resolve(model_ref: str, cfg: TrainConfig, token: str | None) -> Resolved:
    """The auto class for this model under the run's method (reward models keep their score head)."""
    config = AutoConfig.from_pretrained(model_ref, token=token, trust_remote_code=cfg.trust_remote_code)
    model_type = str(getattr(config, "model_type", ""))
    if cfg.method_spec.model_class == "sequence_classification":
        return Resolved(TEXT, AutoModelForSequenceClassification, model_type)
    if is_speech_config(config):  # Whisper-style encoder-decoders: audio in, transcript out
        return Resolved(SPEECH, AutoModelForSpeechSeq2Seq, model_type)
    if is_vision_config(config):
        return Resolved(VISION, AutoModelForImageTextToText, model_type)
    return Resolved(TEXT, AutoModelForCausalLM, model_type)


def is_vision_config(config) -> bool:
    """A model transformers loads as image-text-to-text (LLaVA, Qwen-VL, Gemma 3, Idefics3, ...)."""
    model_type = str(getattr(config, "model_type", ""))
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return True
    auto_map = getattr(config, "auto_map", None) or {}  # remote-code models name their own classes
    return "AutoModelForImageTextToText" in auto_map or "AutoModelForVision2Seq" in auto_map


def is_speech_config(config) -> bool:
    """A model transformers loads as speech-to-text (Whisper, Speech2Text, ...)."""
    return str(getattr(config, "model_type", "")) in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES


def load_processor(model_ref: str, cfg: TrainConfig, token: str | None):
    """The processor of a vision-language model; its tokenizer gets a pad token when it has none."""
    processor = AutoProcessor.from_pretrained(model_ref, token=token, trust_remote_code=cfg.trust_remote_code)
    tokenizer = processor.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return processor


def part_of(name: str) -> str:
    """'vision', 'projector' or 'language': which side of a vision-language model a module belongs to."""
    parts = name.split(".")
    if any(p in PROJECTOR_PARTS for p in parts):
        return "projector"
    if any(p in VISION_PARTS for p in parts):
        return "vision"
    return "language"


def lora_targets(model, cfg: TrainConfig) -> list[str]:
    """The full names of the linear layers LoRA adapts in a vision-language model, from the four switches:
    language layers take ``cfg.effective_target_modules`` (attention/MLP switches, or the explicit list);
    vision layers take the tower's attention and/or MLP linears and the projector's. The output head never."""
    language = set(cfg.effective_target_modules) if cfg.finetune_language_layers else set()
    vision = set()
    if cfg.finetune_vision_layers:
        vision |= set(VISION_ATTENTION) if cfg.finetune_attention_modules else set()
        vision |= set(VISION_MLP) if cfg.finetune_mlp_modules else set()
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
            continue
        leaf, side = name.rsplit(".", 1)[-1], part_of(name)
        if (side == "language" and leaf in language) or (side == "vision" and leaf in vision) \
                or (side == "projector" and cfg.finetune_vision_layers):
            names.append(name)
    return names


def target_pattern(names: list[str]) -> str:
    """PEFT takes a string target as one regex matched against each full module name."""
    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$"

