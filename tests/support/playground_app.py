"""``python -m tests.support.playground_app [streamlit options]``: the dashboard (``ui.serve``) with its serve jobs
played by ``FakeServeJob``, for the Chromium Playground test. The fake OpenAI server runs in the test
process; this process learns where from the environment:

* ``FAKE_OPENAI_URL``, ``FAKE_OPENAI_KEY``: its base URL and API key;
* ``FAKE_OPENAI_SERVED``: JSON, model source key -> served model name.

The Orchestrator class is patched before the server builds its orchestrator, so every page run (and the
page's ``start_server``/``endpoint`` calls) sees the fake job; everything else is the real dashboard."""
from __future__ import annotations

import json
import os
import sys

from tests.support.fake_openai import FakeServeJob
from ui import serve

if __name__ == "__main__":
    job = FakeServeJob(os.environ["FAKE_OPENAI_URL"], os.environ["FAKE_OPENAI_KEY"],
                       json.loads(os.environ["FAKE_OPENAI_SERVED"]))
    job.install(setattr)
    serve.main(sys.argv[1:])
