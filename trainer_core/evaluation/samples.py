"""Test data for an eval job: rows read and normalised by the training data code (every training format
works), split into a prompt (every turn before the last assistant reply) and the reference answer (that
reply), as training on completions splits them (``worker.token_cache.prompt_completion``).

Two metrics read other shapes, as the methods they judge train on them (``data.preference``):
``preference_accuracy`` reads preference pairs (prompt/chosen/rejected, as DPO reads them; the reference is the
chosen answer), and ``reward`` reads prompts (as GRPO reads them: a prompt column, or chat rows whose last
assistant turn becomes the ``answer`` column; every other column reaches the reward functions by name).

Also the two keys of the cached base-model baseline: a fingerprint of the test data and a hash of the
settings that change scores. No ML stack: the dashboard validates and keys evals with these.

Kept whole: test rows read into prompts and references for every eval kind, with the baseline keys that must hash
exactly what the worker reads.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainer_core.config import TrainConfig, hub_dataset_problem
from trainer_core.data import DatasetError, images, loading, preference, tool_calls
from trainer_core.data.fingerprint import data_fingerprint
from trainer_core.data.formats import NormalizedData
from trainer_core.methods import grpo
from trainer_core.evaluation import tool_scoring
from trainer_core.protocol import paths
from trainer_core.rewards import files

if TYPE_CHECKING:
    from trainer_core.evaluation.spec import EvalSpec

EVAL_SPLIT_PREFIX = "eval_split:"  # data "eval_split:<run id>": that run's own held-out rows
HUB_PREFIX = "hub:"  # data "hub:<dataset id>": a split of a Hugging Face hub dataset (online)
NO_REFERENCE = "no assistant reply after a prompt (nothing to compare an answer with)"
PAIRS_METRIC = "preference_accuracy"  # needs preference pairs
REWARD_METRIC = "reward"  # scores generated answers with a GRPO run's reward functions
RETRIEVAL_METRIC = "retrieval"  # an embedding model's retrieval scores (evaluation/retrieval.py), alone
TOOL_METRIC = tool_scoring.METRIC  # the first reply's tool calls (evaluation/tool_scoring.py)
REFERENCE_METRICS = ("exact", "rouge", "bleu", "perplexity", "judge")  # compare with a reference answer
GENERATION_METRICS = ("exact", "rouge", "bleu", "judge", "reward", TOOL_METRIC)  # score the model's own answers
SHAPE_METHOD = {"pairs": "dpo", "prompts": "grpo"}  # the method whose loader reads that shape


@dataclass(frozen=True)
class Sample:
    index: int
    prompt: list[dict]  # chat turns, up to (not including) the reference answer
    reference: str  # "" when the row has none (a prompts row without an answer column)
    chosen: list[dict] | None = None  # preference pairs: each side's answer turns
    rejected: list[dict] | None = None
    columns: dict = field(default_factory=dict)  # prompts rows: the other columns, for the reward functions
    # image rows (data.images' one vision shape): the prompt's turns hold {"type": "image"} parts filled from these
    # paths in order (resolved and checked under the allowed roots by the loader, as for training), or bytes
    images: tuple = ()
    # metric tool_calls: the row's tools (JSON text of OpenAI tools, "" for none) and the calls the reference reply
    # makes, as (name, arguments) pairs (none: the right answer calls nothing)
    tools: str = ""
    calls: tuple = ()


def data_shape(metrics: list) -> str:
    """How the test rows are read: 'pairs' for preference_accuracy, 'prompts' for reward, else 'chat'."""
    if PAIRS_METRIC in metrics:
        return "pairs"
    if REWARD_METRIC in metrics:
        return "prompts"
    return "chat"


def data_kind(data: str) -> str:
    """'eval_split', 'hub' or 'file'."""
    if data.startswith(EVAL_SPLIT_PREFIX):
        return "eval_split"
    if data.startswith(HUB_PREFIX):
        return "hub"
    return "file"


def data_config(spec: "EvalSpec") -> TrainConfig:
    """The TrainConfig whose data fields read ``spec.data`` with the spec's format settings."""
    shape = data_shape(spec.metrics) if isinstance(spec.metrics, list) else "chat"
    # The source's model: image rows are checked against it as training checks them (a text model cannot read
    # them); max_seq_length is training's cut, not the eval's (the worker fits prompts to the model's context).
    base = dataclasses.replace(TrainConfig(), model_name=_base_model(spec), max_seq_length=1_000_000,
                               format_type=spec.format_type,
                               custom_format_mapping=dict(spec.custom_format_mapping), system_prompt=spec.system_prompt,
                               local_datasets=[], local_eval_datasets=[], eval_fraction=0.0,
                               method=SHAPE_METHOD.get(shape, TrainConfig().method))
    if data_kind(spec.data) == "hub":
        return dataclasses.replace(base, hf_dataset=spec.data[len(HUB_PREFIX):].strip(), subset=spec.hub_subset,
                                   train_split=spec.hub_split, eval_split="")
    return dataclasses.replace(base, local_datasets=[spec.data])


def _base_model(spec: "EvalSpec") -> str:
    from trainer_core.specs import model_source

    try:
        return model_source.resolve(spec.source).base_model or TrainConfig().model_name
    except model_source.SourceError:
        return TrainConfig().model_name  # JobSpec.validate names the missing source


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
    from trainer_core.specs import model_source

    kind = data_kind(spec.data)
    if kind == "eval_split":
        run_id = split_run(spec.data)
        try:
            cfg = model_source.run_config(run_id)
        except model_source.SourceError as exc:
            raise DatasetError("data", str(exc)) from None
        rows = _renamed(lambda: loading.load_for_training(cfg)).eval_rows
        if not rows:
            raise DatasetError("data", f"run {run_id} has no eval split (no eval files and eval_fraction 0): "
                                       "give a test file instead")
        shape = data_shape(spec.metrics)
        if shape == "chat" and "messages" not in rows[0] and "prompt" in rows[0]:  # a preference or GRPO run's rows:
            shape = "pairs" if "chosen" in rows[0] else "prompts"  # the chosen answer / answer column is the reference
        if shape != "chat":  # the run's rows are in its own method's shape (and carry its mapping and system prompt)
            return _shaped(lambda: preference.normalize(rows, shape, None, "", field_name="data"), shape)
        shown = images.FORMAT if "images" in rows[0] else "chatml" if "messages" in rows[0] else "text"
        return NormalizedData(format=shown,
                              reason=f"the eval split of run {run_id}", rows=rows)
    cfg = data_config(spec)
    shape = data_shape(spec.metrics)
    if kind == "hub":
        problem = hub_problem(spec.data)  # again in the worker: its working folder is where a local name would be read
        if problem:
            raise DatasetError("data", problem)

    def read(config: TrainConfig) -> NormalizedData:
        if kind == "hub":
            return loading.load_hub(config, spec.hub_split, apply_slice=False)
        return loading.load_local([spec.data], config, field_name="data", apply_slice=False)

    if shape == "prompts":  # GRPO's own prompt rows; chat or instruction rows (alpaca...) become prompts too
        try:
            return _renamed(lambda: read(cfg))
        except DatasetError as exc:
            if exc.field not in ("format_type", "custom_format_mapping"):
                raise
            chat = _renamed(lambda: read(dataclasses.replace(cfg, method=TrainConfig().method)))
            if not chat.is_chat:
                raise DatasetError("data", f"reward needs prompts ({preference.SHAPES['prompts']}): {exc.message}") \
                    from None
            return _shaped(lambda: preference.normalize(chat.rows, shape, None, "", field_name="data"), shape)
    return _shaped(lambda: _renamed(lambda: read(cfg)), shape)


def _shaped(read, shape: str) -> NormalizedData:
    """Rows in a preference shape; a shape that does not fit names ``data``, the metric and the columns it needs."""
    try:
        return read()
    except DatasetError as exc:
        if exc.field != "format_type" or shape == "chat":
            raise
        metric = PAIRS_METRIC if shape == "pairs" else REWARD_METRIC
        raise DatasetError("data", f"{metric} needs {'preference pairs' if shape == 'pairs' else 'prompts'}: "
                                   f"{preference.SHAPES[shape]} ({exc.message})") from None


def _renamed(read, also: tuple[str, ...] = ()):
    """``read()``, with the loader's data fields (and ``also``) named ``data``, the eval spec's one data field."""
    try:
        return read()
    except DatasetError as exc:
        field = "data" if exc.field in ("local_datasets", "hf_dataset", "train_split", *also) else \
            "source" if exc.field == "model_name" else exc.field  # image rows and a text model
        raise DatasetError(field, exc.message) from None


def to_samples(data: NormalizedData, max_samples: int = 0, needs_reference: bool = True,
               first_reply: bool = False) -> tuple[list[Sample], int]:
    """(samples, rows left out for having no reference answer); DatasetError when none is left. ``first_reply``
    (metric tool_calls): each conversation up to its first assistant reply, with its tools."""
    if data.format in ("pairs", "prompts"):
        return _preference_samples(data, max_samples, needs_reference)
    if data.format == images.FORMAT:
        return _image_samples(data, max_samples)
    if not data.is_chat:
        raise DatasetError("data", f"raw text has no reference answers ({data.reason}): evaluate on chat or "
                                   "instruction data (alpaca instruction/output, chatml messages or sharegpt "
                                   "conversations ending in an assistant reply)")
    if first_reply:
        return _tool_samples(data, max_samples)
    samples: list[Sample] = []
    skipped = 0
    for row in data.rows:
        messages = row["messages"]
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None or last == 0 or not messages[last]["content"].strip():
            skipped += 1
            continue
        samples.append(Sample(len(samples), messages[:last], messages[last]["content"], tools=_tools_text(row)))
        if max_samples and len(samples) >= max_samples:
            break
    if not samples:
        raise DatasetError("data", f"none of the {len(data.rows):,} rows has a prompt followed by an assistant "
                                   "reply to compare with: every test row needs a question and its reference answer")
    return samples, skipped


def _tools_text(row: dict) -> str:
    """A row's tools as JSON text ("" for none): the model is shown them, and so is the judge."""
    tools = row.get("tools") or ""
    return tools if isinstance(tools, str) else json.dumps(tools)


def _tool_samples(data: NormalizedData, max_samples: int) -> tuple[list[Sample], int]:
    """Held-out tool questions: the turns before each row's first assistant reply, the row's tools, and that
    reply's calls (the reference text: its words and calls as the Hermes template writes them)."""
    samples: list[Sample] = []
    skipped = 0
    for row in data.rows:
        case = tool_calls.first_reply_case(row)
        if case is None or not case[0]:
            skipped += 1
            continue
        prompt, calls = case
        reply = row["messages"][len(prompt)]
        samples.append(Sample(len(samples), prompt, tool_scoring.reference_text(reply.get("content"), calls),
                              tools=_tools_text(row), calls=tuple(calls)))
        if max_samples and len(samples) >= max_samples:
            break
    if not samples:
        raise DatasetError("data", f"none of the {len(data.rows):,} rows has a question followed by an assistant "
                                   "reply: every test row needs a user turn and the assistant's reply (its tool calls, "
                                   "or its answer when no tool is needed)")
    return samples, skipped


def part_text(content) -> str:
    """A turn's text: the string itself, or its text parts joined (image parts shown as <image>)."""
    if isinstance(content, str):
        return content
    return " ".join(images.PLACEHOLDER if part.get("type") == "image" else str(part.get("text", ""))
                    for part in content if isinstance(part, dict)).strip()


def _image_samples(data: NormalizedData, max_samples: int) -> tuple[list[Sample], int]:
    """Image rows: the turns before the last assistant reply (with their image parts) and their images, that
    reply's text as the reference."""
    samples: list[Sample] = []
    skipped = 0
    for row in data.rows:
        messages = row["messages"]
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        reference = part_text(messages[last]["content"]) if last else ""
        if not last or not reference.strip():
            skipped += 1
            continue
        prompt = messages[:last]
        shown = sum(1 for m in prompt for p in m["content"] if isinstance(p, dict) and p.get("type") == "image")
        samples.append(Sample(len(samples), prompt, reference, images=tuple(row["images"][:shown])))
        if max_samples and len(samples) >= max_samples:
            break
    if not samples:
        raise DatasetError("data", f"none of the {len(data.rows):,} image rows has a question followed by an "
                                   "assistant reply to compare with: every test row needs an image, a question and "
                                   "its reference answer")
    return samples, skipped


def _turns(value, role: str) -> list[dict]:
    """A text prompt or answer as one chat turn (as the preference trainers do for a model with a chat template)."""
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def _text(turns: list[dict]) -> str:
    return "".join(turn["content"] for turn in turns if turn["role"] == "assistant")


def _preference_samples(data: NormalizedData, max_samples: int, needs_reference: bool) -> tuple[list[Sample], int]:
    """Pairs: the prompt, each side's answer turns, and the chosen answer as the reference. Prompts: the prompt,
    the ``answer`` column as the reference (when it is text), every other column kept for the rewards."""
    samples: list[Sample] = []
    skipped = 0
    for row in data.rows:
        prompt = _turns(row["prompt"], "user")
        if data.format == "pairs":
            chosen, rejected = _turns(row["chosen"], "assistant"), _turns(row["rejected"], "assistant")
            samples.append(Sample(len(samples), prompt, _text(chosen), chosen=chosen, rejected=rejected))
        else:
            answer = row.get("answer")
            reference = answer if isinstance(answer, str) else ""
            if needs_reference and not reference.strip():
                skipped += 1
                continue
            columns = {k: v for k, v in row.items() if k != "prompt"}
            samples.append(Sample(len(samples), prompt, reference, columns=columns))
        if max_samples and len(samples) >= max_samples:
            break
    if not samples:
        raise DatasetError("data", f"none of the {len(data.rows):,} prompts has an answer column to compare with: "
                                   f"drop {', '.join(REFERENCE_METRICS)} from metrics, or add an answer column")
    return samples, skipped


def load_samples(spec: "EvalSpec") -> tuple[list[Sample], str | None]:
    """(samples, one warning naming every row left out and why, or None)."""
    data = load_rows(spec)
    samples, skipped = to_samples(data, spec.max_samples, any(m in REFERENCE_METRICS for m in spec.metrics),
                                  first_reply=TOOL_METRIC in spec.metrics)
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
    from trainer_core.specs import model_source
    from trainer_core.evaluation import retrieval

    if retrieval.wanted(spec):  # the retrieval set itself, however it was given
        return retrieval.fingerprint(spec)
    from trainer_core.evaluation import speech

    if speech.wanted(spec):  # every clip's bytes and transcript
        return speech.fingerprint(spec)
    if data_kind(spec.data) == "eval_split":
        run_id = split_run(spec.data)
        try:
            cfg = model_source.run_config(run_id)
        except model_source.SourceError as exc:
            raise DatasetError("data", str(exc)) from None
        digest = f"eval_split|{data_fingerprint(cfg)}|{cfg.eval_fraction}|{cfg.random_seed}"
        from trainer_core.evaluation import vision

        return vision.with_images(spec, hashlib.sha256(digest.encode()).hexdigest()[:32])
    try:
        digest = data_fingerprint(data_config(spec))
    except DatasetError as exc:
        raise DatasetError("data", exc.message) from None
    from trainer_core.evaluation import vision

    return vision.with_images(spec, digest)  # image rows: every image's bytes too (a file names them, not holds them)


# Fields that change what an eval measures: two evals agree on all of them, and on the data, to be compared.
SCORED_FIELDS = ("format_type", "custom_format_mapping", "system_prompt", "metrics", "max_samples", "temperature",
                 "top_p", "top_k", "max_new_tokens", "repetition_penalty", "seed", "judge_model", "judge_rubric",
                 "lm_eval_tasks", "lm_eval_limit", "hub_split", "hub_subset")


def settings_hash(spec: "EvalSpec") -> str:
    values = {name: getattr(spec, name) for name in SCORED_FIELDS}
    values["metrics"] = sorted(values["metrics"])
    if RETRIEVAL_METRIC in spec.metrics:  # an embedding model's prompts and text length change its scores
        values.update(query_prompt=spec.query_prompt, document_prompt=spec.document_prompt,
                      max_seq_length=spec.max_seq_length)
    if spec.image_max_side:  # the size the images are seen at changes what a vision model answers
        values["image_max_side"] = spec.image_max_side
    if REWARD_METRIC in spec.metrics:  # the rewards that score, not the run that holds them: runs may share a baseline
        values["rewards"] = reward_identity(spec.reward_run or spec.source.run_id or "")
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:24]


def reward_identity(run_id: str) -> list:
    """What the ``reward`` metric of an eval scores with: the GRPO run's reward settings and, for a Python
    reward, the sha256 of the copy in its run folder (an edited file is another reward)."""
    from trainer_core.specs import model_source

    try:
        cfg = model_source.run_config(run_id)
    except model_source.SourceError:
        return [run_id]
    if cfg.method != "grpo":
        return [run_id]
    try:
        manifest = {row["name"]: row["sha256"]
                    for row in json.loads((files.folder(paths.run_dir(run_id)) / files.MANIFEST).read_text())}
    except (OSError, ValueError, KeyError, TypeError):
        manifest = {}
    return [{**spec.to_dict(), "sha256": manifest.get(spec.name, "")} for spec in grpo.rewards_of(cfg)]
