"""Loading a model source (model_source.ResolvedSource) in a worker: the base model, a run's adapter on its base,
or full weights; and merging an adapter into a plain 16-bit model folder (served by engines that cannot
apply an adapter, exported as merged weights). Worker-only: imports torch, transformers and peft.

A QLoRA run trained on a 4-bit base; its adapter is applied to (and merged into) the base in 16 bits, never
into 4-bit weights, which would degrade the model.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
from pathlib import Path

from trainer_core.config import TrainConfig
from trainer_core.specs.model_source import ResolvedSource
from trainer_core.worker.model_files import resolve_model

MERGED_MARKER = ".merged-from"  # in a merged folder: which adapter files (and sizes/mtimes) it was made from


def base_folder(resolved: ResolvedSource, log=print) -> str:
    """A from_pretrained-able folder (or hub id) of the source's base model."""
    cfg = resolved.config or TrainConfig()
    return resolve_model(dataclasses.replace(cfg, model_name=resolved.base_model), log=log)


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")  # a vision or speech model's processor


def has_processor(folder: Path | None) -> bool:
    """Whether ``folder`` holds a processor (image processor or feature extractor) beside its tokenizer."""
    return folder is not None and any((folder / name).exists() for name in PROCESSOR_FILES)


def processor_folder(resolved: ResolvedSource, base: str | None = None, log=print) -> str:
    """Where the source's processor is: its weights folder when the run saved one there (the processor it trained
    with), else its base model's folder (``base`` when the caller has it already)."""
    if has_processor(resolved.weights_dir):
        return str(resolved.weights_dir)
    return base if base is not None else base_folder(resolved, log=log)


def torch_dtype(device: str):
    import torch

    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_source(resolved: ResolvedSource, device: str = "cpu", log=print):
    """(model, tokenizer) of ``resolved`` on ``device``, in eval mode; an adapter stays unmerged (PeftModel)."""
    from transformers import AutoTokenizer

    dtype = torch_dtype(device)
    if resolved.model_dir is not None:
        folder = str(resolved.model_dir)
        model = auto_class(folder).from_pretrained(folder, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    else:
        base = base_folder(resolved, log=log)
        model = auto_class(base).from_pretrained(base, dtype=dtype)
        # The run saved its tokenizer (with the chat template it trained with) next to the adapter.
        tokenizer_dir = resolved.adapter_dir if resolved.adapter_dir and (resolved.adapter_dir / "tokenizer_config.json").exists() else base
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        if resolved.adapter_dir is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(resolved.adapter_dir))
    model.to(device)
    model.eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def auto_class(folder: str):
    """AutoModelForImageTextToText for a vision-language model (a vision run's adapter applies to its whole model),
    AutoModelForSpeechSeq2Seq for a speech-to-text model (Whisper), AutoModelForTextToWaveform for a text-to-speech
    model (Sesame CSM: CsmForConditionalGeneration, its codec inside), AutoModelForCausalLM otherwise."""
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSpeechSeq2Seq,
                              AutoModelForTextToWaveform)
    from transformers.models.auto.modeling_auto import MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES

    from trainer_core.worker.model_resolver import is_speech_config, is_vision_config

    config = AutoConfig.from_pretrained(folder)
    if is_speech_config(config):
        return AutoModelForSpeechSeq2Seq
    if str(getattr(config, "model_type", "")) in MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES:
        return AutoModelForTextToWaveform
    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def _adapter_stamp(adapter_dir: Path) -> str:
    files = sorted(p for p in adapter_dir.iterdir() if p.is_file())
    return json.dumps([[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in files])


MERGE_DTYPES = ("bfloat16", "float16", "float32")


def merge_adapter(resolved: ResolvedSource, target: Path, dtype: str = "bfloat16", log=print) -> Path:
    """Write the base model with ``resolved``'s adapter merged in, as safetensors in ``dtype`` (16-bit for an
    export; float32 keeps a CPU server's answers identical to the unmerged adapter's) plus the run's
    tokenizer, into ``target`` (atomically: a folder appears complete or not at all). A folder already made
    from the same adapter files in the same dtype is reused. Returns ``target``."""
    assert resolved.adapter_dir is not None, "only an adapter is merged"
    assert dtype in MERGE_DTYPES, dtype
    stamp = dtype + " " + _adapter_stamp(resolved.adapter_dir)
    marker = target / MERGED_MARKER
    if _merged_from(marker) == stamp:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Two jobs merging the same adapter at once (two servers, a server and an export): the second waits and
    # reuses the first's folder, rather than replacing it while the first loads from it.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _merged_from(marker) == stamp:
            return target
        _merge_into(resolved, target, dtype, stamp, log)
    return target


def _merged_from(marker: Path) -> str | None:
    try:
        return marker.read_text()
    except OSError:
        return None


def _merge_into(resolved: ResolvedSource, target: Path, dtype: str, stamp: str, log) -> None:
    import torch

    log(f"Merging the adapter {resolved.adapter_dir} into its base model ({target})")
    model, tokenizer = load_source(resolved, device="cpu", log=log)
    merged = model.merge_and_unload().to(getattr(torch, dtype))
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # a vision or speech run: the processor it trained with (image processor / feature extractor too)
        if has_processor(resolved.adapter_dir):
            from transformers import AutoProcessor

            AutoProcessor.from_pretrained(str(resolved.adapter_dir)).save_pretrained(tmp)
        (tmp / MERGED_MARKER).write_text(stamp)
    except BaseException:  # a full disk or a Cancel: no half-written copy of the model left in the run's folder
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
