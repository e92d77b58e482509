"""Speech-to-text eval jobs (issue 22), dashboard side (no ML imports): the metrics ``wer`` and ``cer`` score a
speech model's transcripts of test clips against their reference transcripts, per clip and over the set (jiwer, in
the worker: worker/speech_eval.py), against the base model's cached baseline like every other metric.

Test data is read exactly as a speech run reads its data (trainer_core.data.audio: an audio column and a text
column, an audio folder with metadata, ``stt.columns``-style mapping through ``custom_format_mapping``; clip paths
checked under the allowed roots), or ``eval_split:<speech run>`` (that run's held-out clips). The baseline key is a
hash of every clip's bytes and transcript, so a changed clip is a new test set even when its file name is not.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_core.config import FieldError, TrainConfig
from trainer_core.data import DatasetError, loading
from trainer_core.evaluation import samples as eval_samples
from trainer_core.methods.stt import SttSettings

if TYPE_CHECKING:
    from trainer_core.evaluation.spec import EvalSpec

METRICS = ("wer", "cer")  # word / character error rate: lower is better
RESULT_KEYS = ("wer", "cer", "clips", "seconds")
EVAL_SPLIT_PREFIX = "eval_split:"


def wanted(spec: "EvalSpec") -> bool:
    return isinstance(spec.metrics, list) and any(m in METRICS for m in spec.metrics)


def is_speech_source(spec: "EvalSpec") -> bool | None:
    """Whether the spec's model transcribes (a run of method stt, or a Whisper-style base model); None when the
    source cannot be resolved (JobSpec.validate names why)."""
    from trainer_core.specs import model_source

    try:
        return set(METRICS) <= set(model_source.resolve(spec.source).kind.eval_metrics)
    except model_source.SourceError:
        return None


def source_errors(spec: "EvalSpec") -> list[FieldError]:
    """wer/cer only for a speech model, and a speech model only with wer/cer (it writes no chat answers)."""
    from trainer_core.specs import model_source

    speech = is_speech_source(spec)
    if speech is None or not model_source.resolve(spec.source).kind.eval_metrics:
        return []  # a kind no metric scores is refused for every eval by EvalSpec._output_errors, naming what fits
    others = [m for m in spec.metrics if m not in METRICS]
    errors = []
    unknown = model_source.resolve(spec.source).output_problem if wanted(spec) and not speech else ""
    if unknown:  # not "this model writes text": what it is could not be read at all
        errors.append(FieldError("source", f"cannot tell whether {spec.source.model} transcribes audio (wer and cer "
                                           f"need a speech-to-text model): {unknown}"))
    elif wanted(spec) and not speech:
        errors.append(FieldError("metrics", "wer and cer score a speech-to-text model's transcripts, and this model "
                                            "writes text: evaluate a run trained with method stt (or a Whisper base "
                                            "model), or drop wer/cer"))
    elif speech and others:
        errors.append(FieldError("metrics", f"a speech-to-text model is scored by its transcripts: {', '.join(others)} "
                                            "cannot score it; choose metrics [wer, cer]"))
    elif speech and not wanted(spec) and spec.metrics:
        errors.append(FieldError("metrics", "a speech-to-text model is scored by its transcripts: choose wer, cer"))
    if speech and spec.lm_eval_tasks:
        errors.append(FieldError("lm_eval_tasks", "benchmarks of lm-evaluation-harness score a language model; this "
                                                  "one transcribes audio: clear lm_eval_tasks"))
    return errors


def data_config(spec: "EvalSpec") -> TrainConfig:
    """The TrainConfig whose data fields read the test clips as a speech run of the source's model reads them."""
    from trainer_core.specs import model_source

    model = model_source.resolve(spec.source).base_model
    mapping = {k: v for k, v in dict(spec.custom_format_mapping).items() if k in ("audio", "text")}
    return dataclasses.replace(TrainConfig(), method="stt", adapter="full", model_name=model, local_datasets=[spec.data],
                               local_eval_datasets=[], eval_fraction=0.0, method_settings=SttSettings(columns=mapping))


def load_rows(spec: "EvalSpec") -> list[dict[str, Any]]:
    """The test clips as {audio, text} rows (DatasetError with field ``data`` names the fix), at most max_samples."""
    return load_clips(spec)[0]


def load_clips(spec: "EvalSpec") -> tuple[list[dict[str, Any]], str | None]:
    """(the test clips as {audio, text} rows, at most max_samples; a warning naming the clips left out and why:
    no transcript, unreadable, longer than the model's window), as a speech run reads its data."""
    from trainer_core.specs import model_source

    data = spec.data.strip()
    if data.startswith(EVAL_SPLIT_PREFIX):
        run_id = data[len(EVAL_SPLIT_PREFIX):].strip()
        try:
            cfg = model_source.run_config(run_id)
        except model_source.SourceError as exc:
            raise DatasetError("data", str(exc)) from None
        if cfg.method != "stt":
            raise DatasetError("data", f"run {run_id} is not a speech-to-text run: its eval split holds no clips")
        rows, left_out = _renamed(lambda: loading.load_for_training(cfg)).eval_rows, None
        if not rows:
            raise DatasetError("data", f"run {run_id} has no eval split (no eval files and eval_fraction 0): give a "
                                       "test file or audio folder instead")
    elif data.startswith("hub:"):
        raise DatasetError("data", "wer and cer read local test clips (a JSONL/CSV file with an audio and a text "
                                   "column, or an audio folder with metadata.jsonl): download the hub split first")
    else:
        read = _renamed(lambda: loading.load_local([data], data_config(spec), field_name="data", apply_slice=False))
        rows, left_out = read.rows, (read.drop_warning("test clips").replace("Dropped ", "Left out ", 1)
                                     if read.dropped else None)
    return (rows[:spec.max_samples] if spec.max_samples else rows), left_out


def _renamed(read):
    """samples' renaming, with a speech run's own data fields (its eval files, its column mapping) named ``data``."""
    return eval_samples._renamed(read, also=("local_eval_datasets", "stt.columns"))


def fingerprint(spec: "EvalSpec") -> str:
    """A hash of the test set itself (all of it, whatever max_samples): ``set_fingerprint`` of its rows."""
    return set_fingerprint(load_rows(dataclasses.replace(spec, max_samples=0)))


def set_fingerprint(rows: list[dict[str, Any]]) -> str:
    """Every clip's bytes and its reference transcript, in order."""
    digest = hashlib.sha256(b"speech-eval")
    for row in rows:
        digest.update(row["text"].encode() + b"\x00")
        digest.update(clip_bytes(row["audio"]))
    return digest.hexdigest()[:32]


def clip_bytes(clip: Any) -> bytes:
    if isinstance(clip, (bytes, bytearray)):
        return bytes(clip)
    if isinstance(clip, dict):
        return repr(sorted(clip.items())).encode()  # a decoded array: its values
    return Path(clip).read_bytes()


def clip_name(clip: Any, index: int) -> str:
    """How a clip is named in a sample row: its file name, or its position for bytes."""
    return Path(clip).name if isinstance(clip, str) else f"clip {index + 1}"

