"""Judge calibration in an eval's results (issue 34): the judge is marked uncalibrated until people rated enough of
its answers; rating through the panel (without the judge's score in view) makes it calibrated when people agree, and
the scatter plots judge against people."""
from __future__ import annotations

from db.store import Store
from tests.evaluation.test_eval_pages import add_eval
from tests.support.apptest import open_page, texts
from tests.support.factories import insert_finished_run
from trainer_core.auth.access import Actor, Role
from trainer_core.feedback import calibration
from trainer_core.feedback.service import Feedback
from trainer_core.views.calibration_chart import judge_vs_human
from ui import judge_calibration
from ui.state import get_orchestrator

JUDGE = [9.0 if i % 2 else 2.0 for i in range(24)]  # odd answers good, even ones bad
SAMPLES = [{"index": i, "prompt": f"question {i} <b>x</b>", "reference": "ref", "answer": f"answer {i} **y**",
            "judge": score} for i, score in enumerate(JUDGE)]


def seeded() -> Store:
    store = Store()
    insert_finished_run(store, "run-a", "alpha run", [2.0, 1.0])
    add_eval(store, "eval-a", "run:run-a", "run-a",
             {"samples": 24, "judge": 5.5}, SAMPLES)
    return store


def test_the_judge_is_uncalibrated_then_rated_into_calibration(app_home):
    seeded()
    at = open_page("pages/run.py", detail_run_id="run-a")
    assert any(c.startswith("⏳ Judge uncalibrated · n 0") and "0 of the 20 rated answers needed" in c
               for c in texts(at, "caption")), texts(at, "caption")
    me = Actor.local()
    feedback = Feedback(get_orchestrator().store)
    sample = calibration.rating_sample(list(range(24)), "eval-a")
    for index in sample[:19]:  # people agree with the judge on 19 answers
        feedback.rate(me, "eval-a", index, "pass_fail", int(JUDGE[index] >= 6))
    at.run()
    last = sample[19]
    assert [t.value for t in at.text][-1] == f"answer {last} **y**"  # the next answer, as text; its score hidden
    at.button(key=f"ev_cal_eval-a_pass_fail_{last}_{int(JUDGE[last] >= 6)}").click().run()
    assert not at.exception, at.exception
    assert any(c.startswith("✅ Judge calibrated · n 20 · Cohen's κ 1.00") for c in texts(at, "caption")), \
        texts(at, "caption")
    assert at.get("vega_lite_chart") and len(feedback.ratings("eval-a")) == 20


def test_people_who_disagree_flag_the_judge(app_home):
    seeded()
    feedback = Feedback(get_orchestrator().store)
    for index in calibration.rating_sample(list(range(24)), "eval-a")[:20]:
        feedback.rate(Actor("val", Role.VIEWER), "eval-a", index, "score5", 1 if JUDGE[index] >= 6 else 5)
    at = open_page("pages/run.py", detail_run_id="run-a")
    assert any(c.startswith("⚠️ Judge low agreement · n 20 · Spearman ρ -1.00") for c in texts(at, "caption"))


def test_the_scatter_plots_judge_against_people():
    import pandas as pd

    pairs = pd.DataFrame({"index": [0, 1], "judge": [2.0, 9.0], "human": [1.5, 4.0], "raters": [2, 1]})
    spec = judge_vs_human(pairs, "score5").to_dict()
    assert spec["mark"]["type"] == "circle" and spec["encoding"]["x"]["field"] == "judge"
    assert spec["encoding"]["y"]["scale"]["domain"] == [1, 5]
    [values] = spec["datasets"].values()
    assert [(v["index"], v["judge"], v["human"]) for v in values] == [(0, 2.0, 1.5), (1, 9.0, 4.0)]
    assert judge_calibration.next_to_rate([1, 3, 5], {1, 5}) == 3 and judge_calibration.next_to_rate([1], {1}) is None
