"""Searching passages with embedding models (the Playground's "did it learn my jargon" view, issue 21), dashboard
side: which passages (a run's own, or pasted ones), and the search itself in a child process
(``python -m trainer_core.worker.search_child``), as the data preview runs: the dashboard never imports torch.

Each model (a base, a run's final model or a checkpoint) embeds the query and every passage with the run's query
and document prompts, and the passages come back ranked by the model's own similarity, with their scores."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from trainer_core.auth import access
from trainer_core.specs import model_source
from trainer_core.data import DatasetError, loading
from trainer_core.protocol import files, sandbox

ROOT = Path(__file__).resolve().parents[2]
PASSAGES_MAX = 2_000  # passages one search embeds (each model embeds them all)
TEXT_MAX = 4_000  # characters of a passage or the query
TOP_K = 5
SEARCH_TIMEOUT_S = 300.0

_BUSY = threading.Lock()


class SearchError(ValueError):
    """Why the search could not run; the message names the fix."""


@dataclass(frozen=True)
class Hit:
    index: int  # into the passages
    score: float


@dataclass(frozen=True)
class Ranking:
    label: str
    hits: tuple[Hit, ...] = ()
    error: str = ""
    similarity: str = ""


@dataclass(frozen=True)
class Request:
    sources: tuple[model_source.ModelSource, ...]
    query: str
    passages: tuple[str, ...]
    top_k: int = TOP_K
    query_prompt: str = ""
    document_prompt: str = ""
    max_seq_length: int = 0
    labels: tuple[str, ...] = field(default=())


def run_passages(run_id: str) -> list[str]:
    """An embedding run's own passages: the corpus its evaluator searched (its retrieval files, or its pairs'
    passages), else every positive and negative of its training rows; distinct, in order."""
    from trainer_core.evaluation import retrieval

    try:
        texts = list(retrieval.read_run_split(run_id).corpus.values())
    except DatasetError:
        cfg = model_source.run_config(run_id)
        try:
            rows = loading.load_for_training(cfg).rows
        except DatasetError as exc:
            raise SearchError(f"the run's data cannot be read ({exc.message}): paste passages instead") from None
        texts = [row[k] for row in rows for k in ("positive", "negative", "sentence2", "sentence")
                 if isinstance(row.get(k), str)]
    return list(dict.fromkeys(t for t in texts if t.strip()))


def pasted_passages(text: str) -> list[str]:
    """Passages pasted one per line (blank lines skipped)."""
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip()))


def problems(request: Request) -> list[str]:
    found = []
    if not request.query.strip():
        found.append("query: type what to search for")
    elif len(request.query) > TEXT_MAX or "\x00" in request.query:
        found.append(f"query: at most {TEXT_MAX:,} characters, no NUL")
    if not request.passages:
        found.append("passages: none to search (the run's data has none: paste some, one per line)")
    elif len(request.passages) > PASSAGES_MAX:
        found.append(f"passages: {len(request.passages):,} is more than the {PASSAGES_MAX:,} one search embeds: "
                     "paste fewer")
    elif any(len(p) > TEXT_MAX or "\x00" in p for p in request.passages):
        found.append(f"passages: each at most {TEXT_MAX:,} characters, no NUL")
    if not request.sources:
        found.append("models: pick at least one")
    return found


def _env() -> dict[str, str]:
    """The child's environment: no secret, and on the CPU with no GPU visible: a GPU is a device the queue reserves
    for jobs, which the Playground's search is not (as Speak's child)."""
    return {**access.child_env(os.environ), "TOKENIZERS_PARALLELISM": "false", "FINETUNE_STUDIO_FORCE_CPU": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def search(request: Request, timeout_s: float = SEARCH_TIMEOUT_S) -> list[Ranking]:
    """Each source's top passages for the query (SearchError when the child cannot run at all)."""
    wrong = problems(request)
    if wrong:
        raise SearchError("; ".join(wrong))
    if not _BUSY.acquire(blocking=False):  # one search child per server: each loads every model it compares
        raise SearchError("another search is running on this server: try again when it ends")
    try:
        return _search(request, timeout_s)
    finally:
        _BUSY.release()


def _search(request: Request, timeout_s: float) -> list[Ranking]:
    env = _env()
    body = json.dumps({"sources": [s.key for s in request.sources], "labels": list(request.labels),
                       "query": request.query, "passages": list(request.passages), "top_k": request.top_k,
                       "query_prompt": request.query_prompt, "document_prompt": request.document_prompt,
                       "max_seq_length": request.max_seq_length})
    try:
        command = sandbox.child_command([sys.executable, "-m", "trainer_core.worker.search_child"], json.loads(body), env)
        done = subprocess.run(command, input=body, text=True, capture_output=True, env=env, timeout=timeout_s,
                              check=False, cwd=os.getcwd())
    except sandbox.SandboxError as exc:
        raise SearchError(str(exc)) from None
    except subprocess.TimeoutExpired:
        raise SearchError(f"the search took longer than {timeout_s:.0f} s: search fewer passages") from None
    reply = files.last_json_line(done.stdout)
    if not isinstance(reply, dict) or not isinstance(reply.get("rankings"), list):
        raise SearchError(f"the search process failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return [Ranking(label=str(r.get("label", "")), error=str(r.get("error", "")),
                    similarity=str(r.get("similarity", "")),
                    hits=tuple(Hit(int(h["index"]), float(h["score"])) for h in r.get("hits", [])
                               if 0 <= int(h["index"]) < len(request.passages)))
            for r in reply["rankings"]]
