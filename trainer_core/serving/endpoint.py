"""``endpoint.json``: where a running serve job listens and which models it serves (never its key).

The serve worker writes it once its server listens and removes it when the server ends; the dashboard
and the CLI read it (``Orchestrator.endpoint``) only while the job runs. Nothing here imports the ML stack.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from trainer_core.protocol import files

ENDPOINT_FILE = "endpoint.json"
MAX_BYTES = 64 << 10
# Set by trainer_core/worker/ray_entry.py for a serve job on the Ray cluster: the node's address as Ray knows it
# (where the server listens, and what the dashboard host reaches) and its Ray node id.
NODE_ADDRESS_ENV, NODE_ID_ENV = "FINETUNE_STUDIO_RAY_NODE_ADDRESS", "FINETUNE_STUDIO_RAY_NODE_ID"


@dataclass(frozen=True)
class ServedModel:
    name: str  # what a client puts in "model"
    label: str  # what the dashboard shows ("my-run · step 40")
    source_key: str  # model_source.ModelSource.key: base:<model>, run:<id>, run:<id>@<step>


@dataclass(frozen=True)
class Endpoint:
    url: str  # the OpenAI base URL, http://HOST:PORT/v1
    models: tuple[ServedModel, ...]
    engine: str
    pid: int
    share_url: str = ""  # what teammates use: the machine's name when bound to every interface, else ``url``
    node: str = ""  # on the Ray cluster: the node it runs on, "10.0.0.2 (node id's first 12)"; "" on this host

    def name_of(self, source_key: str) -> str | None:
        """The served name of a model source, None when this server does not serve it."""
        return next((m.name for m in self.models if m.source_key == source_key), None)


def write(run_dir: Path, url: str, models: list[dict], engine: str, pid: int, share_url: str = "",
          node: str = "") -> None:
    tmp = Path(run_dir) / f".{ENDPOINT_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"url": url, "models": models, "engine": engine, "pid": pid,
                               "share_url": share_url or url, "node": node}, indent=1))
    os.replace(tmp, Path(run_dir) / ENDPOINT_FILE)


def remove(run_dir: Path) -> None:
    try:
        (Path(run_dir) / ENDPOINT_FILE).unlink()
    except FileNotFoundError:
        pass


def read(run_dir: Path) -> Endpoint | None:
    """The endpoint of the job in ``run_dir``; None when there is none, or the file is not one of ours."""
    path = Path(run_dir) / ENDPOINT_FILE
    try:
        text = files.read_regular(path, MAX_BYTES + 1)  # a node writes it for a Ray job: a pipe there is refused
        if len(text) > MAX_BYTES:
            return None
        data = json.loads(text)
        models = tuple(ServedModel(str(m["name"]), str(m["label"]), str(m["source_key"])) for m in data["models"])
        return Endpoint(url=str(data["url"]), models=models, engine=str(data["engine"]), pid=int(data["pid"]),
                        share_url=str(data.get("share_url") or data["url"]), node=str(data.get("node") or ""))
    except (OSError, ValueError, KeyError, TypeError):
        return None
