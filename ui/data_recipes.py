"""The Data page's parts that are not widgets: the recipe form's fields to a RecipeSpec, a recipe job's progress as
people read it, the tables of preview rows, set-aside rows and published datasets, and a dataset's lineage (the runs
trained on it). Reads run folders and the database; imports no ML stack and no Data Designer."""
from __future__ import annotations

import json
import time
from itertools import islice
from pathlib import Path

import pandas as pd
import yaml

from trainer_core.config import BUNDLED_MODEL
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind
from trainer_core.recipes import starters, store
from trainer_core.specs.model_source import ModelSource

EDITABLE = ("recipe", "validators", "output", "dedupe_columns")  # what the YAML box holds
ROWS_SHOWN = 50


def starter_yaml(name: str) -> str:
    """The parts of a starter a person edits as text: Data Designer's config, the checks and the row template."""
    fields = starters.spec_fields(name)
    return yaml.safe_dump({k: fields[k] for k in EDITABLE if k in fields}, sort_keys=False, allow_unicode=True,
                          width=110)


def teacher_choices(runs: list) -> dict[str, str]:
    """Model source key -> label: the bundled model and each completed or stopped training run."""
    choices = {ModelSource(model=BUNDLED_MODEL).key: "Bundled SmolLM2-135M-Instruct"}
    for run in runs:
        choices[ModelSource(run_id=run.id).key] = f"{run.name or run.id} ({run.model})"
    return choices


def spec_fields(starter: str, edited: str, form: dict) -> tuple[dict, str | None]:
    """(RecipeSpec fields, problem): the starter's, the edited YAML over them, the form's values over those."""
    fields = starters.spec_fields(starter)
    try:
        text = yaml.safe_load(edited) if edited.strip() else {}
    except yaml.YAMLError as exc:
        return fields, f"Recipe (YAML): {exc}"
    if not isinstance(text, dict):
        return fields, "Recipe (YAML): a mapping of recipe, validators, output and dedupe_columns"
    unknown = sorted(set(text) - set(EDITABLE))
    if unknown:
        return fields, f"Recipe (YAML): {unknown[0]!r} is set by the form, not here (here: {', '.join(EDITABLE)})"
    fields.update(text)
    fields.update({k: v for k, v in form.items() if v is not None})
    return fields, None


def recipe_jobs(store_, limit: int = 50) -> list:
    return [r for r in store_.list_runs(limit=500) if r.kind is JobKind.RECIPE][:limit]


def progress_text(run) -> str:
    tally = store.counts(paths.run_dir(run.id))
    text = f"{tally.made}/{run.total_steps or '?'} records · {tally.kept} kept · {tally.rejected} set aside"
    if tally.by_reason:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(tally.by_reason.items())) + ")"
    return text


def rate_text(snap, now: float | None = None) -> str:
    """A running recipe's pace from its live state: records per second (its progress events' own figure, else the
    records made since it started), the teacher's output tokens per second, the ETA."""
    if snap is None:
        return ""
    frame = snap.metrics
    rows = frame["rows_per_s"].dropna() if frame is not None and "rows_per_s" in frame else []
    rate = float(rows.iloc[-1]) if len(rows) else None
    if rate is None and snap.started_at and snap.step:
        rate = snap.step / max(1e-6, (now or time.time()) - snap.started_at)
    parts = [f"{rate:.2f} records/s"] if rate else []
    if snap.tokens_per_s:
        parts.append(f"{snap.tokens_per_s:,.0f} teacher tokens/s")
    if snap.eta_s is not None:
        parts.append(f"ETA {snap.eta_s:.0f} s")
    return " · ".join(parts)


def usage(run) -> dict:
    try:
        return json.loads((paths.run_dir(run.id) / "usage.json").read_text())
    except (OSError, ValueError):
        return {}


def preview_frame(result: dict) -> pd.DataFrame:
    rows = []
    for shown in result["rows"]:
        row = shown["row"] if shown["row"] is not None else shown["record"]
        rows.append({"verdict": "kept" if shown["row"] is not None else "set aside",
                     "reason": shown["reason"] or "",
                     "source": ", ".join(f"{k} {v}" for k, v in shown["source"].items() if v is not None),
                     "scores": ", ".join(f"{k} {v:g}" for k, v in shown["scores"].items()),
                     "row": json.dumps(row, ensure_ascii=False)[:2000]})
    return pd.DataFrame(rows)


def rows_frame(path: Path, limit: int = ROWS_SHOWN) -> pd.DataFrame:
    """The first rows of a JSONL file, each shown as its JSON text (nested values stay readable)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in islice(fh, limit):
                data = json.loads(line)
                if "reason" in data and "record" in data:
                    rows.append({"reason": data["reason"], "record": json.dumps(data["record"], ensure_ascii=False)[:2000]})
                else:
                    where = data.pop("provenance", None) or {}
                    rows.append({"row": json.dumps(data, ensure_ascii=False)[:2000],
                                 "source": ", ".join(f"{k} {v}" for k, v in where.items() if v is not None
                                                     and k != "scores")})
    except (OSError, ValueError):
        pass
    return pd.DataFrame(rows)


def datasets_frame(versions: list[store.DatasetVersion]) -> pd.DataFrame:
    return pd.DataFrame([{"dataset": f"{v.name}@v{v.version}", "rows": v.card.get("kept"), "made": v.card.get("made"),
                          "set aside": v.card.get("rejected"), "starter": v.card.get("starter") or "custom",
                          "models": ", ".join(m.get("label", "") for m in v.card.get("models", [])),
                          "job": v.card.get("job_id"), "stopped early": bool(v.card.get("stopped")),
                          "path for New run": v.ref} for v in versions])


def runs_trained_on(store_, version: store.DatasetVersion) -> list:
    """Training runs whose data is this dataset version (History shows it as name@vN: TrainConfig.dataset_label)."""
    label = f"{version.name}@v{version.version}"
    return [r for r in store_.list_runs(limit=500, search=label, kinds=[JobKind.TRAIN.value])
            if label in (r.dataset or "").split(", ")]


def lineage(config: dict) -> list[str]:
    """For Run details: the recipe behind each recipe dataset a training run's config names (its job, starter and
    teachers), as Markdown lines."""
    lines = []
    for entry in config.get("local_datasets") or []:
        version = store.of_path(entry) if isinstance(entry, str) else None
        if version is None:
            continue
        card = version.card
        teachers = ", ".join(m.get("label", "") for m in card.get("models", [])) or "none"
        lines.append(f"Data: {version.name}@v{version.version}, made by the recipe job {card.get('job_id', '?')} "
                     f"({card.get('starter') or 'custom recipe'}; teacher: {teachers}; {card.get('kept', '?')} rows "
                     f"kept of {card.get('made', '?')})")
    return lines


def published_by(job_id: str) -> list[store.DatasetVersion]:
    """The dataset versions a recipe job published."""
    return [v for v in store.published() if v.card.get("job_id") == job_id]
