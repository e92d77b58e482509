"""How many data-parallel processes a run uses, on which GPUs, and what that does to its batch.

Dashboard-safe (no torch). One process per GPU of the run's device set, or ``num_processes`` when set;
on CPU one process unless ``num_processes`` asks for more (the same launcher then uses the gloo backend).
A run with more than one process is started by torchrun (``trainer_core.worker.launch``); a run with one process
starts ``trainer_core.worker`` directly, exactly as before.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainer_core.host import hardware

if TYPE_CHECKING:  # a run's settings, read by attribute: config sits above host (tests/test_layering.py)
    from trainer_core.config import TrainConfig

NPROC_ENV = "FINETUNE_STUDIO_NPROC"  # the launcher's process count, decided by the orchestrator


def run_gpus(cfg: TrainConfig, cuda: bool | None = None, count: int | None = None) -> list[int]:
    """The GPU indices (NVML / nvidia-smi order) the run trains on; empty on CPU, and empty for "every
    visible GPU" (gpu_ids empty, num_processes automatic), which the scheduler reserves as ``gpu*``."""
    cuda = hardware.cuda_available() if cuda is None else cuda
    if not cuda:
        return []
    if cfg.gpu_ids:
        return sorted(set(cfg.gpu_ids))
    if cfg.num_processes > 0:  # "the first N GPUs": pinned, so a single process never sees (and wraps) the rest
        return list(range(cfg.num_processes))
    return []


def process_count(cfg: TrainConfig, cuda: bool | None = None, count: int | None = None) -> int:
    """Data-parallel processes the launcher will start for ``cfg``."""
    cuda = hardware.cuda_available() if cuda is None else cuda
    if cfg.num_processes > 0:
        return cfg.num_processes
    if not cuda:
        return 1
    gpus = run_gpus(cfg, cuda) or list(range(hardware.gpu_count() if count is None else count))
    return max(len(gpus), 1)


def global_batch(cfg: TrainConfig, processes: int) -> int:
    """Rows per optimizer update: every process trains batch_size rows per micro-step."""
    return cfg.batch_size * cfg.gradient_accumulation_steps * processes


def steps_per_epoch(examples: int, batch_size: int, accumulation: int, processes: int = 1) -> int:
    """transformers' Trainer under accelerate: the epoch's batches (the last one partial) are dealt to the
    processes in turn, the last round padded so every process gets the same count; then one update per
    ``accumulation`` batches of a process."""
    if not examples:
        return 0
    batches = math.ceil(math.ceil(examples / batch_size) / max(processes, 1))
    return max(math.ceil(batches / accumulation), 1)


def worker_command(run_dir: Path, processes: int) -> list[str]:
    """One process: the worker itself. More: the torchrun launcher, which starts ``processes`` workers."""
    module = "trainer_core.worker" if processes <= 1 else "trainer_core.worker.launch"
    return [sys.executable, "-m", module, str(run_dir)]


def worker_env(cfg: TrainConfig, processes: int, cuda: bool | None = None) -> dict[str, str]:
    """GPU-related environment of the worker (or launcher) process."""
    # CUDA numbers GPUs fastest-first by default, NVML (nvidia-smi, our gpu_ids, memory and resource
    # readings) by PCI bus: on a mixed-GPU host they disagree unless CUDA uses the bus order too.
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", NPROC_ENV: str(processes)}
    gpus = run_gpus(cfg, cuda)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def use_fsdp(cfg: TrainConfig, processes: int, need_gb: float, gpu_free_gb: float) -> bool:
    """Shard the model (FSDP) only when data-parallel copies would not fit: several GPU processes, a
    16-bit model (bitsandbytes 4-bit weights go with DDP), and an estimate above one GPU's free memory."""
    if processes <= 1 or cfg.effective_4bit or not math.isfinite(gpu_free_gb):
        return False
    return need_gb > gpu_free_gb
