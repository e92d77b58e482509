"""How many data-parallel processes a run uses, on which GPUs, and what that does to its batch.

Dashboard-safe (no torch). One process per GPU of the run's device set, or ``num_processes`` when set;
on CPU one process unless ``num_processes`` asks for more (the same launcher then uses the gloo backend).
A run with more than one process is started by torchrun (``trainer_core.launch``); a run with one process
starts ``trainer_core.worker`` directly, exactly as before.
"""
from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path

from trainer_core import hardware
from trainer_core.config import TrainConfig

NPROC_ENV = "FINETUNE_STUDIO_NPROC"  # the launcher's process count, decided by the orchestrator
RANK_LOG_LINES = 40


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
    module = "trainer_core.worker" if processes <= 1 else "trainer_core.launch"
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


# ---------------------------------------------------------------------- when a rank fails
def rank_error_path(run_dir: Path, rank: int) -> Path:
    """Where a rank writes its own failure (message, type, traceback, time); read back by ``report_failure``."""
    return run_dir / "ranks" / f"rank-{rank}.error.json"


def rank_log_tail(run_dir: Path, rank: int, lines: int = RANK_LOG_LINES) -> str:
    """The last lines a rank wrote (stdout, then stderr), from torchrun's per-rank log files."""
    parts = []
    for stream in ("stdout.log", "stderr.log"):
        for path in sorted((run_dir / "ranks").glob(f"*/attempt_*/{rank}/{stream}")):
            text = path.read_text(errors="replace").splitlines()
            parts.extend(text[-lines:])
    return "\n".join(parts[-lines:])


def root_cause(failures: dict, run_dir: Path) -> tuple[int, str, str]:
    """(rank, reason, exception type) of the rank that failed first.

    torchrun stops the surviving ranks with SIGTERM, and a rank whose peer vanished fails in its next
    collective; neither is the cause. So: a rank killed by any other signal first (the OOM killer, a
    segfault, kill -9), then the earliest error a rank reported itself, then any other exit code."""
    def describe(rank: int, failure) -> tuple[tuple, str, str]:
        own = _read_json(rank_error_path(run_dir, rank))
        if failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM:
            name = _signal_name(-failure.exitcode)
            hint = " (often the out-of-memory killer)" if -failure.exitcode == signal.SIGKILL else ""
            return (0, 0.0, rank), f"was killed by {name}{hint}", "RankKilled"
        if own:
            return (1, float(own.get("ts", 0.0)), rank), f"failed: {own.get('message', '')}", own.get("exc_type", "")
        if failure.exitcode == -signal.SIGTERM:
            return (3, 0.0, rank), "was terminated (SIGTERM)", "RankTerminated"
        return (2, 0.0, rank), f"exited with code {failure.exitcode}", "RankFailed"

    described = sorted(describe(rank, failure) + (rank,) for rank, failure in failures.items())
    _, reason, exc_type, rank = described[0]
    return rank, reason, exc_type or "RankFailed"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
