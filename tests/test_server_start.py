"""The orchestrator is built when the server starts (``python -m ui.serve``), not by the first page request:
after a restart, runs are adopted and the queue moves before anybody opens (or signs in to) a page."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from db.entities import RunRecord
from db.store import Store
from tests.support.browser import free_port
from tests.support import ROOT
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus


def test_server_start_adopts_runs_before_any_request(home, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    store = Store()
    run_id = "20261201-000000-5a17ed"
    paths.run_dir(run_id).mkdir(parents=True)
    store.create_run(RunRecord(id=run_id, name="left running", status=RunStatus.RUNNING.value, created_at=time.time(),
                         started_at=time.time(), output_dir=str(paths.run_dir(run_id)), pid=gone.pid,
                         pid_started_at=started, total_steps=10))
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "ui.serve", "--server.port", str(free_port()),
                               "--server.headless", "true", "--server.address", "127.0.0.1"],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # no HTTP request is ever made: only the server start can do this
        while RunStatus(store.get_run(run_id).status) is RunStatus.RUNNING:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(0.2)
        run = store.get_run(run_id)
        assert run.status == RunStatus.FAILED.value
        assert run.error.startswith("The worker process disappeared")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
        store.engine.dispose()
