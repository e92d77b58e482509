"""Test data for an eval job: rows read and normalised by the training data code (every training format
works), split into a prompt (every turn before the last assistant reply) and the reference answer (that
reply), as training on completions splits them (``worker.token_cache.prompt_completion``).

Also the two keys of the cached base-model baseline: a fingerprint of the test data and a hash of the
settings that change scores. No ML stack: the dashboard validates and keys evals with these.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainer_core.config import TrainConfig, hub_dataset_problem
from trainer_core.data import DatasetError, loading
from trainer_core.data.fingerprint import data_fingerprint
from trainer_core.data.formats import NormalizedData

if TYPE_CHECKING:
    from trainer_core.evaluation.spec import EvalSpec

EVAL_SPLIT_PREFIX = "eval_split:"  # data "eval_split:<run id>": that run's own held-out rows
HUB_PREFIX = "hub:"  # data "hub:<dataset id>": a split of a Hugging Face hub dataset (online)
NO_REFERENCE = "no assistant reply after a prompt (nothing to compare an answer with)"


@dataclass(frozen=True)
class Sample:
    index: int
    prompt: list[dict]  # chat turns, up to (not including) the reference answer
    reference: str


def data_kind(data: str) -> str:
    """'eval_split', 'hub' or 'file'."""
    if data.startswith(EVAL_SPLIT_PREFIX):
        return "eval_split"
    if data.startswith(HUB_PREFIX):
        return "hub"
    return "file"


def data_config(spec: "EvalSpec") -> TrainConfig:
    """The TrainConfig whose data fields read ``spec.data`` with the spec's format settings."""
    base = dataclasses.replace(TrainConfig(), format_type=spec.format_type,
                               custom_format_mapping=dict(spec.custom_format_mapping), system_prompt=spec.system_prompt,
                               local_datasets=[], local_eval_datasets=[], eval_fraction=0.0)
    if data_kind(spec.data) == "hub":
        return dataclasses.replace(base, hf_dataset=spec.data[len(HUB_PREFIX):].strip(), subset=spec.hub_subset,
                                   train_split=spec.hub_split, eval_split="")
    return dataclasses.replace(base, local_datasets=[spec.data])


def hub_problem(data: str) -> str | None:
    """Why ``hub:<id>`` names no hub dataset (training's check: a path, '.', '..', a builtin loader such as json
    or csv, a local folder would all be read from disk outside the allowed folders), or None."""
    hub_id = data[len(HUB_PREFIX):].strip()
    if not hub_id:
        return "hub:<dataset id>, e.g. hub:tatsu-lab/alpaca"
    return hub_dataset_problem(hub_id, instead="give {} as data, without hub:, instead")


def split_run(data: str) -> str:
    return data[len(EVAL_SPLIT_PREFIX):].strip()


def load_rows(spec: "EvalSpec") -> NormalizedData:
    """The test rows, normalised; DatasetError (field ``data`` or a format field) names the fix.
    Hub data imports ``datasets`` (worker only)."""
    from trainer_core import jobspec

    kind = data_kind(spec.data)
    if kind == "eval_split":
        run_id = split_run(spec.data)
        try:
            cfg = jobspec.run_config(run_id)
        except jobspec.SourceError as exc:
            raise DatasetError("data", str(exc)) from None
        rows = _renamed(lambda: loading.load_for_training(cfg)).eval_rows
        if not rows:
            raise DatasetError("data", f"run {run_id} has no eval split (no eval files and eval_fraction 0): "
                                       "give a test file instead")
        return NormalizedData(format="chatml" if "messages" in rows[0] else "text",
                              reason=f"the eval split of run {run_id}", rows=rows)
    cfg = data_config(spec)
    if kind == "hub":
        problem = hub_problem(spec.data)  # again in the worker: its working folder is where a local name would be read
        if problem:
            raise DatasetError("data", problem)
        return _renamed(lambda: loading.load_hub(cfg, spec.hub_split, apply_slice=False))
    return _renamed(lambda: loading.load_local([spec.data], cfg, field_name="data", apply_slice=False))


def _renamed(read):
    try:
        return read()
    except DatasetError as exc:
        field = "data" if exc.field in ("local_datasets", "hf_dataset", "train_split") else exc.field
        raise DatasetError(field, exc.message) from None


def to_samples(data: NormalizedData, max_samples: int = 0) -> tuple[list[Sample], int]:
    """(samples, rows left out for having no reference answer); DatasetError when none is left."""
    if not data.is_chat:
        raise DatasetError("data", f"raw text has no reference answers ({data.reason}): evaluate on chat or "
                                   "instruction data (alpaca instruction/output, chatml messages or sharegpt "
                                   "conversations ending in an assistant reply)")
    samples: list[Sample] = []
    skipped = 0
    for row in data.rows:
        messages = row["messages"]
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None or last == 0 or not messages[last]["content"].strip():
            skipped += 1
            continue
        samples.append(Sample(len(samples), messages[:last], messages[last]["content"]))
        if max_samples and len(samples) >= max_samples:
            break
    if not samples:
        raise DatasetError("data", f"none of the {len(data.rows):,} rows has a prompt followed by an assistant "
                                   "reply to compare with: every test row needs a question and its reference answer")
    return samples, skipped


def load_samples(spec: "EvalSpec") -> tuple[list[Sample], str | None]:
    """(samples, one warning naming every row left out and why, or None)."""
    data = load_rows(spec)
    samples, skipped = to_samples(data, spec.max_samples)
    return samples, left_out_warning(data, skipped)


def left_out_warning(data: NormalizedData, skipped: int) -> str | None:
    """The rows the test set lost, as training reports them (``NormalizedData.drop_warning``): those its format
    could not read (a missing answer column, an unknown role...) and those with no reference answer."""
    dropped = dict(data.dropped)
    if skipped:
        dropped[NO_REFERENCE] = dropped.get(NO_REFERENCE, 0) + skipped
    if not dropped:
        return None
    read = dataclasses.replace(data, rows=data.rows[:max(len(data.rows) - skipped, 0)], dropped=dropped)
    return read.drop_warning("test rows").replace("Dropped ", "Left out ", 1)


def fingerprint(spec: "EvalSpec") -> str:
    """A hash of the test data: file bytes for a file (the training fingerprint), the run's training data
    fingerprint and split settings for an eval split, the id/subset/split for a hub dataset."""
    from trainer_core import jobspec

    if data_kind(spec.data) == "eval_split":
        run_id = split_run(spec.data)
        try:
            cfg = jobspec.run_config(run_id)
        except jobspec.SourceError as exc:
            raise DatasetError("data", str(exc)) from None
        digest = f"eval_split|{data_fingerprint(cfg)}|{cfg.eval_fraction}|{cfg.random_seed}"
        return hashlib.sha256(digest.encode()).hexdigest()[:32]
    try:
        return data_fingerprint(data_config(spec))
    except DatasetError as exc:
        raise DatasetError("data", exc.message) from None


# Fields that change what an eval measures: two evals agree on all of them, and on the data, to be compared.
SCORED_FIELDS = ("format_type", "custom_format_mapping", "system_prompt", "metrics", "max_samples", "temperature",
                 "top_p", "top_k", "max_new_tokens", "repetition_penalty", "seed", "judge_model", "judge_rubric",
                 "lm_eval_tasks", "lm_eval_limit", "hub_split", "hub_subset")


def settings_hash(spec: "EvalSpec") -> str:
    values = {name: getattr(spec, name) for name in SCORED_FIELDS}
    values["metrics"] = sorted(values["metrics"])
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:24]
