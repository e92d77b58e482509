"""Pure chart builders: DataFrame in, Altair chart out (no Streamlit here).

Smoothing runs on the full-resolution series; min/max downsampling runs after it, so a 100k-step run
still redraws quickly and no spike disappears from the picture. Every chart plots one long-format
frame (the x column, ``step``, ``value``, ``series``, ``key``) so colour comes from ``series`` and tests
can read the data straight out of ``chart.to_dict()``. Non-finite values never reach the plotted data.

Interaction is the same on every chart: drag to pan and scroll to zoom (an interval selection bound
to the scales), and a vertical rule at the nearest x whose tooltip lists the exact value of every
series there. The browser pivots the long rows into one row per x for that tooltip, so nothing is
sent twice.

Kept whole: one pipeline shared by every chart (clean numbers, smooth, downsample, long frame, the one chart
template with pan, zoom and the nearest-x rule); the public charts at the end are a few lines each over these
private steps.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import altair as alt
import numpy as np
import pandas as pd

from trainer_core import methods
from trainer_core.methods.base import TRAINER_METRICS, MetricSpec

RAW_LOSS = "train loss"
SMOOTH_LOSS = "train loss (smoothed)"
EVAL_LOSS = "eval loss"
LOSS_SERIES = (RAW_LOSS, SMOOTH_LOSS, EVAL_LOSS)
# Fixed colours so raw, smoothed and eval loss never come out as two shades of one blue; mid-tones
# read on both the light and the dark theme (the page's theme sets background and text colours).
LOSS_COLOURS = {RAW_LOSS: "#4c78a8", SMOOTH_LOSS: "#f58518", EVAL_LOSS: "#e45756"}
LINE_COLOUR = "#54a24b"
# One colour per compared run (at most six): distinct hues, mid-tones for both themes.
RUN_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2")

# x column -> label for pickers and axis titles. "wall time" is seconds since the run started.
X_AXES = {"step": "step", "epoch": "epoch", "tokens_seen": "tokens seen", "elapsed_s": "wall time"}
AXIS_TITLES = {"step": "step", "epoch": "epoch", "tokens_seen": "tokens seen", "elapsed_s": "wall time (s)"}
# What a run's charts and tiles show when its method names nothing else (sft and cpt, and runs of a method
# this version does not know): the loss chart (train and eval loss) and one small chart per other charted
# spec, titled by its label. Any other key a run logged is drawn on request ("Other metrics"), with the same
# downsampling.
DEFAULT_SPECS = TRAINER_METRICS
LOSS_KEYS = ("loss", "eval_loss")  # drawn together on the loss chart, whatever the specs say
# The small charts of the live page: metric column -> title.
LINE_METRICS = {s.key: s.label for s in DEFAULT_SPECS if s.chart and s.key not in LOSS_KEYS}
COMPARE_METRICS = {"loss": "Train loss", "eval_loss": "Eval loss"}
COMPARE_ALIGN = ("step", "tokens_seen")
MISSING = "—"
# One height per chart, in the spec and for the page element that shows it (an explicit element height:
# with "content" the Streamlit theme squeezes the plot area).
LOSS_HEIGHT = 380  # the loss chart of Live/Run details and each Compare chart
LINE_HEIGHT = 280  # the small charts under it
LENGTH_HEIGHT = 220  # the token-length histogram of the New run preview


@dataclass(frozen=True)
class Smoothing:
    """How the train-loss line is smoothed.

    ``window``: trailing mean of the last ``value`` finite points (``value`` >= 1; 1 means none).
    ``ema``: TensorBoard's debiased exponential moving average with weight ``value`` in [0, 1):
    ``s_t = sum(w**i * x_(t-i)) / sum(w**i)`` over the finite points so far (0 means none). It
    weights logged points, not time, exactly like TensorBoard's smoothing slider.
    """

    kind: str = "window"
    value: float = 10

    def __post_init__(self) -> None:
        if self.kind == "window":
            if self.value < 1 or int(self.value) != self.value:
                raise ValueError(f"a smoothing window must be a whole number >= 1, got {self.value}")
        elif self.kind == "ema":
            if not 0 <= self.value < 1:
                raise ValueError(f"an EMA weight must be in [0, 1), got {self.value}")
        else:
            raise ValueError(f"smoothing kind must be 'window' or 'ema', got {self.kind!r}")

    @property
    def label(self) -> str:
        return f"moving average of {int(self.value)}" if self.kind == "window" else f"EMA {self.value:g}"


NO_SMOOTHING = Smoothing("window", 1)


# ---------------------------------------------------------------------- numbers
def _numeric(values: pd.Series) -> pd.Series:
    """Floats with None/NaN/inf all turned into NaN (DB columns arrive as object dtype)."""
    out = pd.to_numeric(values, errors="coerce").astype(float)
    return out.where(np.isfinite(out))


def finite_column(df: pd.DataFrame, name: str) -> pd.Series:
    """The finite values of one column (empty when the column is missing)."""
    if name not in df:
        return pd.Series(dtype=float)
    return _numeric(df[name]).dropna()


def smooth(series: pd.Series, window: int) -> pd.Series:
    """Trailing moving average over the last ``window`` finite values (NaN where the input was not finite)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    values = _numeric(pd.Series(series))
    finite = values.dropna()
    return finite.rolling(int(window), min_periods=1).mean().reindex(values.index)


def ema(series: pd.Series, weight: float) -> pd.Series:
    """TensorBoard-style debiased EMA over the finite values (NaN where the input was not finite).

    With ``adjust=True`` pandas computes ``sum(w**i x_(t-i)) / sum(w**i)``, which is TensorBoard's
    ``last / (1 - w**n)`` debiasing written the other way round.
    """
    if not 0 <= weight < 1:
        raise ValueError(f"EMA weight must be in [0, 1), got {weight}")
    values = _numeric(pd.Series(series))
    finite = values.dropna()
    return finite.ewm(alpha=1 - weight, adjust=True).mean().reindex(values.index)


def apply_smoothing(series: pd.Series, smoothing: Smoothing) -> pd.Series:
    """``smooth`` or ``ema``, as ``smoothing`` says."""
    if smoothing.kind == "ema":
        return ema(series, smoothing.value)
    return smooth(series, int(smoothing.value))


def _smoothed(values: np.ndarray, smoothing: Smoothing) -> np.ndarray:
    """``apply_smoothing`` for a float array with NaN gaps, without the conversions (it runs per refresh)."""
    finite = np.isfinite(values)
    out = np.full(len(values), np.nan)
    series = pd.Series(values[finite])
    if smoothing.kind == "ema":
        out[finite] = series.ewm(alpha=1 - smoothing.value, adjust=True).mean().to_numpy()
    else:
        out[finite] = series.rolling(int(smoothing.value), min_periods=1).mean().to_numpy()
    return out


# ---------------------------------------------------------------------- downsampling
def minmax_indices(values: np.ndarray, max_points: int) -> np.ndarray:
    """Sorted positions that keep the first and last value and every bucket's min and max.

    ``values`` must be finite. The values between the first and last are cut into consecutive buckets
    of ``ceil(inner / ((max_points - 2) // 2))`` values (the last one may be shorter), so at most
    ``max_points`` positions come back. The first occurrence wins on ties. Vectorised (one padded
    reshape and an argmin/argmax per row) because a 100k-step run goes through here on every refresh.
    """
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, got {max_points}")
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    inner = values[1:-1]
    size = -(-len(inner) // ((max_points - 2) // 2))  # ceil division: values per bucket
    rows = -(-len(inner) // size)
    pad = rows * size - len(inner)
    lows = np.concatenate((inner, np.full(pad, np.inf))).reshape(rows, size).argmin(axis=1)
    highs = np.concatenate((inner, np.full(pad, -np.inf))).reshape(rows, size).argmax(axis=1)
    starts = np.arange(rows) * size + 1  # +1: inner starts at position 1
    return np.unique(np.concatenate(([0, n - 1], starts + lows, starts + highs)))


def downsample_minmax(df: pd.DataFrame, x: str, y: str, max_points: int) -> pd.DataFrame:
    """At most ``max_points`` rows of ``df`` that keep the shape of ``y`` over ``x``.

    Rows with a non-finite ``x`` or ``y`` are dropped first. The first and last rows are kept, and
    the rows between them are cut into equal buckets of which the min and the max of ``y`` survive.
    """
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, got {max_points}")
    ys = _numeric(df[y]) if y in df else pd.Series(np.nan, index=df.index)
    xs = _numeric(df[x]) if x in df else pd.Series(np.nan, index=df.index)
    ok = (ys.notna() & xs.notna()).to_numpy()
    order = np.argsort(xs.to_numpy()[ok], kind="stable")
    data = df.loc[ok].iloc[order].reset_index(drop=True)
    return data.iloc[minmax_indices(ys.to_numpy()[ok][order], max_points)].reset_index(drop=True)


# ---------------------------------------------------------------------- preparing a metrics frame
def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df:
        return np.full(len(df), np.nan)
    values = df[name]
    if values.dtype == object:  # DB and snapshot frames: None mixed with numbers
        values = pd.to_numeric(values, errors="coerce")
    out = values.to_numpy(dtype=float, na_value=np.nan)
    return np.where(np.isfinite(out), out, np.nan)


def x_values(df: pd.DataFrame, x: str, steps: np.ndarray | None = None) -> np.ndarray:
    """The x coordinate of every row of ``df`` (sorted by step or not), NaN where it cannot be known.

    ``elapsed_s`` falls back to ``wall_time`` minus the first wall time when no row has it. Rows
    without a value of their own (eval rows carry only step and eval loss) get one interpolated over
    step from the rows that have it, so eval loss can be drawn against every x axis.
    """
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    steps = _column(df, "step") if steps is None else steps
    if x == "step":
        return steps
    values = _column(df, x)
    if x == "elapsed_s" and not np.isfinite(values).any():
        wall = _column(df, "wall_time")
        known = wall[np.isfinite(wall)]
        values = wall - (known[np.argmin(steps[np.isfinite(wall)])] if len(known) else 0.0)
    missing = np.isnan(values) & np.isfinite(steps)
    known = np.isfinite(values) & np.isfinite(steps)
    if missing.any() and known.any():
        order = np.argsort(steps[known], kind="stable")
        values = values.copy()
        values[missing] = np.interp(steps[missing], steps[known][order], values[known][order])
    return values


@dataclass(frozen=True)
class _Prepared:
    """Float columns of a metrics frame sorted by step, with the chosen x filled in."""

    x: str
    step: np.ndarray
    xs: np.ndarray
    columns: dict[str, np.ndarray]


def _prepare(df: pd.DataFrame, x: str, columns: tuple[str, ...]) -> _Prepared:
    steps = _column(df, "step")
    xs = x_values(df, x, steps)
    found = {c: _column(df, c) for c in columns if c in df}
    if np.any(steps[1:] < steps[:-1]):  # frames from the store and the live state come sorted already
        order = np.argsort(steps, kind="stable")
        steps, xs, found = steps[order], xs[order], {c: v[order] for c, v in found.items()}
    return _Prepared(x, steps, xs, found)


def _kept_rows(prep: _Prepared, values: np.ndarray, max_points: int, positive: bool = False,
               also: np.ndarray | None = None) -> np.ndarray:
    """Row positions to plot for one series, in x order: finite x and y (y > 0 for a log axis), min/max
    downsampled to at most ``max_points``. Rows flagged in ``also`` are kept too when they are few
    (at most a quarter of the budget): the loss chart keeps train rows at eval steps that way, so the
    tooltip there lists train and eval loss together."""
    ok = np.isfinite(values) & np.isfinite(prep.xs)
    if positive:
        ok &= values > 0
    rows = np.flatnonzero(ok)
    if prep.x != "step" and np.any(np.diff(prep.xs[rows]) < 0):  # epoch/tokens/time may not follow step
        rows = rows[np.argsort(prep.xs[rows], kind="stable")]
    extra = np.flatnonzero(also[rows]) if also is not None else np.array([], dtype=np.int64)
    if len(extra) > max_points // 4 or max_points - len(extra) < 4:
        extra = extra[:0]
    keep = minmax_indices(values[rows], max_points - len(extra))
    return rows[np.union1d(keep, extra)]


def _series_rows(prep: _Prepared, values: np.ndarray, label: str, key: str, max_points: int,
                 positive: bool = False) -> pd.DataFrame:
    """Downsampled long rows of one series (see ``_kept_rows``)."""
    rows = _kept_rows(prep, values, max_points, positive)
    return _rows_frame(prep, rows, values, label, key)


def _rows_frame(prep: _Prepared, rows: np.ndarray, values: np.ndarray, label: str, key: str) -> pd.DataFrame:
    return _long_frame(prep.x, prep.xs[rows], prep.step[rows], values[rows], label, key)


def _long_frame(x: str, xs, steps, values, label: str, key: str) -> pd.DataFrame:
    data = {x: xs, "step": steps} if x != "step" else {"step": steps}
    data.update(value=values, series=label, key=key)
    return pd.DataFrame(data)


def _empty_rows(x: str) -> pd.DataFrame:
    return _long_frame(x, np.array([], dtype=float), np.array([], dtype=float), np.array([], dtype=float), "", "")


def _concat(parts: list[pd.DataFrame], x: str) -> pd.DataFrame:
    parts = [p for p in parts if not p.empty]
    if not parts:
        return _empty_rows(x)
    data = pd.concat(parts, ignore_index=True)
    if pd.Series(data["step"]).notna().all():
        data["step"] = data["step"].astype(np.int64)  # whole steps read "310", not "310.0"
    return data


# ---------------------------------------------------------------------- chart assembly
def _exact(field: str) -> str:
    """A Vega expression that prints a number exactly (JS shortest round-trip) or a dash."""
    return f"isValid(datum['{field}']) ? '' + datum['{field}'] : '{MISSING}'"


class TrustedLayerChart(alt.LayerChart):
    """A LayerChart whose ``to_dict()`` skips JSON-schema validation unless asked for it.

    Streamlit serialises every chart with ``to_dict()`` on every refresh, and validating one layered
    spec against the Vega-Lite schema costs ~40 ms, more than everything else a refresh does. The specs
    come from the fixed template below; tests validate every variant with ``to_dict(validate=True)``.
    """

    def to_dict(self, validate: bool = False, **kwargs) -> dict:
        return super().to_dict(validate=validate, **kwargs)

    def copy(self, deep: bool | Iterable = True, ignore: list[str] | None = None) -> TrustedLayerChart:
        """As Altair's copy, but a shallow copy skips re-running ``LayerChart.__init__``.

        That init hoists layer params and deep-copies every layer (~10 ms a chart, twice per refresh:
        here and inside ``to_dict``); the template was combined when it was built, so a shallow copy
        only needs its own attribute dict.
        """
        if deep is not False:
            return super().copy(deep=deep, ignore=ignore)
        clone = object.__new__(type(self))
        object.__setattr__(clone, "_args", self._args)  # how SchemaBase.__init__ stores them
        object.__setattr__(clone, "_kwds", dict(self._kwds))
        return clone


@dataclass(frozen=True)
class _Shape:
    """Everything about a chart except its data: the key of the template cache."""

    x: str
    series: tuple[tuple[str, str], ...]  # (key, label) in legend order
    marks: tuple[str, ...]               # per series: "points", "line", "line+points" or "dashed"
    colours: tuple[str, ...] | None      # per series; None: the default scheme
    title: str
    y_title: str
    log_scale: bool
    height: int


@lru_cache(maxsize=256)
def _template(shape: _Shape) -> TrustedLayerChart:
    """The data-free chart of one shape. Built once: building Altair objects costs more than the data."""
    x = shape.x
    labels = [label for _, label in shape.series]
    scale = alt.Scale(domain=labels, range=list(shape.colours)) if shape.colours else alt.Scale(domain=labels)
    y_scale = alt.Scale(type="log") if shape.log_scale else alt.Scale(zero=False)
    base = alt.Chart().encode(
        x=alt.X(f"{x}:Q", title=AXIS_TITLES[x]),
        y=alt.Y("value:Q", title=shape.y_title + (" (log)" if shape.log_scale else ""), scale=y_scale),
        color=alt.Color("series:N", title=None, scale=scale, legend=alt.Legend(orient="bottom")),
    )
    zoom = alt.selection_interval(bind="scales", name="zoom")  # drag pans, wheel zooms, double-click resets
    layers = []
    for i, ((key, _), mark) in enumerate(zip(shape.series, shape.marks)):
        layer = base.transform_filter(alt.datum.key == key)
        if mark == "points":
            layer = layer.mark_circle(size=24, opacity=0.6)
        elif mark == "dashed":  # eval loss: few points, joined by a dashed line
            layer = layer.mark_line(strokeWidth=2, point=True, strokeDash=[4, 3])
        else:
            layer = layer.mark_line(strokeWidth=2, point=mark == "line+points")
        layers.append(layer.add_params(zoom) if i == 0 else layer)

    # The tooltip rule: the browser pivots the long rows to one row per x, so every series' exact
    # value at the hovered x is listed (a dash where a series has no point there).
    nearest = alt.selection_point(nearest=True, on="pointerover", clear="pointerout", fields=[x], empty=False,
                                  name="hover")
    tooltip = [alt.Tooltip("x_text:N", title=X_AXES[x])] if x != "step" else []
    tooltip.append(alt.Tooltip("step:Q", title="step"))
    tooltip += [alt.Tooltip(f"{key}_text:N", title=label) for key, label in shape.series]
    rule = alt.Chart().transform_pivot("key", value="value", groupby=[x] if x == "step" else [x, "step"], op="max")
    for key, _ in shape.series:
        rule = rule.transform_calculate(**{f"{key}_text": _exact(key)})
    if x != "step":
        rule = rule.transform_calculate(x_text=_exact(x))
    rule = rule.mark_rule(color="gray").encode(
        x=alt.X(f"{x}:Q"),
        opacity=alt.when(nearest).then(alt.value(0.6)).otherwise(alt.value(0)),
        tooltip=tooltip,
    ).add_params(nearest)
    return TrustedLayerChart(layer=[*layers, rule], title=shape.title, height=shape.height)


def _chart(data: pd.DataFrame, shape: _Shape) -> TrustedLayerChart:
    chart = _template(shape).copy(deep=False)  # the cached template itself is never changed
    chart.data = data
    return chart


# ---------------------------------------------------------------------- public charts
def _loss_chart(prep: _Prepared, smoothing: Smoothing, log_scale: bool, max_points: int) -> TrustedLayerChart:
    parts, series = [], []
    loss, evals = prep.columns.get("loss"), prep.columns.get("eval_loss")
    has_evals = evals is not None and np.isfinite(evals).any()
    if loss is not None and np.isfinite(loss).any():
        # Raw and smoothed loss share their rows (picked by the raw min/max), so the tooltip at a
        # step shows both; the smoothed line is smooth, so sampling it there loses nothing.
        rows = _kept_rows(prep, loss, max_points, log_scale, also=np.isfinite(evals) if has_evals else None)
        smoothed = _smoothed(loss, smoothing)
        smooth_rows = rows[smoothed[rows] > 0] if log_scale else rows
        parts += [_rows_frame(prep, rows, loss, RAW_LOSS, "raw"),
                  _rows_frame(prep, smooth_rows, smoothed, SMOOTH_LOSS, "smooth")]
        series += [("raw", RAW_LOSS), ("smooth", SMOOTH_LOSS)]
    if has_evals:
        parts.append(_series_rows(prep, evals, EVAL_LOSS, "eval", max_points, log_scale))
        series.append(("eval", EVAL_LOSS))
    data = _concat(parts, prep.x)
    series = series or [("raw", RAW_LOSS)]
    marks = {"raw": "points", "smooth": "line", "eval": "dashed"}
    return _chart(data, _Shape(prep.x, tuple(series), tuple(marks[key] for key, _ in series),
                               tuple(LOSS_COLOURS[label] for _, label in series), "Loss", "loss", log_scale,
                               LOSS_HEIGHT))


def _line_chart(prep: _Prepared, y: str, title: str, max_points: int) -> TrustedLayerChart:
    values = prep.columns.get(y, np.full(len(prep.step), np.nan))
    data = _concat([_series_rows(prep, values, title, "v", max_points)], prep.x)
    many = int(np.isfinite(values).sum()) >= 40
    return _chart(data, _Shape(prep.x, (("v", title),), ("line" if many else "line+points",), (LINE_COLOUR,), title,
                               title, False, LINE_HEIGHT))


def loss_chart(df: pd.DataFrame, x: str = "step", smoothing: Smoothing = Smoothing("window", 10),
               log_scale: bool = False, max_points: int = 1000) -> TrustedLayerChart:
    """Raw train-loss points, their smoothed line and eval loss (when the run has any) on one y axis.

    Smoothing runs on the full-resolution loss; each series is then min/max downsampled to at most
    ``max_points`` points. On a log axis, values <= 0 are left out (they have no place on it).
    """
    return _loss_chart(_prepare(df, x, ("loss", "eval_loss")), smoothing, log_scale, max_points)


def line_chart(df: pd.DataFrame, y: str, title: str, x: str = "step", max_points: int = 1000) -> TrustedLayerChart:
    """One metric (learning rate, grad norm, tokens/s) over ``x``, NaN-free and downsampled."""
    return _line_chart(_prepare(df, x, (y,)), y, title, max_points)


def method_specs(config: dict) -> tuple[MetricSpec, ...]:
    """The metric specs of a run's method, from its stored config (old configs name a training_type)."""
    method, _ = methods.pair_of_config(config or {})
    spec = methods.METHODS.get(method)
    return spec.metric_specs_of(config or {}) if spec is not None else DEFAULT_SPECS


def line_metrics(specs: Iterable[MetricSpec] = DEFAULT_SPECS, extra: Iterable[str] = ()) -> dict[str, str]:
    """Key -> title of the small charts: the charted specs besides the loss chart's, then ``extra`` keys
    (titled by their key) that no spec charts already."""
    lines = {s.key: s.label for s in specs if s.chart and s.key not in LOSS_KEYS}
    for key in extra:
        if key not in LOSS_KEYS:
            lines.setdefault(key, key)
    return lines


def live_charts(df: pd.DataFrame, x: str = "step", smoothing: Smoothing = Smoothing("window", 10),
                log_scale: bool = False, max_points: int = 1000, specs: Iterable[MetricSpec] = DEFAULT_SPECS,
                extra: Iterable[str] = ()) -> dict[str, TrustedLayerChart]:
    """Every chart of the live page: ``"loss"`` always, then one per charted metric spec with data, then one
    per ``extra`` key (the "other metrics" asked for) with data, keyed by metric key."""
    lines = line_metrics(specs, extra)
    prep = _prepare(df, x, ("loss", "eval_loss", *lines))
    out = {"loss": _loss_chart(prep, smoothing, log_scale, max_points)}
    for column, title in lines.items():
        values = prep.columns.get(column)
        if values is not None and np.isfinite(values).any():
            out[column] = _line_chart(prep, column, title, max_points)
    return out


def compare_chart(frames: dict[str, pd.DataFrame], metric: str = "loss", align: str = "step",
                  smoothing: Smoothing = Smoothing("window", 10), max_points: int = 500,
                  title: str = "") -> TrustedLayerChart:
    """One line per run label of train loss (smoothed), eval loss or any other metric key (as logged),
    aligned by step or tokens; ``title`` names a metric besides ``COMPARE_METRICS`` (its key by default).

    Only train loss is smoothed: each eval point is already a mean over the whole eval set, and other
    metrics are drawn as the trainer logged them.
    """
    if not isinstance(metric, str) or not metric or metric == "step":
        raise ValueError(f"metric must be a metric key such as {', '.join(COMPARE_METRICS)}, got {metric!r}")
    if align not in COMPARE_ALIGN:
        raise ValueError(f"align must be one of {', '.join(COMPARE_ALIGN)}, got {align!r}")
    parts, series = [], []
    for i, (label, df) in enumerate(frames.items()):
        key = f"r{i}"
        series.append((key, label))
        prep = _prepare(df, align, (metric,))
        values = prep.columns.get(metric)
        if values is None:
            continue
        if metric == "loss":
            values = _smoothed(values, smoothing)
        parts.append(_series_rows(prep, values, label, key, max_points))
    data = _concat(parts, align)
    many = max((int((data["key"] == k).sum()) for k, _ in series), default=0) >= 40
    # The smoothing goes into the axis title: the theme colours axis titles, but not subtitles.
    title = COMPARE_METRICS.get(metric) or title or metric
    y_title = title.lower() if metric in COMPARE_METRICS else title
    if metric == "loss" and smoothing != NO_SMOOTHING:
        y_title += f" ({smoothing.label})"
    colours = RUN_COLOURS[:len(series)] if len(series) <= len(RUN_COLOURS) else None
    return _chart(data, _Shape(align, tuple(series), ("line" if many else "line+points",) * len(series), colours,
                               title, y_title, False, LOSS_HEIGHT))


def length_chart(lengths: Iterable[int], max_seq_length: int, bins: int = 40) -> alt.LayerChart:
    """Histogram of token lengths, binned here (a 100k-row dataset sends ``bins`` bars), max_seq_length marked."""
    values = np.asarray(list(lengths), dtype=float)
    top = max(float(values.max()) if len(values) else 0.0, float(max_seq_length), 1.0)
    counts, edges = np.histogram(values, bins=bins, range=(0.0, top))
    bars = pd.DataFrame({"start": edges[:-1], "end": edges[1:], "rows": counts,
                         "part": np.where(edges[1:] > max_seq_length, "truncated", "fits")})
    bar = alt.Chart(bars).mark_bar().encode(
        x=alt.X("start:Q", title="tokens per row"), x2="end:Q", y=alt.Y("rows:Q", title="rows"),
        color=alt.Color("part:N", scale=alt.Scale(domain=["fits", "truncated"], range=["#4c78a8", "#e45756"]),
                        legend=alt.Legend(title=None, orient="top")),
        tooltip=[alt.Tooltip("start:Q", format=".0f"), alt.Tooltip("end:Q", format=".0f"), "rows:Q"])
    rule = alt.Chart(pd.DataFrame({"max_seq_length": [max_seq_length]})).mark_rule(
        color="#e45756", strokeDash=[5, 3], size=2).encode(x="max_seq_length:Q", tooltip=["max_seq_length:Q"])
    return alt.layer(bar, rule).properties(height=LENGTH_HEIGHT)
