"""Pure chart builders: DataFrame in, Altair chart out (no Streamlit here).

Smoothing runs on the full-resolution series; min/max downsampling runs after it, so a 100k-step run
still redraws quickly and no spike disappears from the picture. Every chart uses a long-format
frame (``x``, ``value``, ``series``) so colour comes from ``series`` and tests can read the data
straight out of ``chart.to_dict()``. Non-finite values never reach the plotted data.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

RAW_LOSS = "train loss"
SMOOTH_LOSS = "train loss (moving avg)"
EVAL_LOSS = "eval loss"
LOSS_SERIES = (RAW_LOSS, SMOOTH_LOSS, EVAL_LOSS)
# Fixed colours so raw, smoothed and eval loss never come out as two shades of one blue; mid-tones
# read on both the light and the dark theme.
LOSS_COLOURS = {RAW_LOSS: "#4c78a8", SMOOTH_LOSS: "#f58518", EVAL_LOSS: "#e45756"}


def finite_column(df: pd.DataFrame, name: str) -> pd.Series:
    """The finite values of one column (empty when the column is missing)."""
    if name not in df:
        return pd.Series(dtype=float)
    return _numeric(df[name]).dropna()


def _numeric(values: pd.Series) -> pd.Series:
    """Floats with None/NaN/inf all turned into NaN (DB columns arrive as object dtype)."""
    out = pd.to_numeric(values, errors="coerce").astype(float)
    return out.where(np.isfinite(out))


def downsample_minmax(df: pd.DataFrame, x: str, y: str, max_points: int) -> pd.DataFrame:
    """At most ``max_points`` rows of ``df`` that keep the shape of ``y`` over ``x``.

    Rows with a non-finite ``x`` or ``y`` are dropped first. The first and last rows are kept, and
    the rows between them are cut into equal buckets of which the min and the max of ``y`` survive.
    """
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, got {max_points}")
    ys = _numeric(df[y]) if y in df else pd.Series(np.nan, index=df.index)
    xs = _numeric(df[x]) if x in df else pd.Series(np.nan, index=df.index)
    data = df.loc[ys.notna() & xs.notna()]
    data = data.iloc[np.argsort(xs[data.index].to_numpy(), kind="stable")].reset_index(drop=True)
    n = len(data)
    if n <= max_points:
        return data
    buckets = (max_points - 2) // 2
    inner = pd.Series(_numeric(data[y]).to_numpy()[1:-1], index=np.arange(1, n - 1))
    bucket_of = np.arange(n - 2) * buckets // (n - 2)
    grouped = inner.groupby(bucket_of)
    keep = np.union1d(grouped.idxmin().to_numpy(), grouped.idxmax().to_numpy())
    keep = np.union1d(keep, [0, n - 1])
    return data.iloc[keep].reset_index(drop=True)


def smooth(series: pd.Series, window: int) -> pd.Series:
    """Trailing moving average over the last ``window`` finite values (NaN where the input was not finite)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    values = _numeric(pd.Series(series))
    finite = values.dropna()
    return finite.rolling(window, min_periods=1).mean().reindex(values.index)


def _long(df: pd.DataFrame, x: str, y: str, series: str, max_points: int) -> pd.DataFrame:
    """Downsampled ``x``/``value``/``series`` rows for one column of ``df``."""
    if df.empty or y not in df or x not in df:
        return pd.DataFrame({x: pd.Series(dtype=float), "value": pd.Series(dtype=float), "series": pd.Series(dtype=str)})
    thin = downsample_minmax(df[[x, y]], x, y, max_points)
    return pd.DataFrame({x: _numeric(thin[x]).to_numpy(), "value": _numeric(thin[y]).to_numpy(), "series": series})


def _encode(base: alt.Chart, x: str, y_title: str, domain: list[str]) -> alt.Chart:
    return base.encode(
        x=alt.X(f"{x}:Q", title=x.replace("_", " ")),
        y=alt.Y("value:Q", title=y_title, scale=alt.Scale(zero=False)),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom"),
                        scale=alt.Scale(domain=domain, range=[LOSS_COLOURS[d] for d in domain])
                        if all(d in LOSS_COLOURS for d in domain) else alt.Scale(domain=domain)),
        tooltip=[alt.Tooltip(f"{x}:Q", title=x), alt.Tooltip("series:N", title="series"),
                 alt.Tooltip("value:Q", title=y_title)],
    )


def loss_chart(df: pd.DataFrame, x: str = "step", window: int = 10, max_points: int = 1000) -> alt.LayerChart:
    """Raw train-loss points, their moving average as a line, and eval loss when the run has any."""
    frames = []
    if "loss" in df and x in df:
        train = pd.DataFrame({x: df[x], "loss": _numeric(df["loss"])}).dropna()
        train = train.iloc[np.argsort(_numeric(train[x]).to_numpy(), kind="stable")]
        train["smoothed"] = smooth(train["loss"], window)
        frames += [_long(train, x, "loss", RAW_LOSS, max_points), _long(train, x, "smoothed", SMOOTH_LOSS, max_points)]
    if "eval_loss" in df and x in df:
        frames.append(_long(df, x, "eval_loss", EVAL_LOSS, max_points))
    frames = [f for f in frames if not f.empty]
    data = pd.concat(frames, ignore_index=True) if frames else _long(pd.DataFrame(), x, "loss", RAW_LOSS, max_points)
    domain = [s for s in LOSS_SERIES if s in set(data["series"])] or [RAW_LOSS]
    base = _encode(alt.Chart(data), x, "loss", domain)
    points = base.transform_filter(alt.datum.series == RAW_LOSS).mark_circle(size=30, opacity=0.55)
    avg = base.transform_filter(alt.datum.series == SMOOTH_LOSS).mark_line(strokeWidth=2)
    evals = base.transform_filter(alt.datum.series == EVAL_LOSS).mark_line(point=True, strokeDash=[4, 3])
    return alt.layer(points, avg, evals).properties(title="Loss", height=280).interactive(bind_y=False)


def line_chart(df: pd.DataFrame, y: str, title: str, x: str = "step", max_points: int = 1000) -> alt.Chart:
    """One metric over steps (learning rate, grad norm, tokens/s), NaN-free and downsampled."""
    data = _long(df, x, y, title, max_points) if y in df else _long(pd.DataFrame(), x, y, title, max_points)
    base = _encode(alt.Chart(data), x, title, [title])
    return base.mark_line(point=len(data) < 40).properties(title=title, height=220).interactive(bind_y=False)


def compare_loss_chart(frames: dict[str, pd.DataFrame], x: str = "step", window: int = 10,
                       max_points: int = 500) -> alt.Chart:
    """Smoothed train loss of several runs, one colour per run name."""
    parts = []
    for name, df in frames.items():
        if "loss" not in df or x not in df:
            continue
        train = pd.DataFrame({x: df[x], "loss": _numeric(df["loss"])}).dropna()
        train["smoothed"] = smooth(train["loss"], window)
        parts.append(_long(train, x, "smoothed", name, max_points))
    parts = [p for p in parts if not p.empty]
    data = pd.concat(parts, ignore_index=True) if parts else _long(pd.DataFrame(), x, "loss", "", max_points)
    base = _encode(alt.Chart(data), x, "loss (moving avg)", list(frames))
    return base.mark_line().properties(title="Loss by run", height=280).interactive(bind_y=False)
