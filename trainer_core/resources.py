"""CPU, RAM and GPU usage of a worker process, for the live view (psutil, and NVML when present; no torch).

NVML comes from the optional ``nvidia-ml-py`` package (``pip install nvidia-ml-py``, imported as
``pynvml``). Without it, or without a driver, samples simply carry no GPUs.
"""
from __future__ import annotations

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
    index: int
    name: str
    utilization_pct: float
    memory_used_mb: float
    memory_total_mb: float


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


def gpu_samples() -> tuple[GpuSample, ...]:
    """Utilisation and memory of every GPU NVML sees (empty without NVML)."""
    if not _nvml_ready():
        return ()
    out = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(GpuSample(index, name.decode() if isinstance(name, bytes) else str(name), float(util.gpu),
                                 memory.used / 2**20, memory.total / 2**20))
    except pynvml.NVMLError:  # a GPU fell off the bus mid-sample: report what we have
        pass
    return tuple(out)


class ResourceSampler:
    """Samples a worker's process tree; keeps primed ``psutil.Process`` objects per worker pid.

    ``cpu_percent`` is measured between two calls, so the first sample of a process counts it as 0.0
    and later samples give its usage since the previous one. Thread-safe: sessions share one sampler.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trees: dict[int, dict[int, psutil.Process]] = {}  # worker pid -> {pid: primed process}

    def sample(self, pid: int | None) -> ResourceSample | None:
        """The usage of ``pid`` and its children now, or None when there is no such live process."""
        if pid is None or pid <= 0:
            return None
        with self._lock:
            try:
                cpu, rss = self._tree_usage(pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                self._trees.pop(pid, None)
                return None
        return ResourceSample(cpu_percent=cpu, rss_mb=rss / 2**20, gpus=gpu_samples(), ts=time.time())

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
