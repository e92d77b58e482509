"""A hash of the data a run reads, so Resume refuses when the training data changed since the run loaded it.

The dashboard takes it when a run is submitted and again when a queued run's turn comes (``CHECKED_FILE`` in the
run folder keeps it); the worker takes it of what it loaded (``load_with_fingerprint``), reports it in a ``data``
event whose value becomes the run's recorded fingerprint, and warns when it differs from the checked one.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer_core.config import TrainConfig
from trainer_core.data import DatasetError, loading
from trainer_core.data.sources import resolve_source, source_files

CHECKED_FILE = "data-fingerprint.json"  # in a run folder: the fingerprint the dashboard checked, and its row count
LOAD_TRIES = 3


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    rows: int  # rows read from the training files (before the slice; 0 for a hub split, unknown until loaded)


def take(cfg: TrainConfig) -> Fingerprint:
    """The training and eval data's fingerprint: the bytes of the local files and of every image and clip their rows
    name (a recoloured picture under the same name is other data); the id, subset, split and slice for a hub dataset,
    whose content cannot be checked without downloading it. Text-only files hash as they always did."""
    digest = hashlib.sha256()
    rows = 0
    if cfg.hf_dataset:
        digest.update(f"hub:{cfg.hf_dataset}|{cfg.subset}|{cfg.train_split}|{cfg.eval_split}".encode())
    for field_name in ("local_datasets", "local_eval_datasets"):
        for source in getattr(cfg, field_name):
            for path in source_files(resolve_source(source, field_name), field_name):
                digest.update(f"{field_name}:{path.name}:".encode())
                _update_with_file(digest, path)
                file_rows = loading.read_file(path, cfg, field_name)
                rows += len(file_rows) if field_name == "local_datasets" else 0
                for ref in loading.media_refs(file_rows, cfg):
                    _update_with_media(digest, ref)
    digest.update(f"|slice:{cfg.dataset_slice_start}:{cfg.dataset_slice_end}".encode())
    return Fingerprint(digest.hexdigest()[:32], rows)


def data_fingerprint(cfg: TrainConfig) -> str:
    return take(cfg).digest


def load_with_fingerprint(cfg: TrainConfig) -> tuple[loading.TrainingData, Fingerprint]:
    """The rows a run trains on and the fingerprint of exactly the files they came from: taken before and after the
    load, and the load done again when a file changed in between (a swap during it would go unrecorded)."""
    for _ in range(LOAD_TRIES):
        before = take(cfg)
        data = loading.load_for_training(cfg)
        after = take(cfg)
        if after == before:
            return data, after
    raise DatasetError("local_datasets", f"the training files changed while they were read, {LOAD_TRIES} times: "
                                         "let whatever writes them finish, then start the run again")


def write_checked(run_dir: Path, fingerprint: Fingerprint) -> None:
    (run_dir / CHECKED_FILE).write_text(json.dumps(asdict(fingerprint)) + "\n")


def read_checked(run_dir: Path) -> Fingerprint | None:
    """The fingerprint the dashboard checked for this run (None when none was kept: a run from before)."""
    try:
        data = json.loads((run_dir / CHECKED_FILE).read_text())
        return Fingerprint(str(data["digest"]), int(data["rows"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _update_with_file(digest, path: Path) -> None:
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)


def _update_with_media(digest, ref) -> None:
    digest.update(b"|media:")
    if isinstance(ref, (bytes, bytearray)):
        digest.update(bytes(ref))
    elif isinstance(ref, str):
        try:
            _update_with_file(digest, Path(ref))
        except OSError as exc:
            raise DatasetError("local_datasets", f"cannot read {ref}: {exc.strerror or exc}") from None
    else:  # an image object or a decoded clip held in the row: its text form (rare: parquet holds bytes)
        digest.update(repr(ref).encode())


def change_warning(checked: Fingerprint | None, loaded: Fingerprint) -> str | None:
    """What the worker says when what it loaded is not what the dashboard checked (a file swapped or cut short
    meanwhile); None when they agree or nothing was checked."""
    if checked is None or checked.digest == loaded.digest:
        return None
    counts = f" ({checked.rows} rows then, {loaded.rows} now)" if checked.rows != loaded.rows else ""
    return (f"The training data changed after it was checked when the run was queued or started{counts}: this run "
            "trains on the data as loaded now, and Resume checks the files against that.")
