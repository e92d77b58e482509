"""Preview a run's data before launch, for the selected model's tokenizer.

``build_preview(cfg)`` runs ``python -m trainer_core.worker.preview_child`` in a subprocess (the dashboard never
imports transformers): the child loads the tokenizer and the rows the way the worker does
(``token_cache.load_tokenizer``, ``data.loading.load_for_training``), tokenizes them through the same
``token_cache.tokenize`` the engine uses (so it also warms the tokenized-data cache for the run), and
applies TRL's labels, truncation, dropping and packing rules to count what the trainer will see.
The config goes to the child on stdin without secrets; the HF token through its environment.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_core.auth import access
from trainer_core.data.bounded_cache import BoundedCache
from trainer_core.config import BUNDLED_MODEL, FieldError, TrainConfig, looks_like_path
from trainer_core.data import DatasetError
from trainer_core.data.sources import resolve_source
from trainer_core.methods import METHODS
from trainer_core.protocol import files, sandbox

ROOT = Path(__file__).resolve().parents[2]
# Fields that change what the preview shows; others (learning rate, logging...) do not re-run it. The
# processes (num_processes, gpu_ids) set the global batch and so the steps per epoch.
PREVIEW_FIELDS = (
    "model_name", "trust_remote_code", "method", "max_seq_length", "hf_dataset", "local_datasets",
    "local_eval_datasets", "format_type", "subset", "train_split", "eval_split", "eval_fraction",
    "dataset_slice_start", "dataset_slice_end", "custom_format_mapping", "system_prompt", "random_seed",
    "packing", "batch_size", "gradient_accumulation_steps", "num_processes", "gpu_ids", "image_max_side",
    "tool_template", "train_on_tool_results",
) + tuple(dict.fromkeys(name for spec in METHODS.values() for name in spec.preview_fields))  # each method's hook
TRUNCATION_DROP = "no trained tokens left after truncation (the prompt fills max_seq_length)"
_CACHE_SIZE = 8


@dataclass(frozen=True)
class RenderedRow:
    index: int  # position among the training rows
    text: str  # what the model sees, special tokens included, after truncation
    segments: tuple[tuple[str, bool], ...]  # (text, trained?) pieces that join to ``text``
    num_tokens: int  # before truncation
    truncated: bool
    label: str = ""  # what the row is when it is not a plain training row ("chosen", "rejected", "prompt")


@dataclass(frozen=True)
class Preview:
    format: str
    format_reason: str
    tokenizer: str
    rows: tuple[RenderedRow, ...]
    lengths: tuple[int, ...]  # token length of every training row, before truncation
    max_seq_length: int
    truncated: int
    dropped: dict[str, int]  # reason -> rows; normalisation, completion split and truncation together
    total_rows: int  # training examples the trainer will see (after drops; packed sequences when packing)
    total_tokens: int  # tokens per epoch after truncation
    trained_tokens: int  # of which count towards the loss
    steps_per_epoch: int
    eval_rows: int
    processes: int = 1  # data-parallel processes the launcher will start
    global_batch: int = 0  # rows per optimizer update: batch_size x gradient_accumulation_steps x processes
    tool_template: str = ""  # the chat template rows with tools train with ("" when no row has tools)
    tool_problems: tuple[str, ...] = ()  # "row N: ..." for calls to unknown tools, arguments off their schema


class PreviewError(ValueError):
    """Every problem that stopped the preview, each naming the field that fixes it."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


# ---------------------------------------------------------------------- dashboard side
_cache: BoundedCache[str, Preview] = BoundedCache(_CACHE_SIZE)


def build_preview(cfg: TrainConfig, rows_shown: int = 5, timeout_s: float = 180) -> Preview:
    """The preview for ``cfg``, computed in a subprocess and cached per settings and data file stamps."""
    data = cfg.to_dict()  # a method's settings by its section's name (stt, embedding...), as config.yaml has them
    key = json.dumps([{name: data.get(name) for name in PREVIEW_FIELDS}, _stamps(cfg), rows_shown],
                     sort_keys=True, default=str)
    preview = _cache.get(key)
    if preview is None:
        preview = _run_child(cfg, rows_shown, timeout_s)
        _cache.put(key, preview)
    return preview


def _stamps(cfg: TrainConfig) -> list:
    """(path, mtime, size) of the data files and tokenizer files, so an edited file re-runs the preview."""
    files: list[Path] = []
    for source in list(cfg.local_datasets) + list(cfg.local_eval_datasets):
        try:
            path = resolve_source(source)
            files += sorted(path.iterdir()) if path.is_dir() else [path]
        except DatasetError:
            continue  # the child reports it
    name = cfg.model_name.strip()
    if name != BUNDLED_MODEL and looks_like_path(name):
        folder = Path(name).expanduser()
        files += [folder / f for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")]
    stamps = []
    for file in files:
        try:
            stat = file.stat()
            stamps.append((str(file), stat.st_mtime_ns, stat.st_size))
        except OSError:
            stamps.append((str(file), 0, 0))
    return stamps


def _run_child(cfg: TrainConfig, rows_shown: int, timeout_s: float) -> Preview:
    env = {**access.child_env(os.environ), "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false"}
    if cfg.hf_token:
        env["HF_TOKEN"] = cfg.hf_token  # secrets travel by environment only, never on stdin or argv
    request = json.dumps({"config": cfg.to_public_dict(), "rows_shown": rows_shown})
    try:
        command = sandbox.child_command([sys.executable, "-m", "trainer_core.worker.preview_child"], json.loads(request),
                                        env)
        done = subprocess.run(command, check=False, input=request, capture_output=True, text=True, env=env,
                              timeout=timeout_s, cwd=os.getcwd())
    except sandbox.SandboxError as exc:
        raise PreviewError([FieldError("preview", str(exc))]) from None
    except subprocess.TimeoutExpired:
        raise PreviewError([FieldError("preview", f"took longer than {timeout_s:.0f} s (a large dataset or a slow "
                                                  "hub download); try a row slice, or start the run directly")]) from None
    reply = files.last_json_line(done.stdout)
    if not isinstance(reply, dict):
        tail = _redact(done.stderr.strip()[-1500:], cfg)
        raise PreviewError([FieldError("preview", f"the preview process failed (exit {done.returncode}): {tail}")])
    if "errors" in reply:
        raise PreviewError([FieldError(e["field"], _redact(e["message"], cfg)) for e in reply["errors"]])
    return _from_json(reply)


def _redact(text: str, cfg: TrainConfig) -> str:
    return text.replace(cfg.hf_token, "***") if cfg.hf_token else text


def _from_json(data: dict[str, Any]) -> Preview:
    rows = tuple(RenderedRow(index=r["index"], text=r["text"], segments=tuple((t, bool(b)) for t, b in r["segments"]),
                             num_tokens=r["num_tokens"], truncated=r["truncated"], label=r.get("label", ""))
                 for r in data["rows"])
    return Preview(**{**data, "rows": rows, "lengths": tuple(data["lengths"]),
                      "tool_problems": tuple(data.get("tool_problems", ()))})
