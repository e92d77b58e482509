"""Comparing runs: loss and eval-loss overlays (and of any other metric key picked), a summary table and the
config fields that differ.

``config_diff`` and ``summary_table`` are plain functions (tested without Streamlit);
``render_compare`` draws them. The page (pages/compare.py) only picks the runs and loads their data.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st

from db.entities import RunRecord
from trainer_core.views import charts
from trainer_core.views.run_rules import run_labels
from ui import format as fmt
from ui.views import persisted, persistent_key, smoothing_control

_ABSENT = object()


def _cell(value: Any) -> str:
    if value is _ABSENT:
        return fmt.MISSING
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def config_diff(configs: dict[str, dict]) -> pd.DataFrame:
    """The config fields whose values differ between runs: one row per field, one column per run label.

    A field missing from some configs counts as different and reads "—" there. Values are shown as
    text (lists and dicts as JSON) so a column can hold numbers, strings and lists alike.
    """
    fields: list[str] = []
    for config in configs.values():
        fields += [f for f in config if f not in fields]
    rows = {}
    for name in fields:
        values = [config.get(name, _ABSENT) for config in configs.values()]
        if any(v != values[0] for v in values[1:]):
            rows[name] = [_cell(v) for v in values]
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=list(configs)) if rows else \
        pd.DataFrame(columns=list(configs), dtype=str)
    frame.index.name = "field"
    return frame


def _finite(df: pd.DataFrame, column: str) -> pd.Series:
    """Finite values of ``column`` in step order (empty when the column is missing)."""
    if df is None or column not in df or "step" not in df:
        return pd.Series(dtype=float)
    steps = pd.to_numeric(df["step"], errors="coerce")
    return charts.finite_column(df, column).reindex(steps.sort_values(kind="stable").index).dropna()


def _last(values: pd.Series) -> float | None:
    return float(values.iloc[-1]) if len(values) else None


def _least(values: pd.Series) -> float | None:
    return float(values.min()) if len(values) else None


def summary_table(runs: Sequence[RunRecord], frames: dict[str, pd.DataFrame], now: float | None = None,
                  keys: Sequence[str] = ()) -> pd.DataFrame:
    """One row per run: final and best train loss, final and best eval loss, steps, tokens, duration, status;
    then ``final <key>`` per other metric key asked for (its last logged value; NaN where a run has none).

    Losses come from the metrics frames (keyed by run id); a run without metrics falls back to the
    numbers stored on the run. Duration runs to ``now`` while a run is still going.
    """
    now = time.time() if now is None else now
    labels = run_labels(runs)
    rows = []
    for run in runs:
        df = frames.get(run.id, pd.DataFrame())
        loss, evals = _finite(df, "loss"), _finite(df, "eval_loss")
        tokens = _finite(df, "tokens_seen")
        stored_final = run.final_loss if run.final_loss is not None else run.last_loss
        rows.append({
            "run": labels[run.id],
            "status": fmt.status_badge(run.status),
            "final loss": _last(loss) if len(loss) else stored_final,
            "best loss": _least(loss) if len(loss) else stored_final,
            "final eval loss": _last(evals),
            "best eval loss": _least(evals) if len(evals) else run.best_eval_loss,
            "steps": int(run.steps_done or (df["step"].max() if len(df) and "step" in df else 0)),
            "tokens seen": run.tokens_seen if run.tokens_seen is not None else
            (int(tokens.max()) if len(tokens) else None),
            "duration": fmt.duration((run.finished_at or now) - run.started_at if run.started_at else None),
            **{f"final {key}": _last(_finite(df, key)) for key in keys},
        })
    columns = ["run", "status", "final loss", "best loss", "final eval loss", "best eval loss", "steps",
               "tokens seen", "duration", *[f"final {key}" for key in keys]]
    table = pd.DataFrame(rows, columns=columns)
    for column in ("final loss", "best loss", "final eval loss", "best eval loss", *[f"final {key}" for key in keys]):
        table[column] = table[column].astype(float)  # None -> NaN, so the table formats them as numbers
    return table


def _has(frames: dict[str, pd.DataFrame], column: str) -> bool:
    return any(len(_finite(df, column)) for df in frames.values())


def render_compare(runs: Sequence[RunRecord], frames: dict[str, pd.DataFrame], configs: dict[str, dict],
                   key_prefix: str = "cmp", extra: Sequence[str] = ()) -> None:
    """Overlay charts (align by step or tokens seen, smoothing), the summary table and the config diff;
    ``extra``: other metric keys to overlay and summarise too (their columns in ``frames``)."""
    labels = run_labels(runs)
    by_label = {labels[r.id]: frames.get(r.id, pd.DataFrame()) for r in runs}
    align_col, kind_col, amount_col = st.columns([2, 2, 3], vertical_alignment="bottom")
    align_key = persistent_key(f"{key_prefix}_align", "step")
    align_col.radio("Align by", list(charts.COMPARE_ALIGN), format_func=charts.X_AXES.get, horizontal=True,
                    key=align_key)
    align = persisted(align_key)
    smoothing = smoothing_control(key_prefix, kind_col, amount_col)
    if align == "tokens_seen" and not _has(by_label, "tokens_seen"):
        st.caption("No run logged tokens seen: nothing to align on.")
    for metric in charts.COMPARE_METRICS:
        if _has(by_label, metric):
            st.altair_chart(charts.compare_chart(by_label, metric=metric, align=align, smoothing=smoothing),
                            theme="streamlit", width="stretch", height=charts.LOSS_HEIGHT)
        else:
            st.caption(f"No run logged {charts.COMPARE_METRICS[metric].lower()}.")
    for key in extra:  # as logged: only train loss is smoothed
        if _has(by_label, key):
            st.altair_chart(charts.compare_chart(by_label, metric=key, align=align),
                            theme="streamlit", width="stretch", height=charts.LOSS_HEIGHT)
        else:
            st.caption(f"No run logged {key}.")

    st.subheader("Summary")
    st.dataframe(summary_table(runs, frames, keys=extra), hide_index=True, column_config={
        "run": st.column_config.TextColumn("Run", pinned=True),
        "final loss": st.column_config.NumberColumn("Final loss", format="%.4f"),
        "best loss": st.column_config.NumberColumn("Best loss", format="%.4f", help="Lowest logged train loss"),
        "final eval loss": st.column_config.NumberColumn("Final eval loss", format="%.4f"),
        "best eval loss": st.column_config.NumberColumn("Best eval loss", format="%.4f"),
        "tokens seen": st.column_config.NumberColumn("Tokens seen", format="compact"),
        "duration": st.column_config.TextColumn("Duration"),
    })

    st.subheader("Config differences")
    diff = config_diff({labels[r.id]: configs.get(r.id, {}) for r in runs})
    if diff.empty:
        st.caption("The runs have identical configs.")
    else:
        st.dataframe(diff, column_config={"field": st.column_config.TextColumn("Field", pinned=True)})
