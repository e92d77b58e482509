"""CPU, RAM and GPU usage of a worker process, for the live view (psutil, and NVML when present; no torch).

NVML comes from the optional ``nvidia-ml-py`` package (``pip install nvidia-ml-py``, imported as
``pynvml``). Without it, or without a driver, samples simply carry no GPUs.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from functools import cache

import psutil

try:
    import pynvml
except ImportError:  # optional: GPU numbers are left out
    pynvml = None


@dataclass(frozen=True)
class GpuSample:
    index: int  # NVML index (nvidia-smi order; workers get CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA agrees)
    name: str
    utilization_pct: float | None  # None where NVML cannot read it (MIG slices, some virtual GPUs)
    memory_used_mb: float  # device-wide, every process; NaN when unreadable
    memory_total_mb: float
    run_memory_mb: float | None = None  # what the run's own processes hold on it; None when NVML cannot tell


@dataclass(frozen=True)
class ResourceSample:
    cpu_percent: float        # worker process plus its children; 100 = one core busy
    rss_mb: float             # resident memory of the worker process plus its children
    gpus: tuple[GpuSample, ...]
    ts: float


@cache
def _nvml_init() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver / no GPU: a normal CPU machine
        return False
    return True


def _nvml_ready() -> bool:
    """NVML initialised once per process; False when the package or the driver is missing."""
    return pynvml is not None and _nvml_init()


def _read(call, *args, default=None):
    """One NVML reading; ``default`` when this GPU does not support it (MIG, vGPU) or it failed."""
    try:
        return call(*args)
    except pynvml.NVMLError:
        return default


def gpu_samples(indices: list[int] | None = None, pids: frozenset[int] = frozenset()) -> tuple[GpuSample, ...]:
    """Utilisation and memory of the GPUs ``indices`` (None: every GPU NVML sees), and how much of it the
    processes ``pids`` hold. Each reading is taken on its own, so one unsupported reading (a MIG slice has no
    utilisation) hides only that number, not the GPU."""
    if not _nvml_ready():
        return ()
    count = _read(pynvml.nvmlDeviceGetCount, default=0)
    out = []
    for index in (range(count) if indices is None else [i for i in indices if i < count]):
        handle = _read(pynvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            continue  # fell off the bus: leave it out
        name = _read(pynvml.nvmlDeviceGetName, handle, default=f"GPU {index}")
        util = _read(pynvml.nvmlDeviceGetUtilizationRates, handle)
        memory = _read(pynvml.nvmlDeviceGetMemoryInfo, handle)
        out.append(GpuSample(index, name.decode() if isinstance(name, bytes) else str(name),
                             float(util.gpu) if util is not None else None,
                             memory.used / 2**20 if memory is not None else math.nan,
                             memory.total / 2**20 if memory is not None else math.nan,
                             _run_memory_mb(handle, pids)))
    return tuple(out)


def _run_memory_mb(handle, pids: frozenset[int]) -> float | None:
    """GPU memory held by ``pids`` (a run's worker and its ranks) on one GPU; None when NVML cannot list
    processes (it cannot inside most containers without the host's pid namespace)."""
    if not pids:
        return None
    procs = _read(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if procs is None:
        return None
    used = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
    return sum(used) / 2**20 if used else 0.0


class ResourceSampler:
    """Samples a worker's process tree; keeps primed ``psutil.Process`` objects per worker pid.

    ``cpu_percent`` is measured between two calls, so the first sample of a process counts it as 0.0
    and later samples give its usage since the previous one. Thread-safe: sessions share one sampler.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trees: dict[int, dict[int, psutil.Process]] = {}  # worker pid -> {pid: primed process}

    def sample(self, pid: int | None, gpu_indices: list[int] | None = None) -> ResourceSample | None:
        """The usage of ``pid`` and its children now, or None when there is no such live process.

        ``gpu_indices``: the run's GPUs (None: every GPU, for a run that may use any)."""
        if pid is None or pid <= 0:
            return None
        with self._lock:
            try:
                cpu, rss = self._tree_usage(pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                self._trees.pop(pid, None)
                return None
            pids = frozenset(self._trees.get(pid, {}))
        return ResourceSample(cpu_percent=cpu, rss_mb=rss / 2**20, gpus=gpu_samples(gpu_indices, pids),
                              ts=time.time())

    def _tree_usage(self, pid: int) -> tuple[float, float]:
        """CPU percent and RSS bytes of ``pid`` plus its children (dataloader workers, launchers)."""
        known = self._trees.get(pid, {})
        root = known.get(pid)
        if root is None or not root.is_running():  # is_running also catches a reused pid
            root, known = psutil.Process(pid), {}
        if root.status() == psutil.STATUS_ZOMBIE:
            raise psutil.ZombieProcess(pid)
        tree = {pid: root}
        cpu, rss = 0.0, 0
        for proc in (root, *root.children(recursive=True)):
            proc = known.get(proc.pid, proc)
            try:
                usage = proc.cpu_percent(None)  # 0.0 the first time: that call primes it
                rss += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                if proc is root:
                    raise
                continue  # a child that ended between listing and reading
            cpu += usage
            tree[proc.pid] = proc
        self._trees[pid] = tree
        return cpu, float(rss)

    def forget(self, pid: int) -> None:
        """Drop the primed processes of a finished worker."""
        with self._lock:
            self._trees.pop(pid, None)
