"""Shared fixtures: an isolated data root and a throwaway SQLite store."""
from __future__ import annotations

import os
import signal

import psutil
import pytest
import streamlit as st

from sqlmodel import SQLModel

from db.store import Store
from tests.support import MODELS_CACHE, ROOT, FakeLauncher, build_tiny_model, fake
from trainer_core.host import hardware
from trainer_core.jobs.orchestrator import Orchestrator
from ui.state import get_orchestrator


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh data root under tmp_path, CPU forced, and user paths allowed anywhere under tmp_path."""
    root = tmp_path / "home"
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(root))
    monkeypatch.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path))
    monkeypatch.delenv("FINETUNE_STUDIO_MODELS", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    clear = hardware.cuda_available.cache_clear  # held here: a test may monkeypatch cuda_available itself
    clear()  # the answer is cached per process; recompute under FORCE_CPU
    yield root
    clear()


@pytest.fixture
def app_home(home):
    """``home`` plus fresh Streamlit caches: the orchestrator (st.cache_resource) and cached model facts and
    samples (st.cache_data) persist across AppTest instances in one process."""
    st.cache_resource.clear()
    st.cache_data.clear()
    yield home
    get_orchestrator().close()  # stop its pump thread before the data root disappears
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def fake_gpu_host(monkeypatch):
    """Pretend this host has two CUDA GPUs and the gpu extra's bitsandbytes (validation and scheduling only:
    nothing here touches a GPU)."""
    real = hardware.has_module
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_count", lambda: 2)
    monkeypatch.setattr(hardware, "has_module", lambda name: name == "bitsandbytes" or real(name))


@pytest.fixture(scope="session")
def tiny_model():
    """A 2-layer Llama with the bundled tokenizer (built once per checkout, in a subprocess)."""
    return build_tiny_model()


@pytest.fixture
def fake_launcher() -> FakeLauncher:
    """The real launcher starting tests/support/fake_worker.py (its behaviour set through FAKE_* variables)."""
    launcher = FakeLauncher()
    yield launcher
    launcher.kill_all()


@pytest.fixture
def fake_worker(monkeypatch) -> FakeLauncher:
    """The real launcher (environment, own session, worker.log) starting tests/support/fake_worker.py with scripted
    values (``fake()`` chooses its behaviour per start; this sets the defaults: 5 steps at once)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    fake(monkeypatch)
    launcher = FakeLauncher()
    yield launcher
    launcher.kill_all()


@pytest.fixture
def make_orch(home, store, fake_worker):
    """Orchestrators on one store and data root (several play a restarted or second server); all closed."""
    made: list[Orchestrator] = []

    def make() -> Orchestrator:
        orch = Orchestrator(store=store, launcher=fake_worker)
        made.append(orch)
        return orch

    yield make
    for orch in made:
        orch.close()


@pytest.fixture
def orch(make_orch) -> Orchestrator:
    return make_orch()


@pytest.fixture
def studio(tmp_path, monkeypatch):
    """A real orchestrator (real workers) on a fresh data root, sharing the converted-model cache."""
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    monkeypatch.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    hardware.cuda_available.cache_clear()
    orch = Orchestrator()
    yield orch
    active = orch.active_run_id()
    if active:
        orch.cancel(active)
        orch.wait(active, timeout=120)
    orch.close()


if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test workers on two cores: one OpenMP thread each (and so for the workers and children they start, which
    # inherit OMP_*). Two torch processes with two threads each stall whenever the other takes a core: a GRPO demo
    # step took 13-35 s instead of about 1 s.
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")


def worker_database(url: str | None) -> str | None:
    """``url`` for this test process: with pytest-xdist (``make test`` runs two workers) each worker gets a database of
    its own, since the store tests drop and create every table; created on first use (the CI role may create them)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not url or not worker:
        return url
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(url)
    name = f"{base.database}_{worker}"
    engine = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if not conn.execute(text("select 1 from pg_database where datname = :n"), {"n": name}).scalar():
                conn.execute(text(f'create database "{name}"'))
    finally:
        engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


POSTGRES_URL = worker_database(os.environ.get("FINETUNE_STUDIO_TEST_POSTGRES_URL"))  # .ci/run starts the server
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)] if POSTGRES_URL else ["sqlite"]

# What a test needs (markers registered in pyproject.toml); `slow` is their union, so `-m "not slow"` leaves out
# every test that trains, starts a transformers subprocess, drives Chromium, puts nginx in front, or needs
# PostgreSQL, a GPU or a local Ray cluster, and `-m "not browser"` only the Chromium ones.
NEEDS = ("train", "subprocess", "browser", "gateway", "postgres", "gpu", "ray")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection runs on the same hook
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(name) for name in NEEDS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        # pytest-xdist (``--dist loadgroup``): a file's tests stay on one worker, so its module fixtures (a trained
        # run, a served model) are made once; every test that starts a local Ray cluster shares one worker, so two
        # clusters never start at once on this machine.
        item.add_marker(pytest.mark.xdist_group("ray" if item.get_closest_marker("ray") else item.nodeid.split("::")[0]))
    items[:] = heavy_first(items)


HEAVY = ("train", "ray")  # the groups that take minutes: a real training, a local Ray cluster


def heavy_first(items: list) -> list:
    """The files (xdist groups) holding a real training or a Ray cluster first, then the other slow ones, then the
    rest, each kept in collection order: the two workers start the longest groups early and the many short tests fill
    the end, instead of one worker finishing a long training alone at the end (the tool-calling demo, collected
    last, ran 4 minutes alone at the end of a CI run)."""
    def group(item) -> str:
        return item.get_closest_marker("xdist_group").args[0]

    rank: dict[str, int] = {}
    for item in items:
        weight = 0 if any(item.get_closest_marker(m) for m in HEAVY) else 1 if item.get_closest_marker("slow") else 2
        rank[group(item)] = min(rank.get(group(item), weight), weight)
    first_seen = {name: i for i, name in reversed(list(enumerate(group(item) for item in items)))}
    order = {id(item): i for i, item in enumerate(items)}
    return sorted(items, key=lambda item: (rank[group(item)], first_seen[group(item)], order[id(item)]))


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    """A Store on its own SQLite file, and the same tests on PostgreSQL when a server is configured."""
    if request.param == "sqlite":
        s = Store(f"sqlite:///{tmp_path}/t.db")
    else:
        s = Store(POSTGRES_URL)
        SQLModel.metadata.drop_all(s.engine)  # a clean schema per test
        SQLModel.metadata.create_all(s.engine)
    yield s
    s.engine.dispose()


@pytest.fixture(scope="session", autouse=True)
def no_stray_workers(tmp_path_factory):
    """Workers run in their own session on purpose (they outlive the server), so a test that fails
    before cancelling its run would leave one behind: kill any test worker still alive at the end."""
    yield
    tmp = str(tmp_path_factory.getbasetemp())
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        is_worker = "trainer_core.worker" in cmd or "trainer_core.worker.launch" in cmd  # launch: torchrun for N ranks
        is_worker |= any(arg.endswith(("fake_worker.py", "fake_jobs.py")) for arg in cmd)  # the tests' stand-ins
        if is_worker and any(arg.startswith(tmp) for arg in cmd):
            try:
                os.killpg(proc.info["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
