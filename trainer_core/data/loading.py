"""What a run trains on: local files (or a hub split) read, sliced, normalised, checked against the
config, and split into training and eval rows. The preview and the worker choose rows through
``load_for_training``; the orchestrator and the CLI check files through ``check_data``.

Kept whole: the one path from sources to training rows (read, resolve files, slice, normalise per method, check
against the config, split eval) that the preview, the worker and the checks share, so they cannot disagree.
"""
from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from trainer_core.data.bounded_cache import BoundedCache
from trainer_core.config import FieldError, TrainConfig
from trainer_core.data import DatasetError
from trainer_core.data import audio, embedding_pairs, images, preference
from trainer_core.methods.base import EMBEDDING_SHAPES, PREFERENCE_SHAPES
from trainer_core.data.formats import MAX_DROP_EXAMPLES, NormalizedData, convert_rows, no_usable_rows, normalize_rows
from trainer_core.data.readers import read_rows
from trainer_core.data.sources import resolve_source, source_files

_Part = tuple[str, list[dict]]  # (file name for messages, rows)


def _speech_columns(cfg: TrainConfig) -> dict[str, str] | None:
    """``stt.columns`` / ``tts.columns`` when the run trains on speech, else None (no other method reads clips)."""
    if audio.FORMAT not in cfg.method_spec.data_shapes:
        return None
    return {k: v for k, v in cfg.method_settings.columns.items() if isinstance(v, str) and v}


def _resolve_files(rows: list[dict], folder: Path | None, cfg: TrainConfig, field_name: str) -> list[dict]:
    """Clip and image file references made absolute and checked under the allowed roots (data.audio, data.images):
    what the worker opens is what was checked. Clips only for a speech-to-text run (others refuse audio data)."""
    speech = _speech_columns(cfg)
    if speech is not None:
        rows = audio.resolve_rows(rows, folder, field_name, speech)
    return images.resolve_rows(rows, folder, field_name)


def read_file(file: Path, cfg: TrainConfig, field_name: str) -> list[dict]:
    """One dataset file's rows as a run reads them, its clip and image references resolved (data.fingerprint)."""
    return _resolve_files(read_rows(file, field_name), file.parent, cfg, field_name)


def media_refs(rows: list[dict], cfg: TrainConfig) -> list:
    """Every clip and image the resolved rows name, in row order: file paths, or the bytes a row holds."""
    speech = _speech_columns(cfg)
    column = audio.audio_column(rows, speech) if speech is not None else None
    found: list = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        if column is not None and row.get(column) not in (None, ""):
            found.append(row[column])
        found += images.refs_of(row)
    return found


def _read_sources(sources: list[str], cfg: TrainConfig,
                  field_name: str) -> tuple[list[_Part], list[tuple], list[DatasetError]]:
    """Every source's files read, with their cache keys; problems are collected, not raised."""
    parts: list[_Part] = []
    keys: list[tuple] = []
    errors: list[DatasetError] = []
    for source in sources:
        try:
            files = source_files(resolve_source(source, field_name), field_name)
            for file in files:
                rows = read_file(file, cfg, field_name)  # paths from here
                stat = file.stat()
                parts.append((file.name, rows))
                keys.append((str(file), stat.st_mtime_ns, stat.st_size))
        except DatasetError as exc:
            errors.append(exc)
    return parts, keys, errors


def _slice_parts(parts: list[_Part], start: int, end: int) -> list[_Part]:
    """Rows [start, end) of the files taken one after another (end 0: to the end)."""
    if start < 0 or end < 0 or (end and end <= start):
        raise DatasetError("dataset_slice_end", "must be greater than dataset_slice_start (or 0 for 'to the end')")
    total = sum(len(rows) for _, rows in parts)
    stop = min(end, total) if end else total
    if start >= stop:
        raise DatasetError("dataset_slice_start", f"the slice starts at row {start}, but the training data has only "
                                                  f"{total} rows: lower dataset_slice_start or set it to 0")
    sliced, offset = [], 0
    for label, rows in parts:
        lo, hi = max(start - offset, 0), min(stop - offset, len(rows))
        if lo < hi:
            sliced.append((label, rows[lo:hi]))
        offset += len(rows)
    return sliced


def _labels(parts: list[_Part]) -> str:
    return ", ".join(dict.fromkeys(label for label, _ in parts))


def preference_shape(cfg: TrainConfig) -> str | None:
    """The preference/RL shape the run's method trains on (pairs, kto, prompts), or None for chat/text."""
    shapes = [s for s in cfg.method_spec.data_shapes if s in PREFERENCE_SHAPES]
    return shapes[0] if shapes else None


def normalize_for(rows: list[dict], cfg: TrainConfig, field_name: str, allow_empty: bool = False) -> NormalizedData:
    """Rows in the shape the run's method trains on: chat/text (data.formats) or preference/RL rows
    (data.preference). ``allow_empty``: an empty chat/text result is returned (merged files decide together)."""
    if cfg.method_spec.data_shapes and all(s in EMBEDDING_SHAPES for s in cfg.method_spec.data_shapes):
        return embedding_rows(rows, cfg, field_name, allow_empty)
    speech = _speech_columns(cfg)
    if speech is not None and cfg.method == "tts":  # text-to-speech: audio + text (+ speaker) rows
        from trainer_core.methods import tts

        settings: tts.TtsSettings = cfg.method_settings
        return audio.normalize(rows, speech or None, field_name, allow_empty, window_s=settings.max_clip_s,
                               method="tts", speaker=settings.speaker)
    if speech is not None:  # speech-to-text: audio + transcript rows
        return audio.normalize(rows, speech or None, field_name, allow_empty,
                               window_s=audio.window_of(cfg.model_name))
    shape = preference_shape(cfg)
    if shape is not None:
        return preference.normalize(rows, shape, cfg.custom_format_mapping, cfg.system_prompt, field_name)
    if audio.has_audio(rows):
        raise DatasetError(field_name, f"holds audio clips, which {cfg.method_spec.label.lower()} ({cfg.method}) cannot "
                                       "train on: set method: stt (speech-to-text) and a Whisper model, or tts (text-to-speech) and a CSM "
                                       "model")
    if images.has_images(rows):  # image + text rows: one vision shape whatever the layout
        return images.normalize(rows, cfg.custom_format_mapping, cfg.system_prompt, field_name, allow_empty)
    if allow_empty:
        return convert_rows(rows, cfg.format_type, cfg.custom_format_mapping, cfg.system_prompt)
    return normalize_rows(rows, cfg.format_type, cfg.custom_format_mapping, cfg.system_prompt, field_name=field_name)


def embedding_rows(rows: list[dict], cfg: TrainConfig, field_name: str, allow_empty: bool = False) -> NormalizedData:
    """An embedding run's rows (data.embedding_pairs): the shape detected from the column names (or the
    ``embedding.columns`` mapping), canonical columns in the order sentence-transformers reads them, unusable
    rows dropped and counted; the reason says which shape and which loss that implies."""
    mapping = cfg.method_settings.columns
    try:
        found = embedding_pairs.detect(rows, mapping)
    except ValueError as exc:
        raise DatasetError("embedding.columns" if mapping else field_name, str(exc)) from None
    shaped, dropped = embedding_pairs.normalize(rows, found)
    loss = cfg.method_settings.loss
    if loss in embedding_pairs.LOSS_LABELS and loss != found.loss:
        names = ", ".join(f"{c}={s!r}" for c, s in found.columns.items())
        reason = (f"{embedding_pairs.SHAPES[found.shape]} ({names}); loss {embedding_pairs.LOSS_LABELS[loss]} "
                  f"(embedding.loss; auto would pick {embedding_pairs.LOSS_LABELS[found.loss]})")
    else:
        reason = found.reason
    if not shaped and not allow_empty:
        raise no_usable_rows(field_name, len(rows), dict(dropped))
    return NormalizedData(format=found.shape, reason=reason, rows=shaped, dropped=dict(dropped))


def _embedding_problems(data: NormalizedData, cfg: TrainConfig, field_name: str, what: str) -> list[DatasetError]:
    """What an embedding run's settings contradict in its data: one shape for all files, a loss that fits it,
    and no chat-only settings (an embedding model encodes texts; it has no conversations)."""
    problems = []
    shapes = data.format.split("+")
    if len(shapes) > 1:
        problems.append(DatasetError(field_name, f"{what} mix data shapes ({', '.join(shapes)}): an embedding run "
                                                 "trains on one shape; use files with the same columns"))
    else:
        loss = cfg.method_settings.loss
        if loss in embedding_pairs.LOSS_LABELS:
            problems += [DatasetError(p.field, p.message)
                         for p in embedding_pairs.loss_problems(loss, shapes[0], data.rows)]
    if cfg.system_prompt.strip():
        problems.append(DatasetError("system_prompt", "an embedding model encodes texts, not conversations: clear "
                                                      "the system prompt (for a prefix such as 'query: ' set "
                                                      "embedding.query_prompt)"))
    if cfg.train_on_completions:
        problems.append(DatasetError("train_on_completions", "an embedding model has no completions: turn this off"))
    return problems


def _normalize_parts(parts: list[_Part], cfg: TrainConfig, field_name: str) -> NormalizedData:
    """Each file detected and normalised on its own (files may differ in layout), then merged."""
    results = []
    for label, rows in parts:
        try:
            results.append(normalize_for(rows, cfg, field_name, allow_empty=True))
        except DatasetError as exc:
            raise DatasetError(exc.field, f"{label}: {exc.message}") from None
    return _merge(parts, results, field_name)


def _merge(parts: list[_Part], results: list[NormalizedData], field_name: str) -> NormalizedData:
    labels = [label for label, _ in parts]
    text = [label for label, r in zip(labels, results) if not r.is_chat]
    chat = [label for label, r in zip(labels, results) if r.is_chat]
    if text and chat:
        raise DatasetError(field_name, f"mixes raw text ({', '.join(text)}) with chat data ({', '.join(chat)}): "
                                       "train on one kind at a time")
    reasons = list(dict.fromkeys(r.reason for r in results))
    reason = reasons[0] if len(reasons) == 1 else "; ".join(f"{label}: {r.reason}" for label, r in zip(labels, results))
    dropped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    for r in results:
        dropped.update(r.dropped)
        for key, shown in r.drop_examples.items():
            kept = examples.setdefault(key, [])
            kept.extend(e for e in shown if e not in kept)
            del kept[MAX_DROP_EXAMPLES:]
    merged = NormalizedData(format="+".join(dict.fromkeys(r.format for r in results)), reason=reason,
                            rows=[row for r in results for row in r.rows], dropped=dict(dropped),
                            drop_examples=examples)
    if not merged.rows:
        problem = no_usable_rows(field_name, sum(len(rows) for _, rows in parts), merged.dropped)
        raise DatasetError(field_name, f"{_labels(parts)}: {problem.message}")
    return merged


def _usage_problems(data: NormalizedData, cfg: TrainConfig, field_name: str, what: str) -> list[DatasetError]:
    """Settings that the detected data contradicts (explicit contradictions are config.py's job)."""
    spec = cfg.method_spec
    if data.format.split("+")[0] in EMBEDDING_SHAPES:
        return _embedding_problems(data, cfg, field_name, what)
    if data.format == audio.FORMAT:
        return audio.model_problems(cfg, field_name)
    problems = []
    shape = data.format if data.format in PREFERENCE_SHAPES else "chat" if data.is_chat else "text"
    if shape not in spec.data_shapes and cfg.format_type in ("auto", "text"):
        held = f"{data.format} chat data" if data.is_chat else "raw text"
        problems.append(DatasetError(field_name, f"{spec.label.lower()} ({spec.name}) trains on {spec.shapes_text()}, "
                                                 f"but {what} holds {held} ({data.reason}): {spec.data_fix}"))
    if not data.is_chat and cfg.system_prompt.strip():
        problems.append(DatasetError("system_prompt", f"raw text has no conversations to add a system prompt to "
                                                      f"({data.reason}): clear the system prompt or use chat data"))
    if not data.is_chat and cfg.train_on_completions and cfg.format_type == "auto":
        problems.append(DatasetError("train_on_completions", f"raw text has no completions ({data.reason}): "
                                                             "turn this off or use chat data"))
    problems += images.model_problems(cfg, images.FORMAT in data.format.split("+"), field_name)
    return problems


def load_local(sources: list[str], cfg: TrainConfig, field_name: str = "local_datasets",
               apply_slice: bool = True) -> NormalizedData:
    """Read every source, apply the config's slice, normalise. Raises the first problem found."""
    parts, _, errors = _read_sources(sources, cfg, field_name)
    if errors:
        raise errors[0]
    if not parts:
        raise DatasetError(field_name, "no dataset files given")
    if apply_slice:
        parts = _slice_parts(parts, cfg.dataset_slice_start, cfg.dataset_slice_end)
    data = _normalize_parts(parts, cfg, field_name)
    problems = _usage_problems(data, cfg, field_name, _labels(parts))
    if problems:
        raise problems[0]
    return data


_check_cache: BoundedCache[tuple, list[FieldError]] = BoundedCache(16)  # the form re-checks on every rerun


def check_data(cfg: TrainConfig) -> list[FieldError]:
    """Every problem with the local dataset files under this config (``TrainConfig.validate`` checks the
    fields only; the orchestrator and the CLI add this check). Hub data is checked by the worker."""
    if cfg.hf_dataset or not cfg.local_datasets:
        return []  # hub data, or no data at all: the config's field checks say what to do
    return [problem for name, sources in (("local_datasets", cfg.local_datasets),
                                          ("local_eval_datasets", cfg.local_eval_datasets))
            for problem in check_sources(sources, cfg, field_name=name)]


def check_sources(sources: list[str], cfg: TrainConfig, field_name: str) -> list[FieldError]:
    """Every problem with these sources under this config."""
    parts, keys, read_errors = _read_sources(sources, cfg, field_name)
    errors = [FieldError(e.field, e.message) for e in read_errors]
    if not parts:
        return errors
    apply_slice = field_name == "local_datasets"
    key = (field_name, tuple(keys), cfg.format_type, tuple(sorted(cfg.custom_format_mapping.items())),
           cfg.system_prompt, cfg.method, cfg.train_on_completions, cfg.model_name, cfg.max_seq_length,
           cfg.is_dataset_image, cfg.packing, repr(cfg.method_settings),
           (cfg.dataset_slice_start, cfg.dataset_slice_end) if apply_slice else None)
    found = _check_cache.get(key)
    if found is None:
        found = _check_parts(parts, cfg, field_name, apply_slice)
        _check_cache.put(key, found)
    return errors + list(found)


def _check_parts(parts: list[_Part], cfg: TrainConfig, field_name: str, apply_slice: bool) -> list[FieldError]:
    problems: list[DatasetError] = []
    results = []
    for label, rows in parts:
        try:
            results.append(normalize_for(rows, cfg, field_name))
        except DatasetError as exc:
            problems.append(DatasetError(exc.field, f"{label}: {exc.message}"))
    if not problems:
        start, end = cfg.dataset_slice_start, cfg.dataset_slice_end
        sliced = apply_slice and (start or end) and start >= 0 and end >= 0 and not (end and end <= start)
        try:
            if sliced:
                data = _normalize_parts(_slice_parts(parts, start, end), cfg, field_name)
            else:
                data = _merge(parts, results, field_name)
            problems += _usage_problems(data, cfg, field_name, _labels(parts))
        except DatasetError as exc:
            problems.append(exc)
    # the same file listed twice would repeat its problems word for word
    unique = dict.fromkeys((p.field, p.message) for p in problems)
    return [FieldError(f, message) for f, message in unique]


# ---------------------------------------------------------------------- hub (worker only)
_OFFLINE_ERROR_NAMES = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectTimeout", "ReadTimeout",
                        "ConnectError", "NameResolutionError", "MaxRetryError"}


def load_hub(cfg: TrainConfig, split: str, apply_slice: bool | None = None) -> NormalizedData:
    """Load a split of ``cfg.hf_dataset`` and normalise it. Slices the training split unless told otherwise."""
    try:
        import datasets as hf_datasets  # worker only: importing it costs seconds and pulls in heavy libraries
    except ImportError as exc:
        raise DatasetError("hf_dataset", "hub datasets need the 'datasets' package: pip install datasets") from exc
    token = os.environ.get("HF_TOKEN") or None
    split_field = "train_split" if split == cfg.train_split else "eval_split"
    try:
        ds = hf_datasets.load_dataset(cfg.hf_dataset, cfg.subset or None, split=split, token=token)
    except Exception as exc:  # noqa: BLE001 - the hub raises many types; each becomes a field error the form shows
        raise _hub_error(exc, cfg, split, split_field, token) from None
    if audio.FORMAT in cfg.method_spec.data_shapes:  # clips stay {bytes, path}: the stt collator decodes them
        for name, feature in ds.features.items():
            if isinstance(feature, hf_datasets.Audio):
                ds = ds.cast_column(name, hf_datasets.Audio(decode=False))
    if apply_slice is None:
        apply_slice = split == cfg.train_split
    total = len(ds)
    if apply_slice and (cfg.dataset_slice_start or cfg.dataset_slice_end):
        stop = min(cfg.dataset_slice_end, total) if cfg.dataset_slice_end else total
        if cfg.dataset_slice_start >= stop:
            raise DatasetError("dataset_slice_start", f"the slice starts at row {cfg.dataset_slice_start}, but split "
                                                      f"'{split}' has only {total} rows")
        ds = ds.select(range(cfg.dataset_slice_start, stop))
    rows = ds.to_list()
    if not rows:
        raise DatasetError(split_field, f"split '{split}' of {cfg.hf_dataset} has no rows")
    rows = _resolve_files(rows, None, cfg, "hf_dataset")  # a path in a hub row is checked like a local file's
    data = normalize_for(rows, cfg, "hf_dataset")
    problems = _usage_problems(data, cfg, "hf_dataset", cfg.hf_dataset)
    if problems:
        raise problems[0]
    return data


def _hub_error(exc: Exception, cfg: TrainConfig, split: str, split_field: str, token: str | None) -> DatasetError:
    detail = f"{type(exc).__name__}: {exc}"
    if token:
        detail = detail.replace(token, "***")
    chain, seen = [], exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    names = {type(e).__name__ for e in chain}
    if names & _OFFLINE_ERROR_NAMES or any(isinstance(e, (ConnectionError, TimeoutError)) for e in chain):
        return DatasetError("hf_dataset", "could not reach the Hugging Face hub and the dataset is not in the local "
                                          f"cache: {detail}")
    if "DatasetNotFoundError" in names or "RepositoryNotFoundError" in names or "GatedRepoError" in names:
        return DatasetError("hf_dataset", f"{cfg.hf_dataset} was not found on the hub, or it is private/gated and "
                                          f"needs a Hugging Face token: {detail}")
    text = str(exc)
    if "Unknown split" in text or ("split" in text.lower() and "should be one of" in text.lower()):
        return DatasetError(split_field, f"{cfg.hf_dataset} has no split '{split}': {detail}")
    if "BuilderConfig" in text or "Config name is missing" in text:
        return DatasetError("subset", f"choose a valid subset of {cfg.hf_dataset}: {detail}")
    return DatasetError("hf_dataset", f"could not load {cfg.hf_dataset}: {detail}")


# ---------------------------------------------------------------------- what a run trains on
@dataclass
class TrainingData:
    """The normalised training data, and the rows a run trains and evaluates on after the eval split."""

    train: NormalizedData
    rows: list[dict]
    eval_rows: list[dict]


def load_for_training(cfg: TrainConfig) -> TrainingData:
    """Train and eval rows chosen exactly as a run chooses them: the preview and the worker share this.

    Hub split or local files; the eval set is a named split, separate files, or a fixed-seed held-out
    fraction of the training rows (only when no eval set was named). Imports ``datasets`` for hub data.
    """
    if cfg.hf_dataset:
        train = load_hub(cfg, cfg.train_split)
        evals = load_hub(cfg, cfg.eval_split).rows if cfg.eval_split else []
    else:
        train = load_local(cfg.local_datasets, cfg)
        evals = (load_local(cfg.local_eval_datasets, cfg, field_name="local_eval_datasets", apply_slice=False).rows
                 if cfg.local_eval_datasets else [])
    rows = train.rows
    if not evals and cfg.eval_fraction > 0:
        rows, evals = split_eval(train, cfg.eval_fraction, cfg.random_seed)
    return TrainingData(train=train, rows=rows, eval_rows=evals)


# ---------------------------------------------------------------------- eval split
def split_eval(data: NormalizedData, fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, eval): a fixed-seed held-out share of the rows, both in their original order."""
    rows = data.rows
    if fraction <= 0 or len(rows) < 2:
        return list(rows), []
    count = min(max(1, round(len(rows) * fraction)), len(rows) - 1)
    held = set(random.Random(seed).sample(range(len(rows)), count))
    return ([row for i, row in enumerate(rows) if i not in held],
            [row for i, row in enumerate(rows) if i in held])
