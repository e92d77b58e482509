"""The judge against people as a picture: one point per rated answer, the judge's 1-10 score across, the people's mean
rating up (pure: DataFrame in, Altair chart out; the frame is ``feedback.calibration.paired``'s)."""
from __future__ import annotations

import altair as alt
import pandas as pd

HUMAN_AXIS = {"score5": ("People's mean score (1-5)", [1, 5]), "pass_fail": ("Share of people saying pass", [0, 1])}


def judge_vs_human(pairs: pd.DataFrame, scale: str) -> alt.Chart:
    title, domain = HUMAN_AXIS[scale]
    data = pairs[["index", "judge", "human", "raters"]].astype({"index": int, "judge": float, "human": float,
                                                                 "raters": int})
    return alt.Chart(data).mark_circle(opacity=0.7).encode(
        x=alt.X("judge:Q", title="Judge score (1-10)", scale=alt.Scale(domain=[1, 10])),
        y=alt.Y("human:Q", title=title, scale=alt.Scale(domain=domain)),
        size=alt.Size("raters:Q", title="Raters", legend=None, scale=alt.Scale(range=[40, 160])),
        tooltip=[alt.Tooltip("index:Q", title="Answer"), alt.Tooltip("judge:Q", title="Judge"),
                 alt.Tooltip("human:Q", title="People", format=".2f"), alt.Tooltip("raters:Q", title="Raters")],
    ).properties(height=260)
