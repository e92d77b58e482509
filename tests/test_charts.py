"""Chart builders: min/max downsampling, smoothing, and the data each chart plots."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from trainer_core import charts


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


# ---------------------------------------------------------------------- loss_chart
def test_loss_chart_plots_raw_and_smoothed_loss():
    df = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [4.0, 2.0, 3.0, 1.0], "eval_loss": [None] * 4})
    rows = chart_rows(charts.loss_chart(df, window=2))
    assert set(rows["series"]) == {charts.RAW_LOSS, charts.SMOOTH_LOSS}
    raw = series(rows, charts.RAW_LOSS)
    assert raw["step"].tolist() == [1, 2, 3, 4] and raw["value"].tolist() == [4.0, 2.0, 3.0, 1.0]
    assert series(rows, charts.SMOOTH_LOSS)["value"].tolist() == [4.0, 3.0, 2.5, 2.0]


def test_loss_chart_overlays_eval_loss_when_present():
    df = pd.DataFrame({"step": [1, 2, 3, 4], "loss": [4.0, 3.0, 2.0, 1.0], "eval_loss": [None, 2.5, None, 1.5]})
    chart = charts.loss_chart(df)
    rows = chart_rows(chart)
    assert series(rows, charts.EVAL_LOSS)[["step", "value"]].values.tolist() == [[2, 2.5], [4, 1.5]]
    spec = chart.to_dict()
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == list(charts.LOSS_SERIES)
    assert {t["field"] for t in spec["layer"][0]["encoding"]["tooltip"]} == {"step", "series", "value"}


def test_loss_chart_drops_nan_and_inf():
    df = pd.DataFrame({"step": [1, 2, 3, 4, 5], "loss": [2.0, np.nan, 1.0, np.inf, 0.5],
                       "eval_loss": [np.nan] * 5})
    rows = chart_rows(charts.loss_chart(df, window=2))
    assert charts.EVAL_LOSS not in set(rows["series"])
    assert all(math.isfinite(v) for v in rows["value"])
    assert series(rows, charts.RAW_LOSS)["step"].tolist() == [1, 3, 5]
    # the moving average runs over the finite values only: (2+1)/2, (1+0.5)/2
    assert series(rows, charts.SMOOTH_LOSS)["value"].tolist() == [2.0, 1.5, 0.75]


def test_loss_chart_smooths_before_downsampling():
    n = 10_000
    df = pd.DataFrame({"step": np.arange(n), "loss": np.where(np.arange(n) % 2 == 0, 1.0, 3.0)})
    rows = chart_rows(charts.loss_chart(df, window=10, max_points=200))
    assert len(series(rows, charts.RAW_LOSS)) <= 200 and len(series(rows, charts.SMOOTH_LOSS)) <= 200
    # a full-resolution average of alternating 1/3 is 2 after warm-up; averaging thinned points would not be
    assert series(rows, charts.SMOOTH_LOSS)["value"].iloc[-1] == pytest.approx(2.0)


def test_loss_chart_accepts_database_frames_with_object_columns():
    df = pd.DataFrame({"step": [1, 2], "loss": [1.5, None], "eval_loss": [None, None]}, dtype=object)
    rows = chart_rows(charts.loss_chart(df))
    assert series(rows, charts.RAW_LOSS)["value"].tolist() == [1.5]


def test_loss_chart_of_empty_frame_has_no_rows():
    assert chart_rows(charts.loss_chart(pd.DataFrame(columns=["step", "loss", "eval_loss"]))).empty


# ---------------------------------------------------------------------- line charts
def test_line_chart_is_one_finite_series():
    df = pd.DataFrame({"step": [1, 2, 3], "grad_norm": [0.5, np.nan, 0.7]})
    rows = chart_rows(charts.line_chart(df, "grad_norm", "Grad norm"))
    assert rows[["step", "value"]].values.tolist() == [[1, 0.5], [3, 0.7]]
    assert set(rows["series"]) == {"Grad norm"}


def test_line_chart_downsamples():
    df = pd.DataFrame({"step": np.arange(5000), "learning_rate": np.linspace(2e-4, 0, 5000)})
    assert len(chart_rows(charts.line_chart(df, "learning_rate", "Learning rate", max_points=100))) <= 100


def test_compare_loss_chart_has_one_series_per_run():
    frames = {"a": pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.0]}),
              "b": pd.DataFrame({"step": [1, 2], "loss": [3.0, np.nan]})}
    rows = chart_rows(charts.compare_loss_chart(frames, window=2))
    assert series(rows, "a")["value"].tolist() == [2.0, 1.5]
    assert series(rows, "b")["value"].tolist() == [3.0]
