"""Control requests travel to the worker through a file in its run folder, so they survive a
dashboard restart (DESIGN rule 4). Signals keep documented meanings on top of that:

* ``control.json`` ``{"action": "stop"}``   — stop at the next step, save a checkpoint and the adapter.
* ``control.json`` ``{"action": "cancel"}`` — stop at the next step, save nothing, remove partial checkpoints.
* SIGTERM to the worker's process group    — same as cancel (the worker installs a handler).
* SIGKILL                                  — force-terminate; used by the watchdog only.
"""
from __future__ import annotations

import json
import os
import time
from enum import Enum
from pathlib import Path

CONTROL_FILE = "control.json"


class Action(str, Enum):
    STOP = "stop"
    CANCEL = "cancel"


def request(run_dir: Path, action: Action) -> None:
    """Write the request atomically; cancel wins over an earlier stop, never the other way round."""
    current = read(run_dir)
    if current is Action.CANCEL:
        return
    tmp = Path(run_dir) / f".{CONTROL_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"action": action.value, "ts": time.time()}))
    os.replace(tmp, Path(run_dir) / CONTROL_FILE)


def read(run_dir: Path) -> Action | None:
    try:
        # Read once per training step: os.path and open() directly (pathlib's parsing cost more than the read).
        with open(os.path.join(run_dir, CONTROL_FILE), "rb") as fh:
            data = json.loads(fh.read())
        return Action(data["action"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def requested_at(run_dir: Path) -> float | None:
    """When the pending request was written (the watchdog's clock survives a dashboard restart)."""
    try:
        return float(json.loads((Path(run_dir) / CONTROL_FILE).read_text())["ts"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
