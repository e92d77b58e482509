"""A recipe job's rows on disk, and the dataset versions recipes publish.

In the job's folder, each batch Data Designer finishes becomes two files under ``rows/``: the records kept
(``batch_00003.kept.jsonl``: training rows) and those set aside with their reason (``.rejected.jsonl``). The kept file
is renamed into place last, so it marks the batch as done: a job killed at any point, resumed, redoes a batch it
had not finished and never one it had (no row lost, none doubled).

Published, a dataset is ``datasets/recipes/<name>/v<N>/``: ``data.jsonl`` (the kept rows), ``rejected.jsonl``,
``card.json`` (what made it: the recipe, its models, sources and counts by reason, the data's sha256) and a
``README.md`` for people. A version is never written twice: a new one is a new folder. Dashboard-safe.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from trainer_core.protocol import files, paths

ROWS_DIR = "rows"
KEPT, REJECTED = ".kept.jsonl", ".rejected.jsonl"
BATCH_RE = re.compile(r"^batch_(\d{5,})" + re.escape(KEPT) + "$")
DATA_FILE, REJECTED_FILE, CARD_FILE, README_FILE = "data.jsonl", "rejected.jsonl", "card.json", "README.md"
VERSION_RE = re.compile(r"^v(\d{1,6})$")
CARD_MAX = 4 << 20


def batch_name(index: int) -> str:
    return f"batch_{index:05d}"


def processed(run_dir: Path) -> list[int]:
    """The batches whose rows are written, in order."""
    folder = Path(run_dir) / ROWS_DIR
    found = [int(m.group(1)) for p in folder.glob(f"batch_*{KEPT}") if (m := BATCH_RE.match(p.name))] \
        if folder.is_dir() else []
    return sorted(found)


def write_batch(run_dir: Path, index: int, kept: list[dict], rejected: list[dict]) -> None:
    """Both files of a batch; the kept file last, by rename, so a batch is done only when both are whole."""
    folder = Path(run_dir) / ROWS_DIR
    folder.mkdir(exist_ok=True)
    for suffix, rows in ((REJECTED, rejected), (KEPT, kept)):
        final = folder / (batch_name(index) + suffix)
        tmp = final.with_name(f".{final.name}.{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)


def _read_jsonl(path: Path) -> Iterator[dict]:
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)
    except FileNotFoundError:
        return


def kept_rows(run_dir: Path) -> Iterator[dict]:
    for index in processed(run_dir):
        yield from _read_jsonl(Path(run_dir) / ROWS_DIR / (batch_name(index) + KEPT))


def rejected_rows(run_dir: Path) -> Iterator[dict]:
    for index in processed(run_dir):
        yield from _read_jsonl(Path(run_dir) / ROWS_DIR / (batch_name(index) + REJECTED))


REPEATS = ("exact duplicate", "near duplicate")


def reason_kind(reason: str) -> str:
    """The group a reason is counted in: a repeat's kind ("exact duplicate"), else what comes before the reason's
    first colon ("length on qa.answer", "teacher", "output")."""
    repeat = next((kind for kind in REPEATS if reason.startswith(kind)), None)
    head = repeat or reason.split(":", 1)[0].strip()
    return head[:60] or "other"


@dataclass
class Counts:
    made: int = 0
    kept: int = 0
    rejected: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        out = {"kept": float(self.kept), "rejected": float(self.rejected)}
        out.update({f"rejected/{k}": float(v) for k, v in sorted(self.by_reason.items())[:20]})
        return out


def counts(run_dir: Path) -> Counts:
    kept = sum(1 for _ in kept_rows(run_dir))
    reasons = Counter(reason_kind(str(r.get("reason", ""))) for r in rejected_rows(run_dir))
    rejected = sum(reasons.values())
    return Counts(made=kept + rejected, kept=kept, rejected=rejected, by_reason=dict(reasons))


# ---------------------------------------------------------------------- published datasets
def dataset_folder(name: str) -> Path:
    return paths.datasets_dir() / "recipes" / name


def versions(name: str) -> list[Path]:
    folder = dataset_folder(name)
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := VERSION_RE.match(p.name)) and p.is_dir()] \
        if folder.is_dir() else []
    return [p for _, p in sorted(found)]


def publish(run_dir: Path, name: str, card: dict[str, Any]) -> Path:
    """The job's kept rows as the next version of dataset ``name``, with its rejected rows and card."""
    folder = dataset_folder(name)
    folder.mkdir(parents=True, exist_ok=True)
    paths.resolve_inside(folder, [paths.datasets_dir() / "recipes"])  # a link out of the datasets folder: refused
    number = int(versions(name)[-1].name[1:]) + 1 if versions(name) else 1
    while True:  # another job publishing the same name at once takes the number first: take the next
        target = folder / f"v{number}"
        try:
            target.mkdir()
            break
        except FileExistsError:
            number += 1
    digest = hashlib.sha256()
    with open(target / DATA_FILE, "w", encoding="utf-8") as fh:
        for row in kept_rows(run_dir):
            line = (json.dumps(row, ensure_ascii=False) + "\n").encode()
            digest.update(line)
            fh.write(line.decode())
    with open(target / REJECTED_FILE, "w", encoding="utf-8") as fh:
        for row in rejected_rows(run_dir):
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tally = counts(run_dir)
    card = {**card, "dataset": name, "version": number, "path": str(target / DATA_FILE), "sha256": digest.hexdigest(),
            "made": tally.made, "kept": tally.kept, "rejected": tally.rejected, "rejected_by_reason": tally.by_reason,
            "published_at": time.time()}
    (target / CARD_FILE).write_text(json.dumps(card, indent=1, ensure_ascii=False))
    (target / README_FILE).write_text(readme(card))
    return target


def readme(card: dict[str, Any]) -> str:
    models = "\n".join(f"- `{m.get('alias')}`: {m.get('label')}" for m in card.get("models", []))
    reasons = "\n".join(f"- {k}: {v}" for k, v in sorted(card.get("rejected_by_reason", {}).items())) or "- none"
    source = card.get("documents") or card.get("seed_dataset") or card.get("seed_hub_dataset") or \
        "Data Designer's samplers"
    return (f"# {card.get('dataset')} v{card.get('version')}\n\n"
            f"Made by the data recipe job `{card.get('job_id')}`"
            f"{' from the starter ' + repr(card['starter']) if card.get('starter') else ''}"
            f"{' (stopped early)' if card.get('stopped') else ''}.\n\n"
            f"- rows made: {card.get('made')}, kept: {card.get('kept')}, set aside: {card.get('rejected')}\n"
            f"- seeded from: {source}\n- sha256 of data.jsonl: `{card.get('sha256')}`\n\n"
            f"## Models\n{models or '- none (samplers only)'}\n\n## Set aside, by reason\n{reasons}\n")


@dataclass(frozen=True)
class DatasetVersion:
    name: str
    version: int
    folder: Path
    card: dict

    @property
    def data_path(self) -> Path:
        return self.folder / DATA_FILE

    @property
    def ref(self) -> str:
        """How a run's config names it (relative to the datasets folder)."""
        return f"recipes/{self.name}/v{self.version}/{DATA_FILE}"


def read_card(folder: Path) -> dict:
    try:
        return json.loads(files.read_regular(Path(folder) / CARD_FILE, CARD_MAX))
    except (OSError, ValueError):
        return {}


def published() -> list[DatasetVersion]:
    """Every published recipe dataset version, newest first."""
    root = paths.datasets_dir() / "recipes"
    found = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        for version in versions(folder.name) if folder.is_dir() else []:
            if (version / DATA_FILE).is_file():
                found.append(DatasetVersion(folder.name, int(version.name[1:]), version, read_card(version)))
    return sorted(found, key=lambda d: d.card.get("published_at", 0), reverse=True)


def of_path(path: str | os.PathLike) -> DatasetVersion | None:
    """The recipe dataset version a dataset path (a run's local_datasets entry) is, or None."""
    text = str(path)
    candidate = Path(text) if Path(text).is_absolute() else paths.datasets_dir() / text
    try:
        resolved = candidate.resolve()
        relative = resolved.relative_to((paths.datasets_dir() / "recipes").resolve())
    except (OSError, ValueError):
        return None
    parts = relative.parts
    if len(parts) < 2 or not VERSION_RE.match(parts[1]):
        return None
    folder = paths.datasets_dir() / "recipes" / parts[0] / parts[1]
    return DatasetVersion(parts[0], int(parts[1][1:]), folder, read_card(folder)) if folder.is_dir() else None
