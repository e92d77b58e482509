"""A real API server process for the tests, over fake jobs (the real launcher starting tests/api/fake_jobs.py: the
fake training worker, and a fake chat server for serve jobs): ``python tests/api/api_server.py PORT``. The FAKE_*
variables of its environment choose the fake's behaviour."""
from __future__ import annotations

import sys
from pathlib import Path

import uvicorn

from gateway.api import create_app
from tests.support import FakeLauncher
from trainer_core.jobs.orchestrator import Orchestrator

if __name__ == "__main__":
    app = create_app(lambda: Orchestrator(launcher=FakeLauncher(Path(__file__).with_name("fake_jobs.py"))))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
