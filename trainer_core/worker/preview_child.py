"""The preview's child process: ``python -m trainer_core.worker.preview_child`` reads {"config", "rows_shown"}
on stdin and writes the preview (trainer_core.data.preview.Preview) as one JSON line. It loads the tokenizer and
the rows the way the worker does and tokenizes through the engine's own ``token_cache.tokenize``."""
from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict
from typing import Any

from trainer_core.host import parallel
from trainer_core.config import ConfigError, TrainConfig
from trainer_core.data import DatasetError
from trainer_core.data.loading import load_for_training
from trainer_core.data.preview import TRUNCATION_DROP, Preview, RenderedRow
from trainer_core.data.tool_calls import is_tool_row
from trainer_core.data.tool_schema import row_problems
from trainer_core.export.tool_templates import ToolTemplateError
from trainer_core.protocol import paths
from trainer_core.worker import methods as worker_methods
from trainer_core.worker import model_files, token_cache, tool_template, vision


def compute(cfg: TrainConfig, rows_shown: int = 5, log=lambda message: None) -> Preview:
    """The preview itself. Imports the ML stack: runs in the preview subprocess or a worker."""
    data = load_for_training(cfg)
    method = worker_methods.get(cfg.method)
    try:
        model_ref = model_files.resolve_model(cfg, log=log)
        if hasattr(method, "local_ref"):  # a method that loads its own model names its folder (embedding)
            model_ref = method.local_ref(model_ref)
        tokenizer = token_cache.load_tokenizer(cfg, model_ref, os.environ.get("HF_TOKEN") or None)
    except (OSError, ValueError, model_files.ModelSourceError) as exc:  # missing files, offline hub, bad repo
        raise DatasetError("model_name", f"could not load the tokenizer: {type(exc).__name__}: {exc}") from None
    if hasattr(method, "preview"):  # the method renders its own rows (pairs side by side, GRPO's prompts)
        return method.preview(cfg, data, tokenizer, rows_shown, _tokenizer_label(cfg, tokenizer))
    train_rows, dropped = method.shape_rows(data.rows, cfg)  # the rows the method's trainer will take
    eval_rows, _ = method.shape_rows(data.eval_rows, cfg)
    dropped = {**data.train.dropped, **dropped}
    if not train_rows:
        raise DatasetError("train_on_completions", "no training rows are left: every conversation lacks a "
                                                   "prompt before its last assistant reply")
    try:
        template = tool_template.apply(tokenizer, train_rows + eval_rows, cfg)  # as the worker does
    except ToolTemplateError as exc:
        raise DatasetError("tool_template", str(exc).removeprefix("tool_template: ")) from None
    arrow_rows = token_cache.Dataset.from_list(train_rows).to_list()  # the round trip the engine's rows take
    if vision.is_vision_rows(arrow_rows):  # image rows: the processor expands every image to its tokens
        from trainer_core.worker import model_resolver

        processor = model_resolver.load_processor(model_ref, cfg, os.environ.get("HF_TOKEN") or None)
        ids_list, masks = vision.encodings(arrow_rows, processor, cfg.image_max_side)
    else:
        tokenized, _ = token_cache.tokenize(arrow_rows, tokenizer, cfg, log=log)
        ids_list = tokenized["input_ids"]
        masks = token_cache.trained_masks(tokenized)
    counts = _count(cfg, ids_list, masks)
    processes = parallel.process_count(cfg)
    if counts["fully_masked"]:
        dropped[TRUNCATION_DROP] = counts["fully_masked"]
    shown = tuple(_render(tokenizer, index, ids_list[index], masks[index], cfg.max_seq_length, cfg.packing)
                  for index in range(min(rows_shown, len(ids_list))))
    if vision.is_vision_rows(arrow_rows):  # "<image> × 16 tokens" rather than sixteen <image>s
        shown = tuple(vision.readable_row(row, getattr(processor, "image_token", "")) for row in shown)
    return Preview(
        format=data.train.format, format_reason=data.train.reason, tokenizer=_tokenizer_label(cfg, tokenizer),
        rows=shown, lengths=tuple(len(ids) for ids in ids_list), max_seq_length=cfg.max_seq_length,
        truncated=counts["truncated"], dropped=dropped, total_rows=counts["examples"],
        total_tokens=counts["tokens"], trained_tokens=counts["trained"],
        steps_per_epoch=parallel.steps_per_epoch(counts["examples"], cfg.batch_size, cfg.gradient_accumulation_steps,
                                        processes),
        eval_rows=len(eval_rows), processes=processes, global_batch=parallel.global_batch(cfg, processes),
        tool_template=template, tool_problems=_tool_problems(data.rows))


def _tool_problems(rows: list[dict], limit: int = 20) -> tuple[str, ...]:
    """"row N: ..." for the first ``limit`` problems of rows with tools (0-based, as the preview numbers rows)."""
    found: list[str] = []
    for index, row in enumerate(rows):
        if is_tool_row(row):
            found += [f"row {index}: {problem}" for problem in row_problems(row)]
        if len(found) >= limit:
            break
    return tuple(found[:limit])


def _count(cfg: TrainConfig, ids_list: list[list[int]], masks: list) -> dict[str, int]:
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
    except DatasetError as exc:
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
