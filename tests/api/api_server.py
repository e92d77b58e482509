"""A real API server process for the tests, over tests/fake_worker.py (the real launcher starting the fake):
``python tests/api/api_server.py PORT``. The FAKE_* variables of its environment choose the fake's behaviour."""
from __future__ import annotations

import sys

import uvicorn

from gateway.api import create_app
from tests.support import FakeLauncher
from trainer_core.jobs.orchestrator import Orchestrator

if __name__ == "__main__":
    app = create_app(lambda: Orchestrator(launcher=FakeLauncher()))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
