"""``python -m ui.serve [streamlit run options]``: ``streamlit run streamlit_app.py`` with the orchestrator
built when the server starts.

Streamlit's server runs no project code until a browser opens a page, so after a restart the pump and the
queue would wait for the first visitor (and, with the gate on, for the first one who signs in). Building the
cached orchestrator here, in the server's own process before it starts, adopts runs left active and moves the
queue at once; page runs get the same object (``st.cache_resource`` is per process, keyed by the function).
"""
from __future__ import annotations

import sys
from pathlib import Path

from streamlit.web import cli as streamlit_cli

from ui.state import orchestrator_or_problem

APP = Path(__file__).resolve().parents[1] / "streamlit_app.py"


def main(argv: list[str]) -> None:
    _, problem = orchestrator_or_problem()
    if problem:  # the pages say the same and offer the rebuild; the server starts anyway
        print(f"finetune-studio: {problem}", file=sys.stderr, flush=True)
    sys.argv = ["streamlit", "run", str(APP), *argv]
    streamlit_cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
