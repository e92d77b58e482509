"""Chart builders: min/max downsampling, smoothing, and the data each chart plots."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from trainer_core.views import charts
from ui.views import ChartOptions


def chart_rows(chart) -> pd.DataFrame:
    """The one long-format dataset a chart plots, read back from its Vega-Lite dict."""
    datasets = chart.to_dict()["datasets"]
    assert len(datasets) == 1
    return pd.DataFrame(next(iter(datasets.values())))


def series(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    return rows[rows["series"] == name].reset_index(drop=True)


# ---------------------------------------------------------------------- downsample_minmax
def test_downsample_keeps_small_frames_whole():
    df = pd.DataFrame({"step": [1, 2, 3], "loss": [3.0, 2.0, 1.0]})
    out = charts.downsample_minmax(df, "step", "loss", 10)
    assert out["loss"].tolist() == [3.0, 2.0, 1.0]


def test_downsample_is_bounded_and_keeps_extremes_first_and_last():
    rng = np.random.default_rng(0)
    n = 100_000
    df = pd.DataFrame({"step": np.arange(n), "loss": rng.normal(2.0, 0.1, n)})
    df.loc[54_321, "loss"] = 50.0   # a spike must survive
    df.loc[12_345, "loss"] = -50.0  # and a dip
    out = charts.downsample_minmax(df, "step", "loss", 1000)
    assert len(out) <= 1000
    assert out["step"].iloc[0] == 0 and out["step"].iloc[-1] == n - 1
    assert out["loss"].iloc[0] == df["loss"].iloc[0] and out["loss"].iloc[-1] == df["loss"].iloc[-1]
    assert 50.0 in out["loss"].tolist() and -50.0 in out["loss"].tolist()
    assert out["step"].is_monotonic_increasing and out["step"].is_unique


def test_downsample_keeps_every_bucket_min_and_max():
    n, max_points = 1002, 102  # 1000 inner rows in 50 buckets of 20
    values = np.sin(np.arange(n) * 0.37) + np.arange(n) * 0.001
    df = pd.DataFrame({"step": np.arange(n), "loss": values})
    out = charts.downsample_minmax(df, "step", "loss", max_points)
    assert len(out) == max_points
    kept = set(out["step"])
    for b in range(50):
        inner = df.iloc[1 + b * 20: 1 + (b + 1) * 20]
        assert inner["loss"].idxmin() in kept and inner["loss"].idxmax() in kept


def test_downsample_drops_non_finite_and_keeps_other_columns():
    df = pd.DataFrame({"step": range(10), "loss": [1.0, np.nan, 2.0, np.inf, None, 3.0, -np.inf, 4.0, 5.0, 6.0],
                       "epoch": np.arange(10) / 10})
    out = charts.downsample_minmax(df, "step", "loss", 4)
    assert len(out) <= 4
    assert all(math.isfinite(v) for v in out["loss"])
    assert out["step"].iloc[0] == 0 and out["step"].iloc[-1] == 9
    assert "epoch" in out


def test_downsample_handles_all_nan_and_empty():
    assert charts.downsample_minmax(pd.DataFrame({"step": [1, 2], "loss": [None, np.nan]}), "step", "loss", 10).empty
    assert charts.downsample_minmax(pd.DataFrame({"step": [], "loss": []}), "step", "loss", 10).empty
    with pytest.raises(ValueError):
        charts.downsample_minmax(pd.DataFrame({"step": [1], "loss": [1.0]}), "step", "loss", 3)


# ---------------------------------------------------------------------- smooth
def test_smooth_is_a_trailing_mean():
    out = charts.smooth(pd.Series([1.0, 2.0, 3.0, 4.0, 10.0]), 2)
    assert out.tolist() == [1.0, 1.5, 2.5, 3.5, 7.0]
    out = charts.smooth(pd.Series([3.0, 6.0, 9.0, 12.0]), 3)
    assert out.tolist() == [3.0, 4.5, 6.0, 9.0]


def test_smooth_skips_non_finite_values():
    out = charts.smooth(pd.Series([1.0, np.nan, 3.0, np.inf, 5.0]), 2)
    assert out.iloc[0] == 1.0 and out.iloc[2] == 2.0 and out.iloc[4] == 4.0
    assert math.isnan(out.iloc[1]) and math.isnan(out.iloc[3])


def test_minmax_indices_keep_each_bucket_extremes_with_uneven_buckets():
    rng = np.random.default_rng(3)
    values = rng.normal(size=1234)
    keep = charts.minmax_indices(values, 100)
    # 1232 inner values in buckets of ceil(1232 / 49) = 26
    assert len(keep) <= 100 and keep[0] == 0 and keep[-1] == 1233
    inner = values[1:-1]
    for start in range(0, len(inner), 26):
        bucket = inner[start:start + 26]
        assert start + 1 + int(np.argmin(bucket)) in keep and start + 1 + int(np.argmax(bucket)) in keep
    assert set(keep) <= {0, 1233} | {1 + s + int(np.argmin(inner[s:s + 26])) for s in range(0, 1232, 26)} \
        | {1 + s + int(np.argmax(inner[s:s + 26])) for s in range(0, 1232, 26)}


# ---------------------------------------------------------------------- ema and Smoothing
def tensorboard_ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing loop, written out: the reference the vectorised EMA must match."""
    out, last, count = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(math.nan)
            continue
        last = last * weight + (1 - weight) * v
        count += 1
        out.append(last / (1 - weight ** count))
    return out


def test_ema_is_debiased():
    out = charts.ema(pd.Series([1.0, 2.0, 3.0]), 0.5)
    # (1) / 1, (2 + .5*1) / 1.5, (3 + .5*2 + .25*1) / 1.75
    assert out.tolist() == pytest.approx([1.0, 5 / 3, 17 / 7], rel=1e-15)
    assert charts.ema(pd.Series([4.0, 1.0, 7.0]), 0.0).tolist() == [4.0, 1.0, 7.0]


def test_ema_matches_tensorboard_and_skips_non_finite_values():
    rng = np.random.default_rng(1)
    values = rng.normal(2.0, 0.5, 300).tolist()
    values[17], values[150] = math.nan, math.inf
    ours = charts.ema(pd.Series(values), 0.9).tolist()
    reference = tensorboard_ema(values, 0.9)
    assert math.isnan(ours[17]) and math.isnan(ours[150])
    assert [v for v in ours if not math.isnan(v)] == pytest.approx([v for v in reference if not math.isnan(v)],
                                                                    rel=1e-12)


def test_apply_smoothing_follows_the_kind():
    data = pd.Series([1.0, 2.0, 3.0])
    assert charts.apply_smoothing(data, charts.Smoothing("window", 2)).tolist() == [1.0, 1.5, 2.5]
    assert charts.apply_smoothing(data, charts.Smoothing("ema", 0.5)).tolist() == pytest.approx([1.0, 5 / 3, 17 / 7])
    assert charts.apply_smoothing(data, charts.NO_SMOOTHING).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("kind, value", [("window", 0), ("window", 2.5), ("ema", 1.0), ("ema", -0.1), ("median", 3)])
def test_smoothing_rejects_bad_settings(kind, value):
    with pytest.raises(ValueError):
        charts.Smoothing(kind, value)


# ---------------------------------------------------------------------- loss_chart
def layer_tooltips(chart) -> dict[str, str]:
    rule = chart.to_dict()["layer"][-1]
    return {t["field"]: t["title"] for t in rule["encoding"]["tooltip"]}


def test_loss_chart_plots_raw_and_smoothed_loss():
    df = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [4.0, 2.0, 3.0, 1.0], "eval_loss": [None] * 4})
    rows = chart_rows(charts.loss_chart(df, smoothing=charts.Smoothing("window", 2)))
    assert set(rows["series"]) == {charts.RAW_LOSS, charts.SMOOTH_LOSS}
    raw = series(rows, charts.RAW_LOSS)
    assert raw["step"].tolist() == [1, 2, 3, 4] and raw["value"].tolist() == [4.0, 2.0, 3.0, 1.0]
    assert series(rows, charts.SMOOTH_LOSS)["value"].tolist() == [4.0, 3.0, 2.5, 2.0]


def test_loss_chart_smooths_with_ema():
    df = pd.DataFrame({"step": [1, 2, 3], "loss": [1.0, 2.0, 3.0]})
    chart = charts.loss_chart(df, smoothing=charts.Smoothing("ema", 0.5))
    assert series(chart_rows(chart), charts.SMOOTH_LOSS)["value"].tolist() == pytest.approx([1.0, 5 / 3, 17 / 7])
    assert chart.to_dict()["title"] == "Loss"


def test_loss_chart_overlays_eval_loss_with_an_exact_tooltip_at_each_step():
    df = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [4.0, 3.0, 2.0, 1.0], "eval_loss": [None, 2.5, None, 1.5]})
    chart = charts.loss_chart(df)
    rows = chart_rows(chart)
    assert series(rows, charts.EVAL_LOSS)[["step", "value"]].values.tolist() == [[2, 2.5], [4, 1.5]]
    spec = chart.to_dict()
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == list(charts.LOSS_SERIES)
    assert spec["layer"][0]["encoding"]["color"]["scale"]["range"] == [charts.LOSS_COLOURS[s] for s in charts.LOSS_SERIES]
    assert layer_tooltips(chart) == {"step": "step", "raw_text": charts.RAW_LOSS, "smooth_text": charts.SMOOTH_LOSS,
                                     "eval_text": charts.EVAL_LOSS}
    rule = spec["layer"][-1]
    assert rule["mark"]["type"] == "rule"
    assert rule["transform"][0] == {"pivot": "key", "value": "value", "groupby": ["step"], "op": "max"}
    # numbers are printed by JS string conversion (shortest exact form), never through a rounding format
    assert {"calculate": "isValid(datum['raw']) ? '' + datum['raw'] : '—'", "as": "raw_text"} in rule["transform"]
    hover = next(p for p in spec["params"] if p["name"] == "hover")
    assert hover["select"] == {"type": "point", "clear": "pointerout", "fields": ["step"], "nearest": True,
                               "on": "pointerover"}


def test_loss_chart_zooms_and_pans_through_scales():
    spec = charts.loss_chart(pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.0]})).to_dict()
    zoom = next(p for p in spec["params"] if p["name"] == "zoom")
    assert zoom["select"] == {"type": "interval"} and zoom["bind"] == "scales"


def test_loss_chart_log_scale_drops_values_that_have_no_log():
    df = pd.DataFrame({"step": [1, 2, 3], "loss": [2.0, 0.0, 1.0], "eval_loss": [None, -1.0, 0.5]})
    chart = charts.loss_chart(df, log_scale=True, smoothing=charts.NO_SMOOTHING)
    spec = chart.to_dict()
    assert spec["layer"][0]["encoding"]["y"]["scale"] == {"type": "log"}
    assert spec["layer"][0]["encoding"]["y"]["title"] == "loss (log)"
    rows = chart_rows(chart)
    assert series(rows, charts.RAW_LOSS)["value"].tolist() == [2.0, 1.0]
    assert series(rows, charts.EVAL_LOSS)["value"].tolist() == [0.5]
    linear = charts.loss_chart(df).to_dict()
    assert linear["layer"][0]["encoding"]["y"]["scale"] == {"zero": False}


def test_loss_chart_drops_nan_and_inf():
    df = pd.DataFrame({"step": [1, 2, 3, 4, 5], "loss": [2.0, np.nan, 1.0, np.inf, 0.5],
                       "eval_loss": [np.nan] * 5})
    rows = chart_rows(charts.loss_chart(df, smoothing=charts.Smoothing("window", 2)))
    assert charts.EVAL_LOSS not in set(rows["series"])
    assert all(math.isfinite(v) for v in rows["value"])
    assert series(rows, charts.RAW_LOSS)["step"].tolist() == [1, 3, 5]
    # the moving average runs over the finite values only: (2+1)/2, (1+0.5)/2
    assert series(rows, charts.SMOOTH_LOSS)["value"].tolist() == [2.0, 1.5, 0.75]


def test_loss_chart_smooths_before_downsampling():
    n = 10_000
    df = pd.DataFrame({"step": np.arange(n), "loss": np.where(np.arange(n) % 2 == 0, 1.0, 3.0)})
    rows = chart_rows(charts.loss_chart(df, smoothing=charts.Smoothing("window", 10), max_points=200))
    assert len(series(rows, charts.RAW_LOSS)) <= 200 and len(series(rows, charts.SMOOTH_LOSS)) <= 200
    # a full-resolution average of alternating 1/3 is 2 after warm-up; averaging thinned points would not be
    assert series(rows, charts.SMOOTH_LOSS)["value"].iloc[-1] == pytest.approx(2.0)


def test_raw_and_smoothed_loss_share_their_steps_and_keep_eval_steps():
    n = 5000
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"step": np.arange(1, n + 1), "loss": rng.normal(2.0, 0.2, n)})
    df.loc[df["step"] % 100 == 0, "eval_loss"] = 1.9
    rows = chart_rows(charts.loss_chart(df, max_points=400))
    raw, smoothed = series(rows, charts.RAW_LOSS), series(rows, charts.SMOOTH_LOSS)
    assert raw["step"].tolist() == smoothed["step"].tolist()  # one tooltip row holds both
    assert len(raw) <= 400
    eval_steps = list(range(100, n + 1, 100))
    assert set(eval_steps) <= set(raw["step"])  # 50 eval steps fit in a quarter of the budget
    # with more eval steps than a quarter of the budget, the budget goes to min/max alone
    assert not set(eval_steps) <= set(series(chart_rows(charts.loss_chart(df, max_points=150)), charts.RAW_LOSS)["step"])


def test_loss_chart_accepts_database_frames_with_object_columns():
    df = pd.DataFrame({"step": [1, 2], "loss": [1.5, None], "eval_loss": [None, None]}, dtype=object)
    rows = chart_rows(charts.loss_chart(df))
    assert series(rows, charts.RAW_LOSS)["value"].tolist() == [1.5]


def test_loss_chart_of_empty_frame_has_no_rows():
    assert chart_rows(charts.loss_chart(pd.DataFrame(columns=["step", "loss", "eval_loss"]))).empty


def test_charts_built_from_one_template_keep_their_own_data():
    first = charts.loss_chart(pd.DataFrame({"step": [1, 2], "loss": [5.0, 4.0]}))
    second = charts.loss_chart(pd.DataFrame({"step": [1, 2], "loss": [9.0, 8.0]}))
    assert series(chart_rows(first), charts.RAW_LOSS)["value"].tolist() == [5.0, 4.0]
    assert series(chart_rows(second), charts.RAW_LOSS)["value"].tolist() == [9.0, 8.0]
    assert first.to_dict()["layer"] == second.to_dict()["layer"]


# ---------------------------------------------------------------------- x axes
TRAIN_AND_EVAL = pd.DataFrame({
    "step": [5, 6, 7, 8],
    "epoch": [0.5, None, 0.7, None],
    "loss": [2.0, None, 1.8, None],
    "eval_loss": [None, 1.9, None, 1.7],
    "tokens_seen": [500, None, 700, None],
    "elapsed_s": [None] * 4,
    "wall_time": [1000.0, 1010.0, 1020.0, 1030.0],
}, dtype=object)


def test_eval_rows_get_their_x_interpolated_over_step():
    assert charts.x_values(TRAIN_AND_EVAL, "epoch").tolist() == pytest.approx([0.5, 0.6, 0.7, 0.7])
    assert charts.x_values(TRAIN_AND_EVAL, "tokens_seen").tolist() == [500, 600, 700, 700]
    # no elapsed_s anywhere: wall time since the first logged row
    assert charts.x_values(TRAIN_AND_EVAL, "elapsed_s").tolist() == [0.0, 10.0, 20.0, 30.0]
    assert charts.x_values(TRAIN_AND_EVAL, "step").tolist() == [5, 6, 7, 8]
    with pytest.raises(ValueError):
        charts.x_values(TRAIN_AND_EVAL, "loss")


def test_elapsed_seconds_win_over_wall_time_when_logged():
    df = pd.DataFrame({"step": [1, 2, 3], "elapsed_s": [3.0, None, 5.0], "wall_time": [100.0, 200.0, 300.0]})
    assert charts.x_values(df, "elapsed_s").tolist() == [3.0, 4.0, 5.0]


@pytest.mark.parametrize("x", list(charts.X_AXES))
def test_eval_loss_is_drawn_on_every_x_axis(x):
    chart = charts.loss_chart(TRAIN_AND_EVAL, x=x, smoothing=charts.NO_SMOOTHING)
    rows = chart_rows(chart)
    evals = series(rows, charts.EVAL_LOSS)
    assert evals["value"].tolist() == [1.9, 1.7] and evals["step"].tolist() == [6, 8]
    expected = {"step": [6, 8], "epoch": [0.6, 0.7], "tokens_seen": [600, 700], "elapsed_s": [10.0, 30.0]}[x]
    assert evals[x].tolist() == pytest.approx(expected)
    spec = chart.to_dict()
    assert spec["layer"][0]["encoding"]["x"] == {"field": x, "title": charts.AXIS_TITLES[x], "type": "quantitative"}
    if x != "step":
        assert layer_tooltips(chart)["x_text"] == charts.X_AXES[x]


# ---------------------------------------------------------------------- line charts and live_charts
def test_line_chart_is_one_finite_series():
    df = pd.DataFrame({"step": [1, 2, 3], "grad_norm": [0.5, np.nan, 0.7]})
    chart = charts.line_chart(df, "grad_norm", "Grad norm")
    rows = chart_rows(chart)
    assert rows[["step", "value"]].values.tolist() == [[1, 0.5], [3, 0.7]]
    assert set(rows["series"]) == {"Grad norm"}
    spec = chart.to_dict()
    assert any(p.get("bind") == "scales" for p in spec["params"])
    assert layer_tooltips(chart) == {"step": "step", "v_text": "Grad norm"}


def test_line_chart_follows_the_x_axis():
    df = pd.DataFrame({"step": [1, 2], "tokens_seen": [100, 200], "learning_rate": [1e-4, 2e-4]})
    rows = chart_rows(charts.line_chart(df, "learning_rate", "Learning rate", x="tokens_seen"))
    assert rows[["tokens_seen", "step", "value"]].values.tolist() == [[100, 1, 1e-4], [200, 2, 2e-4]]


def test_line_chart_downsamples():
    df = pd.DataFrame({"step": np.arange(5000), "learning_rate": np.linspace(2e-4, 0, 5000)})
    assert len(chart_rows(charts.line_chart(df, "learning_rate", "Learning rate", max_points=100))) <= 100


def big_run(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    step = np.arange(1, n + 1)
    df = pd.DataFrame({"step": step, "epoch": step / n, "loss": 2 + rng.normal(0, 0.3, n),
                       "learning_rate": np.linspace(2e-4, 0, n), "grad_norm": rng.gamma(2.0, 1.0, n),
                       "tokens_seen": step * 512, "tokens_per_s": rng.normal(3000, 100, n), "elapsed_s": step * 0.5})
    df.loc[step % 50 == 0, "eval_loss"] = 1.9 + rng.normal(0, 0.05, n // 50)
    df.loc[[10, 20], "loss"] = np.nan
    return df


def test_live_charts_bound_points_per_series_at_100k_rows():
    built = charts.live_charts(big_run(100_000), max_points=1000)
    assert list(built) == ["loss", "learning_rate", "grad_norm", "tokens_per_s"]
    for name, chart in built.items():
        counts = chart_rows(chart)["series"].value_counts()
        assert (counts <= 1000).all(), (name, counts)
        # bounded, not starved: whole buckets of ceil(rows / 499) values; 2,000 eval rows give 400 buckets
        assert counts.min() >= 800, (name, counts)
    loss = chart_rows(built["loss"])
    assert set(loss["series"]) == set(charts.LOSS_SERIES)


def test_live_charts_leave_out_metrics_without_data():
    df = pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.0], "grad_norm": [None, None]}, dtype=object)
    assert list(charts.live_charts(df)) == ["loss"]


@pytest.mark.parametrize("x", list(charts.X_AXES))
@pytest.mark.parametrize("log_scale", [False, True])
def test_every_chart_variant_is_valid_vega_lite(x, log_scale):
    for chart in charts.live_charts(big_run(300), x=x, smoothing=charts.Smoothing("ema", 0.6),
                                    log_scale=log_scale).values():
        chart.to_dict(validate=True)  # raises on a spec the schema rejects
    frames = {"a": big_run(300), "b.weird [name]": big_run(200)}
    for metric in charts.COMPARE_METRICS:
        for align in charts.COMPARE_ALIGN:
            charts.compare_chart(frames, metric=metric, align=align).to_dict(validate=True)


# ---------------------------------------------------------------------- compare_chart
def test_compare_chart_has_one_series_per_run():
    frames = {"a": pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.0]}),
              "b": pd.DataFrame({"step": [1, 2], "loss": [3.0, np.nan]})}
    chart = charts.compare_chart(frames, smoothing=charts.Smoothing("window", 2))
    rows = chart_rows(chart)
    assert series(rows, "a")["value"].tolist() == [2.0, 1.5]
    assert series(rows, "b")["value"].tolist() == [3.0]
    spec = chart.to_dict()
    assert spec["layer"][0]["encoding"]["color"]["scale"] == {"domain": ["a", "b"],
                                                              "range": list(charts.RUN_COLOURS[:2])}
    assert layer_tooltips(chart) == {"step": "step", "r0_text": "a", "r1_text": "b"}
    assert spec["layer"][0]["encoding"]["y"]["title"] == "train loss (moving average of 2)"


def test_compare_chart_aligns_eval_loss_by_tokens_without_smoothing():
    frames = {"a": pd.DataFrame({"step": [1, 2, 3], "tokens_seen": [10, 20, 30], "eval_loss": [None, 2.0, 1.0]}),
              "b": pd.DataFrame({"step": [1, 2], "tokens_seen": [50, 100], "eval_loss": [4.0, 3.0]})}
    rows = chart_rows(charts.compare_chart(frames, metric="eval_loss", align="tokens_seen",
                                           smoothing=charts.Smoothing("window", 5)))
    assert series(rows, "a")[["tokens_seen", "value"]].values.tolist() == [[20, 2.0], [30, 1.0]]
    assert series(rows, "b")[["tokens_seen", "value"]].values.tolist() == [[50, 4.0], [100, 3.0]]


def test_compare_chart_rejects_a_missing_metric_and_unknown_alignment():
    # any metric key compares (issue 18: open metrics); only a missing one or the x column itself is refused
    for metric in ("", "step"):
        with pytest.raises(ValueError, match="metric must be a metric key such as loss, eval_loss"):
            charts.compare_chart({}, metric=metric)
    with pytest.raises(ValueError):
        charts.compare_chart({}, align="epoch")


def test_compare_chart_of_an_open_metric_key_is_titled_and_not_smoothed():
    frames = {"a": pd.DataFrame({"step": [1, 2, 3], "rewards/format/mean": [0.1, 0.9, 0.2]}),
              "b": pd.DataFrame({"step": [1, 2], "loss": [1.0, 0.5]})}
    spec = charts.compare_chart(frames, metric="rewards/format/mean", smoothing=charts.Smoothing("window", 3)).to_dict()
    data = spec["datasets"][spec["data"]["name"]]
    assert [(d["key"], d["step"], d["value"]) for d in data] == [("r0", 1, 0.1), ("r0", 2, 0.9), ("r0", 3, 0.2)]
    assert spec["title"] == "rewards/format/mean"
    assert spec["layer"][0]["encoding"]["y"]["title"] == "rewards/format/mean"
    titled = charts.compare_chart(frames, metric="rewards/format/mean", title="Format reward").to_dict()
    assert (titled["title"], titled["layer"][0]["encoding"]["y"]["title"]) == ("Format reward", "Format reward")


# ---------------------------------------------------------------------- chart controls and rendering (ui.views)
def _controls_and_charts(df):
    import streamlit as st

    from ui.views import chart_controls, render_charts

    options = chart_controls("t")
    st.session_state["options"] = options
    render_charts(df, options)


def test_chart_controls_drive_the_charts():
    df = pd.DataFrame({"step": [1, 2, 3], "epoch": [0.1, 0.2, 0.3], "loss": [1.0, 2.0, 3.0],
                       "grad_norm": [1.0, 1.0, 2.0]})
    at = AppTest.from_function(_controls_and_charts, args=(df,), default_timeout=30).run()
    assert not at.exception, at.exception
    assert at.session_state["options"] == ChartOptions()
    assert len(at.get("vega_lite_chart")) == 2  # loss and grad norm (no learning rate or tokens/s logged)
    at.selectbox(key="t_x").set_value("epoch").run()
    at.radio(key="t_smoothing").set_value("ema").run()
    at.slider(key="t_ema").set_value(0.5).run()
    at.toggle(key="t_log").set_value(True).run()
    assert not at.exception, at.exception
    assert at.session_state["options"] == ChartOptions("epoch", charts.Smoothing("ema", 0.5), True)
    loss = at.get("vega_lite_chart")[0]
    spec = json.loads(loss.proto.spec)
    assert spec["layer"][0]["encoding"]["x"]["field"] == "epoch"
    assert spec["layer"][0]["encoding"]["y"]["scale"] == {"type": "log"}
    rows = dataframe_util.convert_arrow_bytes_to_pandas_df(loss.proto.datasets[0].data.data)
    assert series(rows, charts.SMOOTH_LOSS)["value"].tolist() == pytest.approx([1.0, 5 / 3, 17 / 7])
    # the choice survives a rerun, and a page that does not draw the widgets keeps it for later
    assert at.session_state["_saved_t_x"] == "epoch" and at.session_state["_saved_t_ema"] == 0.5


def _live_with_open_metrics(snapshot, specs):
    from ui.views import render_live

    render_live(snapshot, specs=specs, picker="lv")


def test_live_view_tiles_spec_keys_and_charts_picked_other_keys():
    """Issue 18: a method's specs tile an open key; any other key the run logged is offered and charted."""
    from trainer_core.jobs.live import LiveRun
    from trainer_core.methods.base import MetricSpec
    from trainer_core.protocol.status import RunStatus

    live = LiveRun("r", "grpo", RunStatus.RUNNING)
    for step in (1, 2, 3):
        live.add_metric({"step": step, "loss": 1.0 / step, "rewards/format/mean": step / 4, "kl": 0.1 * step})
    snapshot = live.snapshot()
    assert snapshot.metric_keys == ("rewards/format/mean", "kl")
    specs = (*charts.DEFAULT_SPECS, MetricSpec("rewards/format/mean", "Format reward", format=".0%", tile=True))
    at = AppTest.from_function(_live_with_open_metrics, args=(snapshot, specs), default_timeout=30).run()
    assert not at.exception, at.exception
    tile = next(m for m in at.metric if m.label == "Format reward")
    assert tile.value == "75%"
    assert at.multiselect(key="lv_extra").options == ["kl"]  # the spec charts the reward already
    titles = [json.loads(c.proto.spec)["title"] for c in at.get("vega_lite_chart")]
    assert titles == ["Loss", "Format reward"]
    at.multiselect(key="lv_extra").select("kl").run()
    assert [json.loads(c.proto.spec)["title"] for c in at.get("vega_lite_chart")] == ["Loss", "Format reward", "kl"]
    kl = at.get("vega_lite_chart")[2]
    rows = dataframe_util.convert_arrow_bytes_to_pandas_df(kl.proto.datasets[0].data.data)
    assert rows["value"].tolist() == pytest.approx([0.1, 0.2, 0.3])


# ---------------------------------------------------------------------- token lengths (New run preview)
def test_length_chart_bins_here_and_marks_max_seq_length():
    lengths = [10] * 500 + [300, 900]
    spec = charts.length_chart(lengths, max_seq_length=256).to_dict()
    frames = [pd.DataFrame(rows) for rows in spec["datasets"].values()]
    bars = next(f for f in frames if "rows" in f)
    assert len(bars) == 40 and bars["rows"].sum() == 502  # 502 rows arrive as 40 bars
    assert bars["end"].max() == 900  # the longest row sets the range
    assert set(bars[bars["start"] >= 256]["part"]) == {"truncated"}
    assert set(bars[bars["end"] <= 256]["part"]) == {"fits"}
    assert next(f for f in frames if "max_seq_length" in f)["max_seq_length"].tolist() == [256]
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["bar", "rule"]
    assert spec["height"] == charts.LENGTH_HEIGHT


def test_length_chart_of_no_rows_spans_max_seq_length():
    bars = pd.DataFrame(next(iter(charts.length_chart([], max_seq_length=128).to_dict()["datasets"].values())))
    assert bars["rows"].sum() == 0 and bars["end"].max() == 128


def test_a_runs_charts_come_from_its_methods_metric_specs(monkeypatch):
    from trainer_core import methods
    from trainer_core.methods.base import MetricSpec

    # sft and cpt (also as an old training_type) keep today's charts: loss, then learning rate, grad norm, tokens/s
    for config in ({"method": "sft"}, {"method": "cpt", "adapter": "full"}, {"training_type": "qlora"}, {}):
        assert charts.line_metrics(charts.method_specs(config)) == {
            "learning_rate": "Learning rate", "grad_norm": "Grad norm", "tokens_per_s": "Tokens/s"}, config
    assert charts.method_specs({"method": "not-registered"}) is charts.DEFAULT_SPECS
    grpo = methods.METHODS["sft"].__class__(
        name="grpo-test", label="GRPO", help="", data_shapes=("chat",), data_fix="",
        metric_specs=(MetricSpec("loss", "Train loss"), MetricSpec("reward", "Reward", tile=True),
                      MetricSpec("kl", "KL", chart=False)))
    monkeypatch.setitem(methods.METHODS, "grpo-test", grpo)
    specs = charts.method_specs({"method": "grpo-test"})
    assert charts.line_metrics(specs, extra=["kl", "loss"]) == {"reward": "Reward", "kl": "kl"}
