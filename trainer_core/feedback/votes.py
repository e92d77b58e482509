"""What a vote is: its kinds and labels, the limits on what it carries, and the key that tells two people judged the
same answers. Everything a person typed or a model wrote is text: it is stored as given (a NUL, which PostgreSQL
refuses in text, becomes U+FFFD) and rendered escaped."""
from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from db.feedback_store import VoteRecord

PAIR, SINGLE, EDIT = "pair", "single", "edit"
A_BETTER, B_BETTER, TIE, BOTH_BAD = "a_better", "b_better", "tie", "both_bad"
UP, DOWN, EDITED = "up", "down", "edit"
LABELS = {PAIR: (A_BETTER, B_BETTER, TIE, BOTH_BAD), SINGLE: (UP, DOWN), EDIT: (EDITED,)}
LABEL_TEXT = {A_BETTER: "A is better", B_BETTER: "B is better", TIE: "Tie", BOTH_BAD: "Both bad", UP: "👍 Good",
              DOWN: "👎 Bad", EDITED: "✏️ Edited"}
ALL_LABELS = tuple(label for labels in LABELS.values() for label in labels)
FLIPPED = {A_BETTER: B_BETTER, B_BETTER: A_BETTER}
ANSWER_MAX = 100_000  # characters in one answer or edit (a Playground answer is bounded by its max new tokens)
CONVERSATION_MAX = 400_000  # characters in the whole conversation a vote keeps
ORIGINS = ("playground", "second opinion", "import", "served")


class FeedbackError(ValueError):
    """A vote, rating or export that cannot be taken: the message says why and what to do."""


@dataclass(frozen=True)
class Model:
    """Who wrote an answer: the Playground column's model source and what the voted run was trained with."""

    key: str  # jobspec.ModelSource.key: base:<model>, run:<id> or run:<id>@<step>
    label: str = ""
    run_id: str = ""
    checkpoint: int | None = None
    base_model: str = ""
    template: str = ""  # the tokenizer whose chat template the run trains with (its base model), and its system prompt
    system_prompt: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "run_id": self.run_id, "checkpoint": self.checkpoint,
                "base_model": self.base_model, "template": self.template, "system_prompt": self.system_prompt}


def clean(text: str) -> str:
    """Text as stored: a NUL (which PostgreSQL refuses in text) becomes U+FFFD; nothing else changes."""
    return text.replace("\x00", "\ufffd")


def pair_key(messages: list[dict], answers: list[str]) -> str:
    """The same conversation and the same answers (in any order): the same key, whoever votes."""
    body = json.dumps({"messages": messages, "answers": sorted(answers)}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def canonical_label(vote: VoteRecord) -> str:
    """A pair vote's label with the answers in a fixed order (sorted text), so two people who saw them in swapped
    columns agree when they picked the same answer; other labels as they are."""
    if vote.kind == PAIR and vote.answer_a > vote.answer_b:
        return FLIPPED.get(vote.label, vote.label)
    return vote.label


def _check_text(what: str, text: Any, limit: int = ANSWER_MAX, allow_empty: bool = True) -> str:
    if not isinstance(text, str):
        raise FeedbackError(f"{what} must be text, not {type(text).__name__}")
    if not allow_empty and not text.strip():
        raise FeedbackError(f"{what} is empty: write the better answer, or vote instead of editing")
    if len(text) > limit:
        raise FeedbackError(f"{what} has {len(text):,} characters; the limit is {limit:,}: shorten it")
    return clean(text)


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise FeedbackError("the conversation is empty: a vote judges answers to a message")
    out = []
    for turn in messages:
        if not isinstance(turn, dict) or turn.get("role") not in ("system", "user", "assistant") \
                or not isinstance(turn.get("content"), str):
            raise FeedbackError("the conversation must be a list of {role: system|user|assistant, content: text}")
        out.append({"role": turn["role"], "content": clean(turn["content"])})
    if out[-1]["role"] != "user":
        raise FeedbackError("the conversation must end with the user's message the answers reply to")
    if sum(len(t["content"]) for t in out) > CONVERSATION_MAX:
        raise FeedbackError(f"the conversation is longer than {CONVERSATION_MAX:,} characters: start a new one")
    return out


def build(voter: str, kind: str, label: str, messages: list[dict], answers: list[str], models: list[Model],
          sampling: dict | None = None, edited: str = "", origin: str = "playground",
          now: float | None = None, vote_id: str = "") -> VoteRecord:
    """A checked vote: ``answers`` holds two answers for a pair, one otherwise; ``edited`` the person's better version
    of the one answer (kind edit). FeedbackError names the problem."""
    if kind not in LABELS:
        raise FeedbackError(f"unknown vote kind {kind!r}: use one of {', '.join(LABELS)}")
    if label not in LABELS[kind]:
        raise FeedbackError(f"a {kind} vote's label is one of {', '.join(LABELS[kind])}, not {str(label)[:40]!r}")
    if origin not in ORIGINS:
        raise FeedbackError(f"unknown origin {origin!r}")
    expected = 2 if kind == PAIR else 1
    if len(answers) != expected or len(models) != expected:
        raise FeedbackError(f"a {kind} vote judges {expected} answer(s) with their model(s); got {len(answers)} "
                            f"answer(s) and {len(models)} model(s)")
    checked_messages = _check_messages(messages)
    checked = [_check_text(f"answer {'AB'[i]}", a) for i, a in enumerate(answers)]
    if kind == PAIR and checked[0] == checked[1]:
        raise FeedbackError("both answers are the same text: there is nothing to choose between")
    if kind == EDIT:
        edit = _check_text("the edit", edited, allow_empty=False)
        if edit == checked[0]:
            raise FeedbackError("the edit is the same as the answer: change it, or vote 👍 instead")
        checked.append(edit)
    elif edited:
        raise FeedbackError("only an edit vote carries an edited answer")
    key_answers = checked[:2] if kind == PAIR else checked[:1]
    return VoteRecord(
        id=vote_id or f"v-{secrets.token_hex(8)}", created_at=time.time() if now is None else now, voter=voter, kind=kind,
        label=label, messages=checked_messages, answer_a=checked[0],
        answer_b=checked[1] if len(checked) > 1 else "", models=[m.to_dict() for m in models],
        sampling=dict(sampling or {}), origin=origin,
        pair_key=pair_key(checked_messages, key_answers) if kind == PAIR else
        pair_key(checked_messages, key_answers + [f"[{kind}]"]))


def run_ids(vote: VoteRecord) -> list[str]:
    """The training runs whose answers the vote judges (none when only base models answered)."""
    return list(dict.fromkeys(m.get("run_id") for m in vote.models if isinstance(m, dict) and m.get("run_id")))


def prompt_text(vote: VoteRecord) -> str:
    """The user's message the answers reply to (the conversation's last turn)."""
    return vote.messages[-1]["content"] if vote.messages else ""
