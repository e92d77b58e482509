"""Rows to token ids, exactly as TRL's SFTTrainer would make them, cached on disk.

The worker (through the engine's ``build_trainer``) and the preview subprocess both come through here,
so the preview shows what the trainer trains on. Tokenizing is the slow part of data preparation, so
the result is saved under ``<data_root>/cache/tokenized/<key>/`` with ``Dataset.save_to_disk``; the key
hashes the rows, the tokenizer (vocabulary, special tokens, chat template) and the settings, so a
changed tokenizer or template never reuses a stale cache. SFTTrainer skips its own tokenization when
a dataset already has ``input_ids`` and still builds labels, truncates and packs it itself.

Worker and subprocess only: imports ``datasets``, ``trl`` and ``transformers``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import transformers
import trl
from datasets import Dataset
from transformers import AutoTokenizer
from trl.data_utils import common_prefix_length, pack_dataset

from trainer_core.protocol import paths
from trainer_core.config import TrainConfig
from trainer_core.data import tool_calls

CACHE_FORMAT = 1  # bump when encode() changes what it produces
STATS: Counter[str] = Counter()  # "hit" / "miss" per process, for logs and tests
NO_PROMPT = "no prompt before the last assistant reply (train on completions)"


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    completion_mask: list[int] | None  # 1 = trained; None = every token is trained
    assistant_mask: list[int] | None = None  # a tool row's trained turns (TRL's "assistant_masks"); None: no such mask


def load_tokenizer(cfg: TrainConfig, model_ref: str, token: str | None):
    """The tokenizer the run trains with (the engine's ``load_model`` calls this too)."""
    tokenizer = AutoTokenizer.from_pretrained(model_ref, token=token, trust_remote_code=cfg.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# ---------------------------------------------------------------------- rows in the trainer's shape
def training_rows(rows: list[dict], completions_only: bool) -> tuple[list[dict], dict[str, int]]:
    """Rows as SFTTrainer takes them, and the rows left out (reason -> count).

    Chat rows stay ``{"messages"}``; for completions-only loss each becomes ``{"prompt", "completion"}``,
    split before the last assistant turn (turns after it are not trained on). Text rows stay ``{"text"}``.
    Rows with tools stay whole: their mask trains every assistant turn (``encode``).
    """
    if not (completions_only and rows and "messages" in rows[0]):
        return _same_keys(list(rows)), {}
    shaped = [row if tool_calls.is_tool_row(row) else prompt_completion(row["messages"]) for row in rows]
    kept = [row for row in shaped if row is not None]
    dropped = len(shaped) - len(kept)
    return _same_keys(kept), ({NO_PROMPT: dropped} if dropped else {})


def _same_keys(rows: list[dict]) -> list[dict]:
    """Rows with and without tools given the same keys (None where a row has none): ``Dataset.from_list`` takes
    its columns from the first row, and would drop a later row's ``tools`` or its prompt/completion split."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    if all(len(row) == len(keys) for row in rows):
        return rows
    return [{key: row.get(key) for key in keys} for row in rows]


def prompt_completion(messages: list[dict]) -> dict | None:
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None or last == 0:
        return None
    return {"prompt": messages[:last], "completion": [messages[last]]}


# ---------------------------------------------------------------------- tokenizing (mirrors trl 1.16)
def encode(tokenizer, row: dict, train_on_tool_results: bool = False) -> Encoded:
    """One row's token ids, as ``SFTTrainer._prepare_dataset`` tokenizes it (trl 1.16, no assistant masks);
    a row with tools gets its own mask (``encode_tool_row``)."""
    if row.get("messages") is not None and tool_calls.is_tool_row(row):
        return encode_tool_row(tokenizer, row, train_on_tool_results)
    if row.get("prompt") is not None:  # prompt-completion: the completion starts where both tokenizations diverge
        prompt_ids = _chat_ids(tokenizer, row["prompt"], add_generation_prompt=True)
        ids = _chat_ids(tokenizer, row["prompt"] + row["completion"])
        start = common_prefix_length(prompt_ids, ids)
        return Encoded(ids, [0] * start + [1] * (len(ids) - start))
    if row.get("messages") is not None:
        return Encoded(_chat_ids(tokenizer, row["messages"]), None)
    text = row["text"]
    if not text.endswith(tokenizer.eos_token):  # TRL appends EOS to raw text so the model learns to stop
        text += tokenizer.eos_token
    return Encoded(list(tokenizer(text=text)["input_ids"]), None)


def _chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = False,
              tools: list[dict] | None = None) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, chat_template=None, tools=tools,
                                        add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"])


def encode_tool_row(tokenizer, row: dict, train_on_tool_results: bool = False) -> Encoded:
    """A conversation with tools, rendered with its tools; trained: every assistant turn (its words and calls, up
    to its end-of-turn), and the tool results only when ``train_on_tool_results``. A turn's tokens are where the
    conversation rendered up to it and through it diverge from the whole (templates render prefixes alike)."""
    messages, tools = tool_calls.template_messages(row)
    ids = _chat_ids(tokenizer, messages, tools=tools)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        assistant = message["role"] == "assistant"
        if not (assistant or (train_on_tool_results and message["role"] == tool_calls.TOOL_ROLE)):
            continue
        head = _chat_ids(tokenizer, messages[:i], add_generation_prompt=assistant, tools=tools) if i else []
        start = common_prefix_length(head, ids)
        end = common_prefix_length(_chat_ids(tokenizer, messages[:i + 1], tools=tools), ids)
        mask[start:end] = [1] * (end - start)
    return Encoded(ids, None, mask)


def trained_masks(tokenized: Dataset) -> list[list[int] | None]:
    """Per row, which tokens count towards the loss (TRL multiplies the masks it finds); None: all of them."""
    columns = [c for c in ("completion_mask", "assistant_masks") if c in tokenized.column_names]
    if not columns:
        return [None] * len(tokenized)
    return [[int(all(bits)) for bits in zip(*masks)] for masks in zip(*(tokenized[c] for c in columns))]


def packing_strategy(cfg: TrainConfig) -> str:
    """The method's packing rule: TRL's "bfd" cuts rows longer than max_seq_length; continued pretraining
    splits raw text across packed rows instead ("bfd_split"), so no text is lost."""
    return cfg.method_spec.packing_strategy


def packed_count(ids_list: list[list[int]], cfg: TrainConfig) -> int:
    """How many sequences TRL's packing makes of these rows (its own function, batches and all)."""
    if not ids_list:
        return 0
    table = Dataset.from_dict({"input_ids": ids_list, "labels": ids_list})
    return len(pack_dataset(table, cfg.max_seq_length, packing_strategy(cfg), {}))


# ---------------------------------------------------------------------- cache
def cache_root() -> Path:
    path = paths.data_root() / "cache" / "tokenized"
    path.mkdir(parents=True, exist_ok=True)
    return path


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything in the tokenizer that changes token ids: vocabulary and merges, normaliser,
    special tokens, and the chat template."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    else:  # slow tokenizers: the vocabulary is the best stable summary
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    extra = {"class": type(tokenizer).__name__, "template": tokenizer.chat_template,
             "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}}
    digest.update(json.dumps(extra, sort_keys=True).encode())
    return digest.hexdigest()


def cache_key(rows: list[dict], tokenizer, cfg: TrainConfig) -> str:
    """Hash of the rows, the tokenizer and every setting that shapes the tokenized data."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    settings = {
        "format": CACHE_FORMAT, "trl": trl.__version__, "transformers": transformers.__version__,
        "tokenizer": tokenizer_fingerprint(tokenizer), "max_seq_length": cfg.max_seq_length,
        "packing": cfg.packing, "train_on_completions": cfg.train_on_completions, "format_type": cfg.format_type,
        "mapping": sorted(cfg.custom_format_mapping.items()), "system_prompt": cfg.system_prompt,
    }
    if cfg.train_on_tool_results:  # only when set: the keys of runs without tools stay what they were
        settings["train_on_tool_results"] = True
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def tokenize(rows: list[dict], tokenizer, cfg: TrainConfig, log=print) -> tuple[Dataset, bool]:
    """(dataset with ``input_ids`` [+ ``completion_mask``], cache hit?) for rows in ``training_rows`` shape."""
    key = cache_key(rows, tokenizer, cfg)
    folder = cache_root() / key
    if (folder / "dataset_info.json").exists():
        STATS["hit"] += 1
        log(f"Tokenized data: cache hit ({len(rows)} rows, {folder})")
        return Dataset.load_from_disk(str(folder)), True
    STATS["miss"] += 1
    encoded = [encode(tokenizer, row, cfg.train_on_tool_results) for row in rows]
    columns: dict[str, list] = {"input_ids": [e.input_ids for e in encoded]}
    if cfg.train_on_completions and any(e.completion_mask is not None for e in encoded):
        columns["completion_mask"] = [_or_all(e.completion_mask, e) for e in encoded]
    if any(e.assistant_mask is not None for e in encoded):  # rows with tools (the others: every token, as before)
        columns["assistant_masks"] = [_or_all(e.assistant_mask, e) for e in encoded]
    dataset = Dataset.from_dict(columns)
    _save(dataset, folder)
    log(f"Tokenized data: {len(rows)} rows tokenized and cached in {folder}")
    return Dataset.load_from_disk(str(folder)), False


def _or_all(mask: list[int] | None, encoded: Encoded) -> list[int]:
    return mask if mask is not None else [1] * len(encoded.input_ids)


def _save(dataset: Dataset, folder: Path) -> None:
    """Write beside the target and rename, so a reader never sees half a cache entry."""
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    dataset.save_to_disk(str(tmp))
    try:
        os.replace(tmp, folder)
    except OSError:  # another process stored the same key first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)


def generation_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids a chat model is asked with: ``messages`` through the chat template training uses, with the
    assistant's turn opened (the Playground's "Show prompt")."""
    return _chat_ids(tokenizer, messages, add_generation_prompt=True)
