"""Votes out as training data: DPO pairs (``prompt``/``chosen``/``rejected``) or KTO rows (``prompt``/``completion``/
``label``), conversational (message lists, so multi-turn conversations and system prompts survive), written as a new
version of a JSONL file under ``<data root>/datasets/feedback/`` with its lineage (the vote ids, who exported it, the
filters) in ``cards/`` beside it. The studio's data loader reads these files as the pairs and kto shapes.

What becomes a row, from each person's newest vote on each set of answers:
* DPO: a pair where people picked one answer (A or B; conflicts left out, ties and both-bad have no winner), and
  every edit (the edit chosen, the original rejected). Thumbs have no second answer and are left out.
* KTO: thumbs (👍 true, 👎 false), a pair's winner true and loser false, both-bad both false, an edit's edit true and
  its original false; conflicting votes left out, ties too.
"""
from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from db.feedback_store import VoteRecord
from trainer_core.feedback import agreement
from trainer_core.feedback.votes import (A_BETTER, B_BETTER, BOTH_BAD, EDIT, PAIR, SINGLE, TIE, UP, FeedbackError,
                                         canonical_label)
from trainer_core.protocol import paths

FORMATS = {"dpo": "DPO pairs (prompt, chosen, rejected)", "kto": "KTO rows (prompt, completion, label)"}
FOLDER = "feedback"
_NAME_RE = re.compile(r"feedback-(dpo|kto)-v(\d{1,6})\.jsonl")


@dataclass(frozen=True)
class Rows:
    """What an export would write: the rows, the votes they come from, and what was left out and why."""

    rows: list[dict]
    vote_ids: list[str]
    left_out: Counter = field(default_factory=Counter)  # reason -> votes


@dataclass(frozen=True)
class Exported:
    path: Path
    card: Path
    version: int
    rows: int
    vote_ids: list[str]
    left_out: dict


def _assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _ordered(vote: VoteRecord) -> tuple[str, str]:
    """The vote's two answers in canonical order (the order canonical_label speaks of)."""
    return (vote.answer_a, vote.answer_b) if vote.answer_a <= vote.answer_b else (vote.answer_b, vote.answer_a)


def _groups(votes: list[VoteRecord]) -> list[list[VoteRecord]]:
    return list(agreement.by_answers(votes).values())


def dpo_rows(votes: list[VoteRecord]) -> Rows:
    rows, ids, left_out = [], [], Counter()
    for group in _groups(votes):
        kind = group[0].kind
        if kind == SINGLE:
            left_out["thumbs (no second answer to pair with)"] += len(group)
            continue
        if kind == EDIT:
            for vote in group:
                if not vote.answer_a.strip():
                    left_out["edit of an empty answer"] += 1
                    continue
                rows.append({"prompt": vote.messages, "chosen": _assistant(vote.answer_b),
                             "rejected": _assistant(vote.answer_a)})
                ids.append(vote.id)
            continue
        labels = {canonical_label(v) for v in group}
        if {A_BETTER, B_BETTER} <= labels:
            left_out["conflicting votes (people picked opposite answers)"] += len(group)
            continue
        winners = labels & {A_BETTER, B_BETTER}
        if not winners:
            left_out["ties and both-bad (no better answer)"] += len(group)
            continue
        first, second = _ordered(group[0])
        chosen, rejected = (first, second) if winners == {A_BETTER} else (second, first)
        if not chosen.strip() or not rejected.strip():
            left_out["an empty answer"] += len(group)
            continue
        rows.append({"prompt": group[0].messages, "chosen": _assistant(chosen), "rejected": _assistant(rejected)})
        ids += [v.id for v in group if canonical_label(v) in winners]
        left_out["ties and both-bad beside a winner"] += sum(canonical_label(v) not in winners for v in group)
    return Rows(rows, ids, +left_out)


def kto_rows(votes: list[VoteRecord]) -> Rows:
    rows, ids, left_out = [], [], Counter()
    seen: set[str] = set()

    def add(vote: VoteRecord, text: str, label: bool) -> None:
        if not text.strip():
            left_out["an empty answer"] += 1
            return
        row = {"prompt": vote.messages, "completion": _assistant(text), "label": label}
        key = json.dumps(row, sort_keys=True, ensure_ascii=False)
        if key not in seen:
            seen.add(key)
            rows.append(row)
        ids.append(vote.id)

    for group in _groups(votes):
        kind = group[0].kind
        labels = {canonical_label(v) for v in group}
        if kind in (PAIR, SINGLE) and any(opposite <= labels for opposite in agreement.OPPOSITE):
            left_out["conflicting votes (people picked opposite answers)"] += len(group)
            continue
        for vote in group:
            label = canonical_label(vote)
            if kind == SINGLE:
                add(vote, vote.answer_a, label == UP)
            elif kind == EDIT:
                add(vote, vote.answer_b, True)
                add(vote, vote.answer_a, False)
            elif label == TIE:
                left_out["ties"] += 1
            else:
                first, second = _ordered(vote)
                if label == BOTH_BAD:
                    add(vote, first, False)
                    add(vote, second, False)
                else:
                    winner, loser = (first, second) if label == A_BETTER else (second, first)
                    add(vote, winner, True)
                    add(vote, loser, False)
    return Rows(rows, list(dict.fromkeys(ids)), +left_out)


BUILDERS = {"dpo": dpo_rows, "kto": kto_rows}


def folder() -> Path:
    path = paths.datasets_dir() / FOLDER
    (path / "cards").mkdir(parents=True, exist_ok=True)
    return path


def versions(fmt: str) -> list[int]:
    """The versions of ``fmt`` already exported, oldest first."""
    found = (_NAME_RE.fullmatch(p.name) for p in folder().iterdir())
    return sorted(int(m.group(2)) for m in found if m and m.group(1) == fmt)


def write(fmt: str, votes: list[VoteRecord], by: str, filters: dict | None = None) -> Exported:
    """Write the next version of the ``fmt`` dataset from ``votes`` (already filtered; withdrawn ones never reach
    here) and its card. FeedbackError when no vote makes a row."""
    if fmt not in BUILDERS:
        raise FeedbackError(f"unknown export format {fmt!r}: use {' or '.join(FORMATS)}")
    built = BUILDERS[fmt](votes)
    if not built.rows:
        why = "; ".join(f"{n} {reason}" for reason, n in built.left_out.items()) or "no votes"
        raise FeedbackError(f"no vote makes a {fmt.upper()} row ({why}): vote on side-by-side answers, or edit one")
    target = folder()
    version = (versions(fmt) or [0])[-1] + 1
    while True:  # "x": two exports at once never take the same version
        path = target / f"feedback-{fmt}-v{version}.jsonl"
        try:
            handle = open(path, "x", encoding="utf-8")
        except FileExistsError:
            version += 1
            continue
        break
    with handle:
        for row in built.rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    card = target / "cards" / f"feedback-{fmt}-v{version}.json"
    card.write_text(json.dumps({"format": fmt, "version": version, "file": path.name, "rows": len(built.rows),
                                "exported_by": by, "exported_at": time.time(), "filters": filters or {},
                                "vote_ids": built.vote_ids, "left_out": dict(built.left_out)},
                               indent=2, ensure_ascii=False), encoding="utf-8")
    return Exported(path, card, version, len(built.rows), built.vote_ids, dict(built.left_out))


def lineage(path: Path) -> dict | None:
    """The card of an exported file (None for a file this module did not write, or whose card is gone)."""
    card = path.parent / "cards" / f"{path.stem}.json"
    try:
        return json.loads(card.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
