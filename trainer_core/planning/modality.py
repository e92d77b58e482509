"""Text, vision-language, speech-to-text or text-to-speech model, told from its config files without loading it (dashboard side: no torch,
transformers or peft here; the worker's ``trainer_core.worker.model_resolver`` picks the auto classes).

Reads ``config.json`` and, when present, ``preprocessor_config.json`` / ``processor_config.json`` as JSON: what the
vision tower is, the image size it sees, and how many tokens one image takes in the sequence (the number that has to
fit in max_seq_length: a cut ``<image>`` run is the "Image features and image tokens do not match" failure).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from trainer_core import kinds
from trainer_core.kinds.base import Facts
from trainer_core.planning import model_info
from trainer_core.config import _HUB_ID_RE, BUNDLED_MODEL, looks_like_path
from trainer_core.protocol import paths

# Kind names (trainer_core.kinds decides which a model folder is; this module reads what the form shows about it)
TEXT, VISION, SPEECH, TTS, EMBEDDING = "text", "vision", "speech", "tts", "embedding"
# Model types whose processors tile or resize images to a size of their own: tokens per image depend on the image.
_DYNAMIC = {"qwen2_vl": "grows with the image's pixels (Qwen2-VL dynamic resolution)",
            "qwen2_5_vl": "grows with the image's pixels (Qwen2.5-VL dynamic resolution)",
            "qwen3_vl": "grows with the image's pixels (Qwen3-VL dynamic resolution)",
            "llava_next": "grows with the image's aspect ratio (LLaVA-NeXT anyres tiles)",
            "llava_onevision": "grows with the image's aspect ratio (anyres tiles)",
            "idefics3": "one block per tile; large images are split into tiles",
            "smolvlm": "one block per tile; large images are split into tiles",
            "mllama": "one block per tile (up to max_image_tiles)",
            "mistral3": "grows with the image's pixels (Pixtral patches)",
            "pixtral": "grows with the image's pixels (Pixtral patches)"}
# Model types whose tokens per image follow the image's pixels: one token per (patch x merge)-px square block.
_PIXEL_TOKENS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "mistral3", "pixtral")


@dataclass(frozen=True)
class ModalityInfo:
    """What the form shows about a model's inputs. ``image_tokens`` is the smallest number of tokens one image
    takes (the fixed count for fixed-size models, the base block for tiled or dynamic ones; 0 when unknown)."""

    kind: str  # a kind name of trainer_core.kinds: TEXT, VISION, SPEECH, TTS or EMBEDDING
    architecture: str
    model_type: str
    vision_tower: str = ""  # the vision config's model_type, e.g. siglip_vision_model
    image_size: int = 0  # pixels per side the tower sees (0: unknown or dynamic)
    patch_size: int = 0
    image_tokens: int = 0
    dynamic: str = ""  # how the count grows for models whose count depends on the image; "" when fixed
    image_token: str = ""  # the placeholder the processor expands, e.g. <image>
    merge: int = 0  # patches merged per side into one token (Qwen-VL, Pixtral: spatial_merge_size; 0: unknown)
    audio_window_s: float = 0.0  # speech: seconds of audio the feature extractor takes (30 for Whisper)
    sampling_rate: int = 0  # speech: the rate clips are resampled to (16000 for Whisper, 24000 for CSM's Mimi)
    codec: str = ""  # text-to-speech: the audio codec's model_type (mimi)
    codebooks: int = 0  # text-to-speech: codebooks per audio frame

    @property
    def is_vision(self) -> bool:
        return self.kind == VISION

    def resize_effect(self, max_side: int) -> str:
        """What image_max_side does to this model's tokens per image, for the New run form ("" for other models)."""
        if not self.is_vision:
            return ""
        if self.model_type in _PIXEL_TOKENS and self.patch_size:
            unit = self.patch_size * (self.merge or 1)
            if not max_side:
                return (f"Images go in at their own size: one token per {unit}×{unit} px block (a 1024×1024 image is "
                        f"{math.ceil(1024 / unit) ** 2:,} tokens). Set image_max_side to cap it.")
            return (f"At image_max_side {max_side} px: at most {math.ceil(max_side / unit) ** 2:,} tokens per image "
                    f"(a square one; one token per {unit}×{unit} px block).")
        if self.dynamic:
            return f"Tokens per image {self.dynamic}: image_max_side lowers the count of large images."
        if self.image_size:
            count = f"{self.image_tokens} tokens per image" if self.image_tokens else "the same tokens per image"
            return (f"The processor resizes every image to {self.image_size}×{self.image_size} px: {count} whatever "
                    "image_max_side (it only saves decoding large files).")
        return ""

    def summary(self) -> str:
        if self.kind == TTS:
            return (f"Text-to-speech model ({self.architecture}): speaks {self.sampling_rate or 24000} Hz audio "
                    f"through its {self.codec or 'audio'} codec, {self.codebooks or '?'} codebooks per frame; trains "
                    "on audio clips with their texts (method tts).")
        if self.kind == SPEECH:
            return (f"Speech-to-text model ({self.architecture}): trains on audio clips with transcripts, "
                    f"{self.sampling_rate or 16000} Hz, up to {self.audio_window_s or 30:g} s per clip.")
        if self.kind == EMBEDDING:
            return f"Embedding model ({self.architecture}): trains on pairs or triplets of texts (method embedding)."
        if not self.is_vision:
            return f"Text model ({self.architecture}): trains on chat or text data."
        parts = [f"Vision-language model ({self.architecture})"]
        if self.vision_tower:
            parts.append(f"vision tower {self.vision_tower}")
        if self.image_size:
            parts.append(f"images at {self.image_size}×{self.image_size} px" +
                         (f" in {self.patch_size}-px patches" if self.patch_size else ""))
        if self.image_tokens:
            count = f"{self.image_tokens} tokens per image"
            parts.append(count + (f" at least; {self.dynamic}" if self.dynamic else ""))
        elif self.dynamic:
            parts.append(f"tokens per image {self.dynamic}")
        else:
            parts.append("tokens per image unknown")
        return ", ".join(parts) + "."


_BUNDLED_FACTS = Facts({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})


def model_facts(model_name: str, token: str | None = None) -> Facts:
    """What the bundled model, a local folder or a hub id says about itself (config.json, the merged
    (pre)processor config, its marker files), read once per version of its files by model_info.folder_facts, which
    inspect_model reads too (hub: the local cache first, then the small JSON files). The folder is checked against
    the allowed roots on every call. Raises ``model_info.ModelInfoError`` (field model_name) when the config cannot
    be read."""
    name = model_name.strip()
    if name == BUNDLED_MODEL:
        return _BUNDLED_FACTS
    return model_info.folder_facts(_folder(name, token))


def detect_kind(model_name: str, token: str | None = None) -> kinds.ModelKind:
    """The model kind of a base model (trainer_core.kinds' capability row). Raises ``model_info.ModelInfoError``."""
    return kinds.detect(model_facts(model_name, token))


def detect_modality(model_name: str, token: str | None = None) -> ModalityInfo:
    """The modality of the bundled model, a local folder or a hub id, with what the form shows about its inputs.
    Raises ``model_info.ModelInfoError`` (field model_name) when the config cannot be read."""
    facts = model_facts(model_name, token)
    return from_configs(facts.config, facts.processor, facts.files)


def _folder(name: str, token: str | None) -> Path:
    if looks_like_path(name):
        try:
            folder = paths.resolve_inside(name, paths.allowed_data_roots())
        except paths.UnsafePathError as exc:
            raise model_info.ModelInfoError(f"{exc}. Put the model under the data root or set "
                                            "FINETUNE_STUDIO_ALLOWED_ROOTS.") from None
        if not (folder / "config.json").is_file():
            raise model_info.ModelInfoError(f"{folder} has no config.json: point at a Hugging Face model folder")
        return folder
    if not _HUB_ID_RE.match(name):
        raise model_info.ModelInfoError("not a hub id (org/name) nor an existing folder")
    config_path = Path(model_info._hub_file(name, "config.json", token, required=True))
    for optional in ("preprocessor_config.json", "processor_config.json"):
        model_info._hub_file(name, optional, token, required=False)  # lands beside config.json in the snapshot
    return config_path.parent


def from_configs(config: dict, processor: dict | None = None, files: frozenset[str] = frozenset()) -> ModalityInfo:
    """The modality from a model's config.json and its merged (pre)processor config (JSON dicts): its kind
    (trainer_core.kinds.detect) and the facts about its inputs that kind has."""
    processor = processor or {}
    facts = Facts(config, processor, files)
    kind, architecture, model_type = kinds.detect(facts).name, facts.architecture, facts.model_type
    if kind == TTS:
        codec = config.get("codec_config") if isinstance(config.get("codec_config"), dict) else {}
        return ModalityInfo(TTS, architecture, model_type, sampling_rate=_int(codec.get("sampling_rate")) or 24000,
                            codec=str(codec.get("model_type") or ""), codebooks=_int(config.get("num_codebooks")))
    if kind == SPEECH:
        extractor = processor.get("feature_extractor") if isinstance(processor.get("feature_extractor"), dict) \
            else processor  # transformers 5 nests it in processor_config.json; older files are flat
        return ModalityInfo(SPEECH, architecture, model_type,
                            audio_window_s=float(_int(extractor.get("chunk_length")) or 30),
                            sampling_rate=_int(extractor.get("sampling_rate")) or 16000)
    if kind != VISION:
        return ModalityInfo(kind, architecture, model_type)
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else {}
    image_size = _int(vision.get("image_size")) or _size(processor.get("size")) or _size(processor.get("crop_size"))
    patch_size = _int(vision.get("patch_size")) or _int(processor.get("patch_size"))
    return ModalityInfo(
        VISION, architecture, model_type,
        vision_tower=str(vision.get("model_type") or ""),
        image_size=image_size, patch_size=patch_size,
        image_tokens=_image_tokens(config, processor, model_type, image_size, patch_size),
        dynamic=_DYNAMIC.get(model_type, ""),
        image_token=str(processor.get("image_token") or "<image>"),
        merge=_int(vision.get("spatial_merge_size")) or _int(config.get("spatial_merge_size")))


def _image_tokens(config: dict, processor: dict, model_type: str, image_size: int, patch_size: int) -> int:
    """Tokens one image takes: a count the config states, else one per patch (what LLaVA-style towers emit)."""
    for source, key in ((config, "mm_tokens_per_image"), (processor, "image_seq_length"),
                        (processor, "image_seq_len"), (config, "image_seq_length"), (processor, "num_image_tokens")):
        value = _int(source.get(key))
        if value:
            return value
    if not (image_size and patch_size):
        return 0
    patches = (image_size // patch_size) ** 2
    if model_type in ("idefics3", "smolvlm"):
        scale = _int(config.get("scale_factor")) or 1
        return patches // (scale * scale)
    if model_type.startswith("qwen") and model_type.endswith("_vl"):
        merge = _int(config.get("vision_config", {}).get("spatial_merge_size")) or 2
        return max(1, patches // (merge * merge))
    extra = _int(processor.get("num_additional_image_tokens"))
    if config.get("vision_feature_select_strategy") == "default":  # the CLS token is dropped
        extra = max(0, extra - 1)
    return patches + extra


def _int(value) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else 0


def _size(value) -> int:
    if isinstance(value, dict):
        return _int(value.get("height")) or _int(value.get("shortest_edge")) or _int(value.get("longest_edge"))
    return _int(value)
