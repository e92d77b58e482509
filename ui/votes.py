"""Votes in the Playground (issue 34): under a chat turn's answers, pick the better of two side-by-side answers (or
tie, or both bad), thumbs up/down one answer, or edit it (the edit becomes the chosen answer, the original the rejected
one). Votes go through trainer_core.feedback.service, the path the Feedback page and the CLI use too; the person sees
their vote on the turn and can withdraw it there (or on the Feedback page).

``pair_vote``/``single_vote``/``edit_vote`` are what the buttons call (tests call them the same way); ``render_turn``
lays the buttons out."""
from __future__ import annotations

import dataclasses
from itertools import combinations
from typing import Any

import streamlit as st

from db.feedback_store import VoteRecord
from trainer_core.auth.access import Actor
from trainer_core.feedback import votes
from trainer_core.feedback.service import Feedback, model_for
from trainer_core.feedback.votes import FeedbackError
from ui import playground as pg
from ui.text import safe

K = "pg_vote_"
MINE = K + "mine"  # session state: turn number -> the ids of the votes cast on it in this session
PAIR_BUTTONS = ((votes.A_BETTER, "A is better", "⬅️"), (votes.B_BETTER, "B is better", "➡️"),
                (votes.TIE, "Tie", "🤝"), (votes.BOTH_BAD, "Both bad", "👎"))


def votable(answer: pg.Answer | None) -> bool:
    """An answer that ended on its own (not streaming, failed, stopped or skipped) can be judged."""
    return answer is not None and answer.status == pg.DONE


def conversation(system: str, turns: list[pg.Turn], n: int, key: str) -> list[dict]:
    """The conversation turn ``n``'s answers reply to, as column ``key`` saw it (its own earlier answers)."""
    return pg.messages_for(system, turns[:n], key, turns[n].user)


def _sampling(turn: pg.Turn) -> dict:
    return dataclasses.asdict(turn.sampling) if turn.sampling else {}


def pair_vote(feedback: Feedback, actor: Actor, turns: list[pg.Turn], n: int, a: pg.Column, b: pg.Column,
              label: str) -> VoteRecord:
    """``label`` on turn ``n``'s answers of columns ``a`` and ``b``; the conversation is the one ``a`` saw (in a
    multi-turn chat each column has its own earlier answers; A's are kept)."""
    turn = turns[n]
    return feedback.vote(actor, votes.PAIR, label, conversation(turn.system, turns, n, a.key),
                         [turn.answers[a.key].text, turn.answers[b.key].text],
                         [model_for(a.key, a.label), model_for(b.key, b.label)], _sampling(turn))


def single_vote(feedback: Feedback, actor: Actor, turns: list[pg.Turn], n: int, column: pg.Column,
                label: str) -> VoteRecord:
    turn = turns[n]
    return feedback.vote(actor, votes.SINGLE, label, conversation(turn.system, turns, n, column.key),
                         [turn.answers[column.key].text], [model_for(column.key, column.label)], _sampling(turn))


def edit_vote(feedback: Feedback, actor: Actor, turns: list[pg.Turn], n: int, column: pg.Column,
              edited: str) -> VoteRecord:
    turn = turns[n]
    return feedback.vote(actor, votes.EDIT, votes.EDITED, conversation(turn.system, turns, n, column.key),
                         [turn.answers[column.key].text], [model_for(column.key, column.label)], _sampling(turn),
                         edited=edited)


def pair_choices(columns: list[pg.Column], turn: pg.Turn) -> list[tuple[pg.Column, pg.Column]]:
    """The pairs of columns whose answers to ``turn`` can be compared, left to right."""
    ready = [c for c in columns if votable(turn.answers.get(c.key))]
    return list(combinations(ready, 2))


# ====================================================================== layout
def _remember(n: int, vote: VoteRecord) -> None:
    st.session_state.setdefault(MINE, {}).setdefault(n, []).append(vote.id)


def _cast(n: int, make) -> None:
    try:
        vote = make()
    except FeedbackError as exc:
        st.error(safe(exc), icon="🚫")
        return
    _remember(n, vote)
    st.toast(f"Vote saved: {votes.LABEL_TEXT[vote.label]}", icon="🗳️")


def render_answer_votes(feedback: Feedback, actor: Actor, turns: list[pg.Turn], n: int, column: pg.Column) -> None:
    """👍 / 👎 / ✏️ under one column's answer to turn ``n``."""
    if not votable(turns[n].answers.get(column.key)):
        return
    up, down, edit = st.columns(3)
    if up.button("👍", key=f"{K}up_{n}_{column.key}", help="A good answer"):
        _cast(n, lambda: single_vote(feedback, actor, turns, n, column, votes.UP))
    if down.button("👎", key=f"{K}down_{n}_{column.key}", help="A bad answer"):
        _cast(n, lambda: single_vote(feedback, actor, turns, n, column, votes.DOWN))
    with edit.popover("✏️", help="Write the better answer: yours is kept as chosen, this one as rejected"):
        text = st.text_area("Better answer", value=turns[n].answers[column.key].text, key=f"{K}edit_{n}_{column.key}")
        if st.button("Save edit", key=f"{K}save_{n}_{column.key}"):
            _cast(n, lambda: edit_vote(feedback, actor, turns, n, column, text))


def render_pair_votes(feedback: Feedback, actor: Actor, turns: list[pg.Turn], n: int,
                      columns: list[pg.Column]) -> None:
    """Which of two side-by-side answers to turn ``n`` is better (with three columns, pick the two first)."""
    pairs = pair_choices(columns, turns[n])
    if not pairs:
        return
    labels = pg.unique_labels(columns)
    chosen = pairs[0]
    if len(pairs) > 1:
        chosen = st.selectbox("Compare", pairs, key=f"{K}pair_{n}",
                              format_func=lambda p: f"A: {labels[p[0].key]}  ·  B: {labels[p[1].key]}")
    else:
        st.caption(safe(f"A: {labels[chosen[0].key]}  ·  B: {labels[chosen[1].key]}"))
    for col, (label, text, icon) in zip(st.columns(len(PAIR_BUTTONS)), PAIR_BUTTONS):
        if col.button(text, icon=icon, key=f"{K}{label}_{n}"):
            _cast(n, lambda label=label: pair_vote(feedback, actor, turns, n, chosen[0], chosen[1], label))


def render_my_votes(feedback: Feedback, actor: Actor, n: int) -> None:
    """The person's votes on turn ``n`` cast in this session, each with Withdraw."""
    ids = st.session_state.get(MINE, {}).get(n, [])
    if not ids:
        return
    for vote in [v for v in feedback.votes_of(actor) if v.id in ids]:
        text, button = st.columns([4, 1])
        text.caption(safe(f"Your vote: {votes.LABEL_TEXT[vote.label]}"))
        if button.button("Withdraw", key=f"{K}withdraw_{vote.id}"):
            try:
                feedback.withdraw(actor, vote.id)
            except FeedbackError as exc:
                st.error(safe(exc), icon="🚫")
            else:
                st.rerun()


def render_turn(feedback: Feedback, actor: Actor, turns: list[pg.Turn], n: int, columns: list[pg.Column]) -> None:
    """Everything to vote with under turn ``n``'s answers."""
    with st.container(border=True):
        if len(columns) > 1:
            render_pair_votes(feedback, actor, turns, n, columns)
        render_my_votes(feedback, actor, n)


def feedback_for(orch: Any) -> Feedback:
    return Feedback(orch.store)
