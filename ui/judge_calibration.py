"""Judge calibration in an eval job's results (issue 34): people rate a fixed sample of the judged answers (pass/fail
or 1-5 with the judge's rubric), one at a time and without the judge's score in view (no anchoring); the panel shows
how far the judge agrees with them (trainer_core/feedback/calibration.py), with n, intervals, the status and a
scatter. Everyone may rate (viewers too); ratings go through trainer_core.feedback.service."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from trainer_core.feedback import calibration
from trainer_core.feedback.service import SCALE_TEXT, Feedback
from trainer_core.feedback.votes import FeedbackError
from trainer_core.views.calibration_chart import judge_vs_human
from ui.auth import current_actor
from ui.text import safe

K = "ev_cal_"
STAT_NAMES = {"spearman": "Spearman ρ", "kendall": "Kendall τ", "kappa": "Cohen's κ"}
STATUS_ICONS = {calibration.UNCALIBRATED: "⏳", calibration.LOW: "⚠️", calibration.CALIBRATED: "✅"}
SCORE_CHOICES = (1, 2, 3, 4, 5)


def statistic_text(stat: calibration.Statistic) -> str:
    """``Spearman ρ 0.82 (95% CI 0.61 to 0.93)``, or why it is undefined."""
    if stat.value is None:
        return f"{STAT_NAMES[stat.name]} undefined"
    interval = f" (95% CI {stat.low:.2f} to {stat.high:.2f})" if stat.low is not None else ""
    return f"{STAT_NAMES[stat.name]} {stat.value:.2f}{interval}"


def headline(found: calibration.Calibration) -> str:
    return f"{STATUS_ICONS[found.status]} Judge {found.status} · n {found.n} · " + \
        " · ".join(statistic_text(s) for s in found.statistics)


def next_to_rate(sample: list[int], rated: set[int]) -> int | None:
    return next((i for i in sample if i not in rated), None)


def calibrations(judged: pd.DataFrame, ratings: list) -> dict[str, calibration.Calibration]:
    return {scale: calibration.calibrate(calibration.paired(judged, ratings, scale), scale) for scale in SCALE_TEXT}


def render(feedback: Feedback, job_id: str, samples: pd.DataFrame) -> None:
    """The judge's status (under the metrics) and the calibration panel of an eval job whose answers the LLM judge
    scored (nothing otherwise)."""
    judged = samples.dropna(subset=["judge"]) if "judge" in samples else samples.iloc[0:0]
    if judged.empty:
        return
    ratings = feedback.ratings_for(job_id)  # with those of the same answers in earlier evals (an edited rubric)
    found = calibrations(judged, ratings)
    shown = max(found.values(), key=lambda c: c.n)  # the scale people rated most
    st.caption(safe(f"{headline(shown)} ({SCALE_TEXT[shown.scale]}): {shown.reason}"))
    with st.expander("Judge calibration: rate answers, see how far the judge agrees", icon="⚖️"):
        scale = st.radio("Rate answers as", list(SCALE_TEXT), format_func=SCALE_TEXT.get, horizontal=True,
                         key=f"{K}scale_{job_id}")
        pairs = calibration.paired(judged, ratings, scale)
        st.markdown(f"**{safe(headline(found[scale]))}**")
        st.caption(safe(found[scale].reason))
        if not pairs.empty:
            st.altair_chart(judge_vs_human(pairs, scale), width="stretch")
        render_rating(feedback, job_id, judged, ratings, scale)


def render_rating(feedback: Feedback, job_id: str, judged: pd.DataFrame, ratings: list, scale: str) -> None:
    """The next answer of the sample this person has not rated on ``scale``, with its rating buttons."""
    actor = current_actor()
    sample = calibration.rating_sample(judged["index"].astype(int).tolist(), job_id)
    mine = {r.index for r in ratings if r.rater == actor.name and r.scale == scale}
    index = next_to_rate(sample, mine)
    st.caption(f"You rated {len(mine & set(sample))} of the {len(sample)} answers offered for rating.")
    if index is None:
        return
    row = judged[judged["index"] == index].iloc[0]
    with st.container(border=True):
        st.caption(f"Answer {index}: prompt, reference, then the model's answer (the judge's score stays hidden)")
        st.text(str(row["prompt"]))
        if str(row.get("reference") or ""):
            st.text(str(row["reference"]))
        st.text(str(row["answer"]))
        choices = (("Fail", 0), ("Pass", 1)) if scale == "pass_fail" else tuple((str(v), v) for v in SCORE_CHOICES)
        for col, (label, value) in zip(st.columns(len(choices)), choices):
            if col.button(label, key=f"{K}{job_id}_{scale}_{index}_{value}"):
                try:
                    feedback.rate(actor, job_id, index, scale, value)
                except FeedbackError as exc:
                    st.error(safe(exc), icon="🚫")
                else:
                    st.rerun()
