"""A hash of the data a run reads: Resume refuses when the training files changed since the original run."""
from __future__ import annotations

import hashlib

from trainer_core.config import TrainConfig
from trainer_core.data.sources import resolve_source, source_files


def data_fingerprint(cfg: TrainConfig) -> str:
    """A hash of the training and eval data a run reads (file bytes for local files; the id, subset,
    split and slice for a hub dataset, whose content cannot be checked without downloading it)."""
    digest = hashlib.sha256()
    if cfg.hf_dataset:
        digest.update(f"hub:{cfg.hf_dataset}|{cfg.subset}|{cfg.train_split}|{cfg.eval_split}".encode())
    for field_name in ("local_datasets", "local_eval_datasets"):
        for source in getattr(cfg, field_name):
            for path in source_files(resolve_source(source, field_name), field_name):
                digest.update(f"{field_name}:{path.name}:".encode())
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
    digest.update(f"|slice:{cfg.dataset_slice_start}:{cfg.dataset_slice_end}".encode())
    return digest.hexdigest()[:32]
