""""Train on this feedback": the New run config for an exported feedback dataset, starting from the voted run's model.

A run that trained full weights starts from them; a LoRA run from its merged export when it has one (Export's
``merged`` target), else from its base model, said in the note: a new run cannot continue an adapter (TrainConfig has
no field for it), so merging first is the way to start from the tuned weights."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from db.feedback_store import VoteRecord
from trainer_core.config import TrainConfig
from trainer_core.feedback import export
from trainer_core.feedback.votes import run_ids
from trainer_core.specs import model_source


def voted_run(votes: list[VoteRecord], vote_ids: list[str]) -> str | None:
    """The training run most of the exported votes judged (None when they judged base models only)."""
    wanted = set(vote_ids)
    counted = Counter(run for v in votes if v.id in wanted for run in run_ids(v))
    return counted.most_common(1)[0][0] if counted else None


def starting_point(run_id: str | None, artifacts: list[Any]) -> tuple[str, str]:
    """(model_name, why) for a new run continuing ``run_id``'s model; ``artifacts``: the run's export artifacts."""
    if run_id is None:
        return TrainConfig().model_name, "the bundled model: the votes judged base models only"
    try:
        cfg = model_source.run_config(run_id)
    except model_source.SourceError as exc:
        return TrainConfig().model_name, f"the bundled model: the voted run cannot be read ({exc})"
    name = cfg.run_name or run_id
    merged = sorted((a for a in artifacts if a.kind == "merged" and Path(a.path).is_dir()),
                    key=lambda a: a.created_at, reverse=True)
    if merged:
        return merged[0].path, f"the merged model of run '{name}' (exported {Path(merged[0].path).name})"
    folder = model_source.final_dir(run_id, cfg)
    if not cfg.effective_use_lora and model_source.has_weights(folder):
        return str(folder), f"the fully fine-tuned weights of run '{name}'"
    return cfg.model_name, (f"the base model of run '{name}': it trained a LoRA adapter, which a new run cannot "
                            "continue; export it merged (Run details, Export) to start from its tuned weights")


def train_config(exported: export.Exported, fmt: str, model_name: str) -> TrainConfig:
    """New run's config for the exported dataset: method ``fmt`` (dpo or kto), LoRA, the dataset, the model."""
    return TrainConfig(run_name=f"feedback {fmt} v{exported.version}", method=fmt, adapter="lora",
                       model_name=model_name, local_datasets=[str(exported.path)])
