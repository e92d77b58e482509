"""The Feedback page's logic (issue 34): tables of votes by run and by person, conflicts, the person's own votes,
second opinions, exports and "Train on this feedback". Table builders are plain functions (tested on their own); the
``render_*`` functions lay them out. Every answer, prompt and name is shown as text (dataframe cells, or ``safe``)."""
from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pandas as pd
import streamlit as st

from db.feedback_store import VoteRecord
from trainer_core.auth.access import Actor
from trainer_core.config import TrainConfig
from trainer_core.feedback import agreement, export, training, votes
from trainer_core.feedback.service import Feedback
from trainer_core.feedback.votes import FeedbackError
from ui import form
from ui.text import safe

K = "fb_"
EXPORTED = K + "exported"  # (format, Exported, the run the votes judged) of this session's last export
PREVIEW_CHARS = 300  # characters of a prompt or answer in a table cell
SECOND_OPINIONS = 5


def _short(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


def counts_table(counts: dict[str, Counter], names: dict[str, str], what: str) -> pd.DataFrame:
    """One row per run (or person): its votes by label and in all, most votes first."""
    rows = [{what: names.get(key, key), **{votes.LABEL_TEXT[label]: counted.get(label, 0) for label in votes.ALL_LABELS
                                           if any(c.get(label) for c in counts.values())},
             "Votes": sum(counted.values())} for key, counted in counts.items()]
    return pd.DataFrame(rows).sort_values(["Votes", what], ascending=[False, True]).reset_index(drop=True) \
        if rows else pd.DataFrame(columns=[what, "Votes"])


def votes_table(chosen: list[VoteRecord], names: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame([{
        "When": dt.datetime.fromtimestamp(v.created_at).strftime("%Y-%m-%d %H:%M"), "Who": v.voter,
        "Vote": votes.LABEL_TEXT[v.label], "Prompt": _short(votes.prompt_text(v)), "Answer A": _short(v.answer_a),
        "Answer B / edit": _short(v.answer_b), "Runs": ", ".join(names.get(r, r) for r in votes.run_ids(v)) or "base",
        "Origin": v.origin} for v in chosen], columns=["When", "Who", "Vote", "Prompt", "Answer A", "Answer B / edit",
                                                       "Runs", "Origin"])


def conflicts_table(chosen: list[VoteRecord], keys: list[str]) -> pd.DataFrame:
    """One row per conflict: the prompt, the two answers (in a fixed order) and who picked which."""
    grouped = agreement.by_answers(chosen)
    rows = []
    for key in keys:
        group = grouped[key]
        first = group[0]
        a, b = sorted((first.answer_a, first.answer_b)) if first.kind == votes.PAIR else (first.answer_a, "")
        picks = "; ".join(f"{v.voter}: {votes.LABEL_TEXT[votes.canonical_label(v)]}" for v in group)
        rows.append({"Prompt": _short(votes.prompt_text(first)), "Answer A": _short(a), "Answer B": _short(b),
                     "Votes": picks})
    return pd.DataFrame(rows, columns=["Prompt", "Answer A", "Answer B", "Votes"])


def date_bounds(picked: Any) -> tuple[float | None, float | None]:
    """UNIX seconds from the date filter's (start, end) dates; the end day is included."""
    if not isinstance(picked, (tuple, list)) or not picked:
        return None, None
    start = dt.datetime.combine(picked[0], dt.time()).timestamp()
    end = dt.datetime.combine(picked[-1] + dt.timedelta(days=1), dt.time()).timestamp()
    return start, end


def prefill_new_run(state: Any, cfg: TrainConfig) -> None:
    """New run shows ``cfg`` when it opens next (the way a loaded preset fills it)."""
    for key in [key for key in state if str(key).startswith(form.K + "map_")]:
        del state[key]
    state.pop(form.SAVED, None)
    state.update(form.config_to_state(cfg))
    state[form.BASE] = cfg


# ====================================================================== layout
def render_filters(all_votes: list[VoteRecord], names: dict[str, str]) -> agreement.Filters:
    runs = sorted({r for v in all_votes for r in votes.run_ids(v) or [agreement.BASE_ONLY]})
    people = sorted({v.voter for v in all_votes})
    cols = st.columns(4)
    picked_runs = cols[0].multiselect("Runs", runs, key=K + "runs", format_func=lambda r: names.get(r, r))
    picked_people = cols[1].multiselect("People", people, key=K + "people")
    picked_labels = cols[2].multiselect("Votes", list(votes.ALL_LABELS), key=K + "labels",
                                        format_func=votes.LABEL_TEXT.get)
    dates = cols[3].date_input("Dates", value=(), key=K + "dates", help="From and to (both included)")
    since, until = date_bounds(dates)
    return agreement.Filters(tuple(picked_runs), tuple(picked_people), tuple(picked_labels), since, until)


def render_summary(chosen: list[VoteRecord], names: dict[str, str]) -> None:
    found = agreement.agreement(chosen)
    cols = st.columns(4)
    cols[0].metric("Votes", len(chosen))
    cols[1].metric("People", len({v.voter for v in chosen}))
    cols[2].metric("Agreement", "—" if found.rate is None else f"{found.rate:.0%}",
                   help=f"Pairs of people who gave the same vote on the same answers: {found.agreeing} of "
                        f"{found.pairs}, over {found.shared} answer(s) judged by two people or more")
    cols[3].metric("Conflicts", len(found.conflicts), help="Answers where people picked opposite ones (A vs B, 👍 vs 👎)")
    left, right = st.columns(2)
    with left:
        st.markdown("**By run**")
        st.dataframe(counts_table(agreement.counts_by_run(chosen), names, "Run"), hide_index=True)
    with right:
        st.markdown("**By person**")
        st.dataframe(counts_table(agreement.counts_by_person(chosen), {}, "Person"), hide_index=True)
    if found.conflicts:
        st.markdown("**Conflicts**")
        st.dataframe(conflicts_table(chosen, found.conflicts), hide_index=True)
    with st.expander(f"All {len(chosen)} vote(s)"):
        st.dataframe(votes_table(chosen, names), hide_index=True)


def render_my_votes(feedback: Feedback, actor: Actor, filters: agreement.Filters) -> None:
    """The person's own votes (the page's filters apply), newest first, each with Withdraw."""
    everything = feedback.votes_of(actor)
    mine = agreement.select(everything, filters)
    st.subheader(f"Your votes ({len(mine)})")
    if not mine:
        st.caption("None match the filters above." if everything else
                   "You have not voted yet: vote on answers in the Playground, or give a second opinion below.")
        return
    for vote in mine[:50]:
        text, button = st.columns([5, 1])
        text.markdown(safe(f"{votes.LABEL_TEXT[vote.label]} · {_short(votes.prompt_text(vote))}", limit=200))
        if button.button("Withdraw", key=f"{K}withdraw_{vote.id}"):
            try:
                feedback.withdraw(actor, vote.id)
            except FeedbackError as exc:
                st.error(safe(exc), icon="🚫")
            else:
                st.rerun()


def render_second_opinions(feedback: Feedback, actor: Actor) -> None:
    """Answers others judged that this person has not: their own vote on them (viewers too)."""
    waiting = feedback.open_for(actor, SECOND_OPINIONS)
    st.subheader("Second opinions")
    if not waiting:
        st.caption("Nothing waits for your vote.")
        return
    st.caption("Answers others judged: your own vote measures how far people agree (theirs is not shown).")
    for vote in waiting:
        with st.container(border=True):
            st.markdown(safe(votes.prompt_text(vote), limit=2000))
            labels = votes.LABELS[vote.kind]
            answers = st.columns(2 if vote.kind == votes.PAIR else 1)
            answers[0].text(_short(vote.answer_a) if len(vote.answer_a) > 4000 else vote.answer_a)
            if vote.kind == votes.PAIR:
                answers[1].text(vote.answer_b)
            for col, label in zip(st.columns(len(labels)), labels):
                if col.button(votes.LABEL_TEXT[label], key=f"{K}second_{vote.id}_{label}"):
                    try:
                        feedback.second_opinion(actor, vote, label)
                    except FeedbackError as exc:
                        st.error(safe(exc), icon="🚫")
                    else:
                        st.rerun()


def render_export(feedback: Feedback, actor: Actor, filters: agreement.Filters, runs_artifacts) -> None:
    st.subheader("Export and train")
    may = feedback.may_export(actor)
    fmt = st.radio("Format", list(export.FORMATS), format_func=export.FORMATS.get, horizontal=True, key=K + "format")
    if st.button("Export", icon="📦", key=K + "export", disabled=not may,
                 help="Write the filtered votes as a new version of the dataset" if may else
                 f"You are a {actor.role.value}: exporting writes a dataset to train on (operators and admins)"):
        try:
            done = feedback.export(actor, fmt, filters)
        except FeedbackError as exc:
            st.error(safe(exc), icon="🚫")
        else:
            st.session_state[EXPORTED] = (fmt, done, training.voted_run(feedback.all_votes(), done.vote_ids))
    if not may:
        st.caption("Viewers vote; operators and admins export and train.")
    last = st.session_state.get(EXPORTED)
    if last is None:
        return
    fmt, done, run_id = last
    left = "; ".join(f"{n} {why}" for why, n in done.left_out.items())
    st.success(safe(f"Wrote {done.rows} row(s) from {len(done.vote_ids)} vote(s) to {done.path.name} "
                    f"(version {done.version})" + (f". Left out: {left}" if left else "")), icon="📦")
    model, why = training.starting_point(run_id, runs_artifacts(run_id) if run_id else [])
    st.caption(safe(f"Train on this feedback starts from {why}."))
    if st.button("Train on this feedback", icon="🚀", key=K + "train", disabled=not may):
        prefill_new_run(st.session_state, training.train_config(done, fmt, model))
        st.switch_page("pages/new_run.py")
