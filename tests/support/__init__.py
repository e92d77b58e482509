"""What the tests and the benchmarks (bench/) share, and nothing else imports: a benchmark imports this package,
never a test module.

- ``env``: the checkout's root and caches, a child interpreter (``run_python``, ``run_in_child``), ``wait_until``
- ``models``: the tiny text models, built once per checkout under a file lock (``build_tiny_model``)
- ``fakes``: ``FakeLauncher`` and ``fake()``, the real launcher starting ``fake_worker.py`` (a worker that trains
  nothing; run by path) so the real orchestrator runs without the ML stack
- ``factories``: runs made without training (a row, a run folder, a finished run with metrics, an orphan)
- ``apptest``: the pages through AppTest (``open_page``, ``texts``, ``click``) and New run's recording ``fakes``
- ``data_rows``: JSONL files and invented data (``jargon``)
- ``speech``, ``vision``, ``export``: tiny models and data of a kind; a LoRA run ready to export
- ``fake_openai``: an OpenAI-compatible chat server in a thread; ``playground_app`` serves the dashboard with it
- ``browser``: the dashboard under ``streamlit run`` in headless Chromium; ``ray_cluster``: a local Ray cluster

Every module keeps the ML stack inside functions or child processes: the test process plays the dashboard.
The names below are the ones most tests use, re-exported."""
from __future__ import annotations

from tests.support.env import MODELS_CACHE, ROOT, TINY_MODEL, run_in_child, run_python, wait_until
from tests.support.factories import orphan_run
from tests.support.fakes import FAKE_OPTIONS, FAKE_WORKER, FakeLauncher, fake, wait_for_step
from tests.support.models import build_tiny_model, built_once, bundled_model_folder, cache_lock

__all__ = ["FAKE_OPTIONS", "FAKE_WORKER", "MODELS_CACHE", "ROOT", "TINY_MODEL", "FakeLauncher", "build_tiny_model",
           "built_once", "bundled_model_folder", "cache_lock", "fake", "orphan_run", "run_in_child", "run_python",
           "wait_for_step", "wait_until"]
