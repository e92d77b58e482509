"""Resource sampling: the process tree via psutil, GPUs via NVML only when it is there."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from trainer_core.jobs import queue as scheduling, resources
from trainer_core.jobs.resources import GpuSample, ResourceSample, ResourceSampler

HOLD_MB = 80


def test_sampling_this_process_reads_memory_and_cpu():
    sampler = ResourceSampler()
    first = sampler.sample(os.getpid())
    assert first is not None and first.rss_mb > 0 and first.cpu_percent == 0.0  # the first call primes
    start = time.process_time()
    while time.process_time() - start < 0.05:  # burn some CPU so the next sample has something to see
        sum(range(1000))
    second = sampler.sample(os.getpid())
    assert second.cpu_percent > 0
    assert second.ts >= first.ts


def test_children_are_counted():
    holder = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              f"'b = b\"x\" * ({HOLD_MB} * 2**20); import time; time.sleep(120)']); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", holder])
    try:
        proc = psutil.Process(parent.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until the child holds its memory
            kids = proc.children()
            if kids and kids[0].memory_info().rss >= HOLD_MB * 2**20:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the child never allocated its memory")
        sample = ResourceSampler().sample(parent.pid)
        assert sample is not None
        assert sample.rss_mb >= HOLD_MB + psutil.Process(parent.pid).memory_info().rss / 2**20 - 1
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_dead_or_missing_pid_gives_none():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    sampler = ResourceSampler()
    assert sampler.sample(proc.pid) is None
    assert sampler.sample(None) is None
    assert sampler.sample(0) is None and sampler.sample(-5) is None


def test_a_process_that_ends_between_samples_gives_none():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sampler = ResourceSampler()
    assert sampler.sample(proc.pid) is not None
    proc.kill()
    proc.wait()
    assert sampler.sample(proc.pid) is None


def test_without_pynvml_there_are_no_gpus(monkeypatch):
    monkeypatch.setattr(resources, "pynvml", None)
    assert resources.gpu_samples() == ()
    assert ResourceSampler().sample(os.getpid()).gpus == ()


class FakeNvmlError(Exception):
    pass


def fake_nvml(init_fails: bool = False) -> SimpleNamespace:
    def init():
        if init_fails:
            raise FakeNvmlError("Driver Not Loaded")

    return SimpleNamespace(
        NVMLError=FakeNvmlError, nvmlInit=init, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: [b"NVIDIA H100", "NVIDIA L4"][h],
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=[87, 0][h]),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=[40 * 2**30, 512 * 2**20][h],
                                                          total=[80 * 2**30, 24 * 2**30][h]),
    )


def test_gpus_come_from_nvml(monkeypatch):
    monkeypatch.setattr(resources, "pynvml", fake_nvml())
    resources._nvml_init.cache_clear()
    try:
        assert resources.gpu_samples() == (GpuSample(0, "NVIDIA H100", 87.0, 40 * 1024.0, 80 * 1024.0),
                                           GpuSample(1, "NVIDIA L4", 0.0, 512.0, 24 * 1024.0))
    finally:
        resources._nvml_init.cache_clear()


def test_one_unsupported_reading_hides_only_that_number(monkeypatch):
    """A MIG slice (or a virtual GPU) has no utilisation reading; its memory and the other GPU still show."""
    nvml = fake_nvml()

    def utilization(handle):
        if handle == 1:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(gpu=87)

    nvml.nvmlDeviceGetUtilizationRates = utilization
    monkeypatch.setattr(resources, "pynvml", nvml)
    resources._nvml_init.cache_clear()
    try:
        assert resources.gpu_samples() == (GpuSample(0, "NVIDIA H100", 87.0, 40 * 1024.0, 80 * 1024.0),
                                           GpuSample(1, "NVIDIA L4", None, 512.0, 24 * 1024.0))
    finally:
        resources._nvml_init.cache_clear()


def test_only_the_runs_gpus_with_the_memory_its_processes_hold(monkeypatch):
    nvml = fake_nvml()
    me = os.getpid()
    procs = {0: [SimpleNamespace(pid=me, usedGpuMemory=3 * 2**30), SimpleNamespace(pid=1, usedGpuMemory=2**30)],
             1: [SimpleNamespace(pid=me, usedGpuMemory=2**29)]}
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda handle: procs[handle]
    monkeypatch.setattr(resources, "pynvml", nvml)
    resources._nvml_init.cache_clear()
    try:
        sample = ResourceSampler().sample(me, gpu_indices=[1])
        # GPU 0 belongs to another run: not shown; on GPU 1 this process tree holds 512 MB of the 512 MB used
        assert sample.gpus == (GpuSample(1, "NVIDIA L4", 0.0, 512.0, 24 * 1024.0, run_memory_mb=512.0),)
        assert [g.run_memory_mb for g in ResourceSampler().sample(me).gpus] == [3 * 1024.0, 512.0]
        assert scheduling.gpu_indices("gpu0,gpu2") == [0, 2]
        assert scheduling.gpu_indices("gpu*") is None and scheduling.gpu_indices("cpu") is None
    finally:
        resources._nvml_init.cache_clear()


def test_nvml_without_a_driver_means_no_gpus(monkeypatch):
    monkeypatch.setattr(resources, "pynvml", fake_nvml(init_fails=True))
    resources._nvml_init.cache_clear()
    try:
        assert resources.gpu_samples() == ()
    finally:
        resources._nvml_init.cache_clear()


# ---------------------------------------------------------------------- rendering (ui.views)
def _render_resources(sample):
    from ui.views import render_resources

    render_resources(sample)


def tiles(sample) -> dict[str, str]:
    at = AppTest.from_function(_render_resources, args=(sample,), default_timeout=30).run()
    assert not at.exception, at.exception
    return {m.label: m.value for m in at.metric} or {"caption": at.caption[0].value}


def test_render_resources_with_and_without_gpus():
    cpu_only = ResourceSample(cpu_percent=153.4, rss_mb=2048.0, gpus=(), ts=0.0)
    assert tiles(cpu_only) == {"Worker CPU": "153%", "Worker RAM": "2.00 GB", "GPU": "no GPU"}
    gpu = GpuSample(0, "NVIDIA H100", 87.0, 40 * 1024.0, 80 * 1024.0)
    with_gpu = ResourceSample(cpu_percent=99.6, rss_mb=512.0, gpus=(gpu,), ts=0.0)
    assert tiles(with_gpu) == {"Worker CPU": "100%", "Worker RAM": "512 MB", "GPU 0 util": "87%",
                               "GPU 0 memory": "40.00 GB / 80.00 GB"}
    assert tiles(None) == {"caption": "Resource usage: the worker process is not running."}
    mig = GpuSample(3, "NVIDIA A100 MIG 1g.10gb", None, 2048.0, 10 * 1024.0, run_memory_mb=1536.0)
    at = AppTest.from_function(_render_resources, args=(ResourceSample(1.0, 1.0, (mig,), 0.0),),
                               default_timeout=30).run()
    assert {m.label: m.value for m in at.metric}["GPU 3 util"] == "n/a"
    assert [m.proto.delta for m in at.metric if m.label == "GPU 3 memory"] == ["this run: 1.50 GB"]
