"""Is the LLM judge right? Its 1-10 scores against people's ratings of the same answers (issue 34).

* ``score5`` ratings (1-5 with the judge's rubric): Spearman's rho and Kendall's tau-b between the judge's score
  and the people's mean score per answer (rank correlations: the two scales need not match);
* ``pass_fail`` ratings: Cohen's kappa between the judge's verdict (a score of JUDGE_PASS or more passes) and the
  people's (the majority of their votes; a tie fails).

Each with n (answers rated and judged) and a 95% bootstrap interval (answers resampled with replacement, seeded, so
the same ratings give the same interval). A judge metric is *uncalibrated* until MIN_RATINGS answers are rated, and
*low* when the agreement is under LOW_AGREEMENT (or the interval reaches below zero: no better than chance)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from db.feedback_store import RatingRecord

JUDGE_PASS = 6.0  # a judge score (1-10) at or above this passes
MIN_RATINGS = 20  # answers rated and judged before the judge's agreement is trusted
LOW_AGREEMENT = {"spearman": 0.5, "kendall": 0.4, "kappa": 0.4}  # under these the judge is flagged
BOOTSTRAP = 1000
KENDALL_CHUNK = 50  # resamples compared at once (an n x n sign matrix each: 50 x 300 x 300 floats is 36 MB)
SAMPLE_SIZE = 30  # answers offered for rating in one eval job
UNCALIBRATED, LOW, CALIBRATED = "uncalibrated", "low agreement", "calibrated"


@dataclass(frozen=True)
class Statistic:
    name: str  # spearman, kendall, kappa
    value: float | None  # None: undefined (every rating, or every judge score, the same)
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Calibration:
    scale: str
    n: int
    statistics: tuple[Statistic, ...]
    status: str
    reason: str


def rating_sample(indexes: list[int], job_id: str, size: int = SAMPLE_SIZE) -> list[int]:
    """The answers offered for rating: a fixed random sample of the job's (the same for every person, so their
    ratings meet on the same answers), in test-file order."""
    seed = int.from_bytes(job_id.encode("utf-8")[-8:].rjust(8, b"\0"), "big") % (2**32)
    chosen = np.random.default_rng(seed).permutation(sorted(indexes))[:size]
    return sorted(int(i) for i in chosen)


def paired(judge: pd.DataFrame, ratings: list[RatingRecord], scale: str) -> pd.DataFrame:
    """One row per answer both judged and rated on ``scale``: ``index``, ``judge`` (1-10), ``human`` (the raters'
    mean) and ``raters``."""
    rows = pd.DataFrame([(r.index, r.value) for r in ratings if r.scale == scale], columns=["index", "value"])
    if rows.empty:
        return pd.DataFrame(columns=["index", "judge", "human", "raters"])
    human = rows.groupby("index")["value"].agg(["mean", "count"]).rename(columns={"mean": "human", "count": "raters"})
    scored = judge[["index", "judge"]].dropna().astype({"index": int, "judge": float})
    return scored.merge(human, left_on="index", right_index=True).sort_values("index").reset_index(drop=True)


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float | None:
    """Cohen's kappa of two binary raters; None when it is undefined (no answers, or chance agreement is total)."""
    if len(a) == 0:
        return None
    observed = float(np.mean(a == b))
    expected = float(np.mean(a) * np.mean(b) + (1 - np.mean(a)) * (1 - np.mean(b)))
    return None if expected >= 1.0 else (observed - expected) / (1.0 - expected)


def _rank(name: str, x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return None
    value = (stats.spearmanr(x, y).statistic if name == "spearman" else stats.kendalltau(x, y).statistic)
    return float(value) if math.isfinite(value) else None


def _measure(name: str, x: np.ndarray, y: np.ndarray) -> float | None:
    return cohen_kappa(x, y) if name == "kappa" else _rank(name, x, y)


def _resampled(name: str, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """The statistic of each resample (one per row of ``xs``/``ys``), NaN where it is undefined. Kappa and Spearman
    for all rows at once (a rerun of the page redraws this); Kendall row by row."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if name == "kappa":
            px, py = xs.mean(axis=1), ys.mean(axis=1)
            expected = px * py + (1 - px) * (1 - py)
            return np.where(expected < 1.0, ((xs == ys).mean(axis=1) - expected) / (1.0 - expected), np.nan)
        if name == "spearman":
            rx, ry = stats.rankdata(xs, axis=1), stats.rankdata(ys, axis=1)
            rx, ry = rx - rx.mean(axis=1, keepdims=True), ry - ry.mean(axis=1, keepdims=True)
            return (rx * ry).sum(axis=1) / np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
        return np.concatenate([_kendall_rows(xs[i:i + KENDALL_CHUNK], ys[i:i + KENDALL_CHUNK])
                               for i in range(0, len(xs), KENDALL_CHUNK)])


def _kendall_rows(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each row: concordant minus discordant pairs over the pairs untied in each variable."""
    dx = np.sign(xs[:, :, None] - xs[:, None, :])
    dy = np.sign(ys[:, :, None] - ys[:, None, :])
    return (dx * dy).sum(axis=(1, 2)) / np.sqrt((dx * dx).sum(axis=(1, 2)) * (dy * dy).sum(axis=(1, 2)))


def _interval(name: str, x: np.ndarray, y: np.ndarray, seed: int = 0) -> tuple[float | None, float | None]:
    if len(x) < 3:
        return None, None
    picks = np.random.default_rng(seed).integers(0, len(x), (BOOTSTRAP, len(x)))
    values = _resampled(name, x[picks], y[picks])
    values = values[np.isfinite(values)]
    if len(values) < BOOTSTRAP // 2:  # most resamples undefined: no interval worth showing
        return None, None
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def calibrate(pairs: pd.DataFrame, scale: str) -> Calibration:
    """The judge against people on ``pairs`` (``paired``'s frame) for ``scale``."""
    n = len(pairs)
    if scale == "pass_fail":
        x = (pairs["judge"].to_numpy(float) >= JUDGE_PASS).astype(float)
        y = (pairs["human"].to_numpy(float) > 0.5).astype(float)
        names = ("kappa",)
    else:
        x, y = pairs["judge"].to_numpy(float), pairs["human"].to_numpy(float)
        names = ("spearman", "kendall")
    found = tuple(Statistic(name, _measure(name, x, y), *_interval(name, x, y)) for name in names)
    main = found[0]
    if n < MIN_RATINGS:
        return Calibration(scale, n, found, UNCALIBRATED,
                           f"{n} of the {MIN_RATINGS} rated answers needed before the judge's agreement is trusted")
    if main.value is None:
        return Calibration(scale, n, found, UNCALIBRATED, "every rating (or every judge score) is the same: agreement "
                                                          "cannot be measured; rate answers of varied quality")
    if main.value < LOW_AGREEMENT[main.name] or (main.low is not None and main.low <= 0.0):
        return Calibration(scale, n, found, LOW, f"{main.name} {main.value:.2f} is under "
                                                 f"{LOW_AGREEMENT[main.name]:.1f} or its interval reaches zero: "
                                                 "do not trust this judge's scores; edit its rubric and judge again")
    return Calibration(scale, n, found, CALIBRATED, f"{main.name} {main.value:.2f} on {n} rated answers")
