"""The LLM judge checked against people (issue 34): people rate an eval job's answers; a judge that agrees with them is
calibrated, one that does not is flagged, and too few ratings leave it uncalibrated."""
from __future__ import annotations

import numpy as np
import pytest

from db.entities import RunRecord
from trainer_core.auth.access import Actor, Role
from trainer_core.feedback import calibration
from trainer_core.feedback.service import Feedback
from trainer_core.feedback.votes import FeedbackError
from trainer_core.protocol.status import JobKind, RunStatus

VAL = Actor("val", Role.VIEWER)
ANN = Actor("ann", Role.OPERATOR)
HUMAN = [1, 2, 3, 4, 5] * 5  # 25 answers, people's 1-5 scores


def eval_job(store, judge_scores: list[float], job_id: str = "eval-1") -> str:
    store.create_run(RunRecord(id=job_id, name="eval", status=RunStatus.COMPLETED, kind=JobKind.EVAL))
    for index, score in enumerate(judge_scores):
        store.save_eval_sample(job_id, index, prompt=f"q{index}", answer=f"a{index}", judge=score)
    return job_id


def rate_all(feedback: Feedback, job_id: str, scale: str, values: list[int], who: Actor = VAL) -> None:
    for index, value in enumerate(values):
        feedback.rate(who, job_id, index, scale, value)


def calibrated(feedback: Feedback, store, job_id: str, scale: str) -> calibration.Calibration:
    return calibration.calibrate(calibration.paired(store.eval_samples(job_id), feedback.ratings(job_id), scale), scale)


def test_a_judge_that_agrees_with_people_is_calibrated(home, store):
    feedback = Feedback(store)
    job = eval_job(store, [2.0 * h for h in HUMAN])  # the judge's 1-10 is twice the people's 1-5: same ranks
    rate_all(feedback, job, "score5", HUMAN)
    found = calibrated(feedback, store, job, "score5")
    assert (found.n, found.status) == (25, calibration.CALIBRATED)
    spearman, kendall = found.statistics
    assert (spearman.name, spearman.value, kendall.name, kendall.value) == ("spearman", 1.0, "kendall", 1.0)
    assert spearman.low == pytest.approx(1.0) and spearman.high == pytest.approx(1.0)
    rate_all(feedback, job, "pass_fail", [int(h >= 3) for h in HUMAN])  # judge passes at 6+: 2*3 = 6
    passed = calibrated(feedback, store, job, "pass_fail")
    assert passed.status == calibration.CALIBRATED and passed.statistics[0].value == 1.0


def test_a_judge_that_disagrees_is_flagged(home, store):
    feedback = Feedback(store)
    job = eval_job(store, [2.0 * (6 - h) for h in HUMAN])  # the judge reverses people's order
    rate_all(feedback, job, "score5", HUMAN)
    found = calibrated(feedback, store, job, "score5")
    assert found.status == calibration.LOW and found.statistics[0].value == -1.0
    assert "do not trust this judge's scores" in found.reason
    rate_all(feedback, job, "pass_fail", [int(h >= 3) for h in HUMAN])
    passed = calibrated(feedback, store, job, "pass_fail")
    assert passed.status == calibration.LOW and passed.statistics[0].value < 0


def test_too_few_ratings_leave_the_judge_uncalibrated(home, store):
    feedback = Feedback(store)
    job = eval_job(store, [2.0 * h for h in HUMAN])
    rate_all(feedback, job, "score5", HUMAN[:calibration.MIN_RATINGS - 1])
    found = calibrated(feedback, store, job, "score5")
    assert (found.status, found.n) == (calibration.UNCALIBRATED, 19)
    assert found.reason == "19 of the 20 rated answers needed before the judge's agreement is trusted"


def test_ratings_are_averaged_over_people_and_rating_again_replaces(home, store):
    feedback = Feedback(store)
    job = eval_job(store, [8.0, 2.0])
    feedback.rate(VAL, job, 0, "score5", 5)
    feedback.rate(ANN, job, 0, "score5", 3)
    feedback.rate(VAL, job, 1, "score5", 2)
    feedback.rate(VAL, job, 1, "score5", 1)  # again: replaces
    pairs = calibration.paired(store.eval_samples(job), feedback.ratings(job), "score5")
    assert pairs.to_dict("records") == [{"index": 0, "judge": 8.0, "human": 4.0, "raters": 2},
                                        {"index": 1, "judge": 2.0, "human": 1.0, "raters": 1}]
    feedback.unrate(VAL, job, 1, "score5")
    assert [(r.index, r.rater) for r in feedback.ratings(job)] == [(0, "ann"), (0, "val")]


@pytest.mark.parametrize("index, scale, value, message", [
    (0, "score5", 6, "a score5 rating is a score from 1 to 5, not '6'"),
    (0, "score5", 2.5, "a score5 rating is a score from 1 to 5, not '2.5'"),
    (0, "pass_fail", 2, "a pass_fail rating is pass/fail (1 pass, 0 fail), not '2'"),
    (0, "stars", 3, "unknown rating scale 'stars'"),
    (7, "score5", 3, "eval job 'eval-1' has no answer number 7"),
    (0, "score5", True, "not 'True'"),
])
def test_bad_ratings_are_refused(home, store, index, scale, value, message):
    feedback = Feedback(store)
    eval_job(store, [5.0])
    with pytest.raises(FeedbackError) as err:
        feedback.rate(VAL, "eval-1", index, scale, value)
    assert message in str(err.value) and feedback.ratings("eval-1") == []


def test_the_rating_sample_is_fixed_per_job_and_in_order():
    first = calibration.rating_sample(list(range(100)), "eval-1")
    assert first == calibration.rating_sample(list(range(100)), "eval-1") and first == sorted(first)
    assert len(first) == calibration.SAMPLE_SIZE and first != calibration.rating_sample(list(range(100)), "eval-2")
    assert calibration.rating_sample([3, 1], "eval-1") == [1, 3]


def test_the_bootstrap_statistics_match_scipys_and_the_kappa_formula():
    from scipy import stats

    rng = np.random.default_rng(1)
    xs, ys = rng.integers(1, 6, (6, 30)).astype(float), rng.integers(1, 11, (6, 30)).astype(float)
    assert calibration._resampled("spearman", xs, ys) == pytest.approx(
        [stats.spearmanr(x, y).statistic for x, y in zip(xs, ys)])
    assert calibration._resampled("kendall", xs, ys) == pytest.approx(
        [stats.kendalltau(x, y).statistic for x, y in zip(xs, ys)])
    a, b = (xs > 3).astype(float), (ys > 5).astype(float)
    assert calibration._resampled("kappa", a, b) == pytest.approx([calibration.cohen_kappa(x, y) for x, y in zip(a, b)])
    # kappa by hand: 3 of 4 agree; chance agreement 0.5 * 0.25 + 0.5 * 0.75 = 0.5: (0.75 - 0.5) / (1 - 0.5)
    assert calibration.cohen_kappa(np.array([1, 1, 0, 0.0]), np.array([1, 0, 0, 0.0])) == pytest.approx(1 / 2)


def test_an_eval_run_again_with_an_edited_rubric_is_checked_against_the_same_ratings(home, store):
    """The same model on the same data, judged again: its greedy answers repeat, so people's ratings carry over (a
    changed answer's do not), and the new rubric's agreement is measured on them."""
    feedback = Feedback(store)
    for job_id, judge, created in (("eval-old", [2.0 * (6 - h) for h in HUMAN], 1.0),  # the old rubric: reversed
                                   ("eval-new", [2.0 * h for h in HUMAN], 2.0)):  # the edited rubric agrees
        eval_job(store, judge, job_id)
        store.save_eval_result(job_id, source_key="run:r1", source_run_id="r1", data_fingerprint="fp",
                               created_at=created)
    store.save_eval_sample("eval-new", 0, prompt="q0", answer="a different answer", judge=2.0)
    rate_all(feedback, "eval-old", "score5", HUMAN)
    old = calibrated(feedback, store, "eval-old", "score5")
    assert old.status == calibration.LOW
    carried = feedback.ratings_for("eval-new")
    assert len(carried) == 24 and {r.job_id for r in carried} == {"eval-new"} and 0 not in {r.index for r in carried}
    new = calibration.calibrate(calibration.paired(store.eval_samples("eval-new"), carried, "score5"), "score5")
    assert (new.status, new.n, new.statistics[0].value) == (calibration.CALIBRATED, 24, 1.0)
    feedback.rate(VAL, "eval-new", 1, "score5", 1)  # a rating of this job wins over the carried one
    assert [r.value for r in feedback.ratings_for("eval-new") if r.index == 1] == [1.0]
    eval_job(store, [2.0 * h for h in HUMAN], "eval-other")  # the same answers on other data: nothing carries
    store.save_eval_result("eval-other", source_key="run:r1", source_run_id="r1", data_fingerprint="other-data")
    assert feedback.ratings_for("eval-other") == []
