"""Preview a run's data before launch, for the selected model's tokenizer.

``build_preview(cfg)`` runs ``python -m trainer_core.preview`` in a subprocess (the dashboard never
imports transformers): the child loads the tokenizer and the rows the way the worker does
(``token_cache.load_tokenizer``, ``datasets.load_for_training``), tokenizes them through the same
``token_cache.tokenize`` the engine uses (so it also warms the tokenized-data cache for the run), and
applies TRL's labels, truncation, dropping and packing rules to count what the trainer will see.
The config goes to the child on stdin without secrets; the HF token through its environment.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import traceback
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainer_core import access, datasets, parallel
from trainer_core.protocol import paths
from trainer_core.config import BUNDLED_MODEL, ConfigError, FieldError, TrainConfig, looks_like_path

ROOT = Path(__file__).resolve().parents[1]
# Fields that change what the preview shows; others (learning rate, logging...) do not re-run it.
PREVIEW_FIELDS = (
    "model_name", "trust_remote_code", "training_type", "max_seq_length", "hf_dataset", "local_datasets",
    "local_eval_datasets", "format_type", "subset", "train_split", "eval_split", "eval_fraction",
    "dataset_slice_start", "dataset_slice_end", "custom_format_mapping", "system_prompt", "random_seed",
    "packing", "train_on_completions", "batch_size", "gradient_accumulation_steps",
)
TRUNCATION_DROP = "no trained tokens left after truncation (the prompt fills max_seq_length)"
_CACHE_SIZE = 8


@dataclass(frozen=True)
class RenderedRow:
    index: int  # position among the training rows
    text: str  # what the model sees, special tokens included, after truncation
    segments: tuple[tuple[str, bool], ...]  # (text, trained?) pieces that join to ``text``
    num_tokens: int  # before truncation
    truncated: bool


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


class PreviewError(ValueError):
    """Every problem that stopped the preview, each naming the field that fixes it."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


# ---------------------------------------------------------------------- dashboard side
_cache: OrderedDict[str, Preview] = OrderedDict()
_lock = threading.Lock()


def build_preview(cfg: TrainConfig, rows_shown: int = 5, timeout_s: float = 180) -> Preview:
    """The preview for ``cfg``, computed in a subprocess and cached per settings and data file stamps."""
    key = json.dumps([{name: getattr(cfg, name) for name in PREVIEW_FIELDS}, _stamps(cfg), rows_shown],
                     sort_keys=True, default=str)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    preview = _run_child(cfg, rows_shown, timeout_s)
    with _lock:
        _cache[key] = preview
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return preview


def _stamps(cfg: TrainConfig) -> list:
    """(path, mtime, size) of the data files and tokenizer files, so an edited file re-runs the preview."""
    files: list[Path] = []
    for source in list(cfg.local_datasets) + list(cfg.local_eval_datasets):
        try:
            path = datasets.resolve_source(source)
            files += sorted(path.iterdir()) if path.is_dir() else [path]
        except datasets.DatasetError:
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
        done = subprocess.run([sys.executable, "-m", "trainer_core.preview"], check=False, input=request, capture_output=True,
                              text=True, env=env, timeout=timeout_s, cwd=os.getcwd())
    except subprocess.TimeoutExpired:
        raise PreviewError([FieldError("preview", f"took longer than {timeout_s:.0f} s (a large dataset or a slow "
                                                  "hub download); try a row slice, or start the run directly")]) from None
    lines = done.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        reply = None
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
                             num_tokens=r["num_tokens"], truncated=r["truncated"]) for r in data["rows"])
    return Preview(**{**data, "rows": rows, "lengths": tuple(data["lengths"])})


# ---------------------------------------------------------------------- child side
def compute(cfg: TrainConfig, rows_shown: int = 5, log=lambda message: None) -> Preview:
    """The preview itself. Imports the ML stack: runs in the preview subprocess or a worker."""
    from trainer_core import model_files, token_cache  # child only: these import transformers

    data = datasets.load_for_training(cfg)
    try:
        model_ref = model_files.resolve_model(cfg, log=log)
        tokenizer = token_cache.load_tokenizer(cfg, model_ref, os.environ.get("HF_TOKEN") or None)
    except (OSError, ValueError, model_files.ModelSourceError) as exc:  # missing files, offline hub, bad repo
        raise datasets.DatasetError("model_name", f"could not load the tokenizer: {type(exc).__name__}: {exc}") from None
    train_rows, dropped = token_cache.training_rows(data.rows, cfg.train_on_completions)
    eval_rows, _ = token_cache.training_rows(data.eval_rows, cfg.train_on_completions)
    dropped = {**data.train.dropped, **dropped}
    if not train_rows:
        raise datasets.DatasetError("train_on_completions", "no training rows are left: every conversation lacks a "
                                                            "prompt before its last assistant reply")
    arrow_rows = token_cache.Dataset.from_list(train_rows).to_list()  # the round trip the engine's rows take
    tokenized, _ = token_cache.tokenize(arrow_rows, tokenizer, cfg, log=log)
    ids_list = tokenized["input_ids"]
    masks = tokenized["completion_mask"] if "completion_mask" in tokenized.column_names else [None] * len(ids_list)
    counts = _count(cfg, ids_list, masks, token_cache)
    processes = parallel.process_count(cfg)
    if counts["fully_masked"]:
        dropped[TRUNCATION_DROP] = counts["fully_masked"]
    shown = tuple(_render(tokenizer, index, ids_list[index], masks[index], cfg.max_seq_length, cfg.packing)
                  for index in range(min(rows_shown, len(ids_list))))
    return Preview(
        format=data.train.format, format_reason=data.train.reason, tokenizer=_tokenizer_label(cfg, tokenizer),
        rows=shown, lengths=tuple(len(ids) for ids in ids_list), max_seq_length=cfg.max_seq_length,
        truncated=counts["truncated"], dropped=dropped, total_rows=counts["examples"],
        total_tokens=counts["tokens"], trained_tokens=counts["trained"],
        steps_per_epoch=steps_per_epoch(counts["examples"], cfg.batch_size, cfg.gradient_accumulation_steps,
                                        processes),
        eval_rows=len(eval_rows), processes=processes, global_batch=parallel.global_batch(cfg, processes))


def _count(cfg: TrainConfig, ids_list: list[list[int]], masks: list, token_cache) -> dict[str, int]:
    """TRL 1.16's rules: without packing, truncate to max_seq_length and drop rows left with no trained
    token; with packing, nothing is dropped and "bfd" cuts long rows while "bfd_split" splits them."""
    limit = cfg.max_seq_length
    split = cfg.packing and token_cache.packing_strategy(cfg) == "bfd_split"
    tokens = trained = truncated = fully_masked = 0
    kept_rows = []
    for ids, mask in zip(ids_list, masks):
        kept = len(ids) if split else min(len(ids), limit)
        kept_trained = sum(mask[:kept]) if mask is not None else kept
        truncated += len(ids) > limit and not split
        if kept_trained == 0 and not cfg.packing:
            fully_masked += 1
            continue
        kept_rows.append(ids[:kept])
        tokens += kept
        trained += kept_trained
    examples = token_cache.packed_count(kept_rows, cfg) if cfg.packing else len(kept_rows)
    return {"examples": examples, "tokens": tokens, "trained": trained, "truncated": truncated,
            "fully_masked": fully_masked}


def steps_per_epoch(examples: int, batch_size: int, accumulation: int, processes: int = 1) -> int:
    """transformers' Trainer: batches per epoch (the last one partial) dealt to the processes, then one
    update per ``accumulation`` batches of a process."""
    return parallel.steps_per_epoch(examples, batch_size, accumulation, processes)


def _render(tokenizer, index: int, ids: list[int], mask: list[int] | None, limit: int, packing: bool) -> RenderedRow:
    """Decode runs of trained / untrained tokens separately, so the pieces join to the text exactly."""
    kept = ids if packing else ids[:limit]
    flags = [bool(b) for b in (mask[:len(kept)] if mask is not None else [1] * len(kept))]
    segments: list[tuple[str, bool]] = []
    start = 0
    for end in range(1, len(kept) + 1):
        if end == len(kept) or flags[end] != flags[start]:
            piece = tokenizer.decode(kept[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            segments.append((piece, flags[start]))
            start = end
    return RenderedRow(index=index, text="".join(t for t, _ in segments), segments=tuple(segments),
                       num_tokens=len(ids), truncated=len(ids) > limit)


def _tokenizer_label(cfg: TrainConfig, tokenizer) -> str:
    return f"{cfg.model_label} ({type(tokenizer).__name__}, {len(tokenizer)} tokens)"


def main() -> int:
    """Read {"config", "rows_shown"} on stdin, write one JSON line: the preview, or {"errors": [...]}."""
    request = json.loads(sys.stdin.read())

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    try:
        cfg = TrainConfig.from_dict(request["config"])
        preview = compute(cfg, int(request.get("rows_shown", 5)), log=log)
    except ConfigError as exc:
        reply: dict[str, Any] = {"errors": [asdict(e) for e in exc.errors]}
    except datasets.DatasetError as exc:
        reply = {"errors": [{"field": exc.field, "message": exc.message}]}
    except paths.UnsafePathError as exc:
        reply = {"errors": [{"field": "model_name", "message": str(exc)}]}
    except Exception as exc:  # noqa: BLE001 - process boundary: report it; the traceback goes to stderr
        traceback.print_exc()
        reply = {"errors": [{"field": "preview", "message": f"the preview failed: {type(exc).__name__}: {exc}"}]}
    else:
        reply = asdict(preview)
    print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
