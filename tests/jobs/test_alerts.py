"""Alert rules: exact alerts for each rule, once per episode, and silence on a healthy noisy run."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from tests.support import fake, wait_until
from trainer_core.jobs import adoption
from trainer_core.jobs.alerts import (
    EVAL_RISING,
    GRAD_SPIKE,
    NO_STEP,
    NONFINITE_GRAD_NORM,
    NONFINITE_LOSS,
    Alert,
    AlertMonitor,
    replay,
    rows_from_frame,
)
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol.status import RunStatus
from ui.views import ALERTS_SHOWN, alert_badge


def train(step: int, loss: float | None = 1.0, grad_norm: float | None = 1.0, nonfinite: str = "") -> dict:
    return {"step": step, "loss": loss, "grad_norm": grad_norm, "nonfinite": nonfinite}


def evaluation(step: int, eval_loss: float | None, nonfinite: str = "") -> dict:
    return {"step": step, "eval_loss": eval_loss, "nonfinite": nonfinite}


# ---------------------------------------------------------------------- non-finite values
def test_nonfinite_loss_alerts_once_per_episode():
    rows = [train(1), train(2, loss=None, nonfinite="loss"), train(3, loss=float("nan")), train(4, loss=1.0),
            train(5, loss=float("inf"))]
    assert replay(rows) == [Alert(NONFINITE_LOSS, 2, "Train loss is NaN or inf at step 2."),
                            Alert(NONFINITE_LOSS, 5, "Train loss is inf at step 5.")]


def test_nonfinite_grad_norm_has_its_own_episode():
    rows = [train(1, grad_norm=None, nonfinite="grad_norm"), train(2, loss=None, grad_norm=None,
                                                                    nonfinite="grad_norm,loss")]
    assert replay(rows) == [Alert(NONFINITE_GRAD_NORM, 1, "Grad norm is NaN or inf at step 1."),
                            Alert(NONFINITE_LOSS, 2, "Train loss is NaN or inf at step 2.")]


def test_event_style_nonfinite_dicts_count_too():
    assert replay([{"step": 7, "loss": None, "nonfinite": {"loss": "nan"}}]) == [
        Alert(NONFINITE_LOSS, 7, "Train loss is NaN or inf at step 7.")]


def test_missing_values_are_not_alerts():
    assert replay([train(1, loss=None, grad_norm=None), evaluation(1, None), {"step": 2}]) == []


# ---------------------------------------------------------------------- grad spikes
def test_grad_spike_against_the_median_of_the_window():
    grads = [4.0, 3.0, 5.0, 4.0, 4.0, 3.5, 4.5, 4.0, 4.0, 4.0]  # median 4.0
    rows = [train(i + 1, grad_norm=g) for i, g in enumerate(grads)] + [train(11, grad_norm=84.2)]
    assert replay(rows) == [Alert(GRAD_SPIKE, 11, "Grad norm 84.2 at step 11 is 21.1x its recent median (4).")]


def test_grad_spike_needs_min_history_and_exceeds_the_factor_strictly():
    early = [train(i + 1, grad_norm=1.0) for i in range(9)] + [train(10, grad_norm=50.0)]
    assert replay(early) == []  # only 9 values of history before step 10
    exact = [train(i + 1, grad_norm=1.0) for i in range(10)] + [train(11, grad_norm=10.0)]
    assert replay(exact) == []  # 10x is not above 10x


def test_consecutive_spiking_steps_alert_once_and_a_later_spike_again():
    rows = [train(i + 1, grad_norm=1.0) for i in range(20)]
    rows += [train(21, grad_norm=30.0), train(22, grad_norm=40.0), train(23, grad_norm=1.0),
             train(24, grad_norm=25.0)]
    alerts = replay(rows)
    assert [(a.kind, a.step) for a in alerts] == [(GRAD_SPIKE, 21), (GRAD_SPIKE, 24)]


def test_spike_window_only_looks_back_that_far():
    monitor = AlertMonitor(spike_window=5, min_history=5)
    rows = [train(i + 1, grad_norm=100.0) for i in range(10)] + [train(11 + i, grad_norm=1.0) for i in range(5)]
    rows.append(train(16, grad_norm=11.0))
    assert [(a.kind, a.step) for a in monitor.replay(rows)] == [(GRAD_SPIKE, 16)]


# ---------------------------------------------------------------------- eval loss rising
def test_eval_rising_fires_after_patience_rises_once_per_streak():
    values = [2.0, 1.5, 1.6, 1.7, 1.8, 1.9, 1.2, 1.3, 1.4, 1.5]
    rows = [evaluation(50 * (i + 1), v) for i, v in enumerate(values)]
    assert replay(rows) == [
        Alert(EVAL_RISING, 250, "Eval loss rose 3 evaluations in a row: 1.5 at step 100 to 1.8 at step 250."),
        Alert(EVAL_RISING, 500, "Eval loss rose 3 evaluations in a row: 1.2 at step 350 to 1.5 at step 500."),
    ]


def test_eval_equal_value_breaks_a_streak():
    rows = [evaluation(s, v) for s, v in ((1, 1.0), (2, 1.1), (3, 1.1), (4, 1.2), (5, 1.3))]
    assert replay(rows) == []
    assert [a.step for a in replay(rows, eval_patience=2)] == [5]


# ---------------------------------------------------------------------- steps
def test_a_repeated_step_does_not_count_twice():
    # the same eval row delivered twice (e.g. live and again from the store) is one evaluation
    rows = [evaluation(1, 1.0), evaluation(2, 1.1), evaluation(2, 1.1), evaluation(3, 1.2)]
    assert replay(rows, eval_patience=3) == []
    # a train row then an eval row of one step: the eval row carries no grad norm, nothing is double counted
    grads = [train(i + 1, grad_norm=1.0) for i in range(10)]
    merged = grads + [train(11, grad_norm=20.0), {**evaluation(11, 0.9), "grad_norm": 20.0}]
    assert [(a.kind, a.step) for a in replay(merged)] == [(GRAD_SPIKE, 11)]


def test_nonfinite_repeated_at_the_same_step_is_one_alert():
    rows = [train(3, loss=None, nonfinite="loss"), {"step": 3, "loss": None, "nonfinite": "loss"}]
    assert [(a.kind, a.step) for a in replay(rows)] == [(NONFINITE_LOSS, 3)]


# ---------------------------------------------------------------------- no false alarms
def test_a_noisy_decreasing_run_raises_nothing():
    rng = np.random.default_rng(0)
    rows = []
    for step in range(1, 2001):
        loss = 0.6 + 2.0 * math.exp(-step / 400) + rng.normal(0, 0.08)
        grad = abs(rng.normal(1.2, 0.3)) * (1.5 - step / 2000)
        rows.append(train(step, loss=loss, grad_norm=grad))
        if step % 50 == 0:
            rows.append(evaluation(step, 0.65 + 2.0 * math.exp(-step / 400) + rng.normal(0, 0.01)))
    assert replay(rows) == []


def test_rows_from_frame_turn_gaps_into_none():
    df = pd.DataFrame({"step": [1, 2, 3], "loss": [1.0, np.nan, np.nan], "eval_loss": [np.nan, 0.9, np.nan],
                       "grad_norm": [0.5, np.nan, np.nan], "nonfinite": ["", "", "loss"]})
    rows = rows_from_frame(df)
    assert rows[1] == {"step": 2, "loss": None, "eval_loss": 0.9, "grad_norm": None, "nonfinite": ""}
    assert replay(rows) == [Alert(NONFINITE_LOSS, 3, "Train loss is NaN or inf at step 3.")]


@pytest.mark.parametrize("settings", [{"spike_factor": 1.0}, {"spike_window": 0}, {"min_history": 60},
                                      {"eval_patience": 0}])
def test_monitor_rejects_settings_that_cannot_work(settings):
    with pytest.raises(ValueError):
        AlertMonitor(**settings)


# ---------------------------------------------------------------------- rendering (ui.views)
def _render_alerts(alerts):
    from ui.views import render_alerts

    render_alerts(alerts)


def test_render_alerts_shows_a_badge_and_the_latest_first():
    assert alert_badge(0) == "" and alert_badge(1) == ":red-badge[⚠️ 1 alert]"
    assert alert_badge(3) == ":red-badge[⚠️ 3 alerts]"
    alerts = [Alert(GRAD_SPIKE, 10 * i, f"spike {i}") for i in range(ALERTS_SHOWN + 2)]
    alerts.append(SimpleNamespace(kind="alert", message="stored event without a step"))
    at = AppTest.from_function(_render_alerts, args=(alerts,), default_timeout=30).run()
    assert not at.exception, at.exception
    text = at.markdown[0].value
    assert text.startswith(":red-badge[⚠️ 8 alerts] latest first")
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert lines[0] == "- **alert** · stored event without a step"
    assert lines[1] == "- **grad-norm spike** · spike 6"
    assert len(lines) == ALERTS_SHOWN
    table = at.dataframe[0].value
    assert len(table) == 8 and table["step"].tolist()[:2] == [0, 10]


def test_render_alerts_draws_nothing_without_alerts():
    at = AppTest.from_function(_render_alerts, args=([],), default_timeout=30).run()
    assert not at.markdown and not at.dataframe


# ---------------------------------------------------------------------- a step that never ends
def test_a_step_that_never_ends_raises_one_no_step_alert(store, fake_worker, monkeypatch, tmp_path):
    """The heartbeat is a thread of its own: a step blocked for ever (a reward that never returns) left the run
    "running" with a fresh heartbeat and nothing said. Pumped by hand; the limit is lowered only while held."""
    monkeypatch.setattr(adoption, "STALL_S", 3600.0)
    release = tmp_path / "release"
    monkeypatch.setenv("FAKE_PAUSE_AT", "2")
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(release))
    orch = Orchestrator(store=store, launcher=fake_worker, start_pump=False)

    def no_step_alerts() -> list[str]:
        return [a.message for a in orch.snapshot(run_id).alerts if a.kind == NO_STEP]

    try:
        run_id = orch.start(fake(monkeypatch, steps=4, nan_step="0"))
        wait_until(lambda: orch.pump_once() or orch.snapshot(run_id).step >= 2, what="step 2")
        orch.pump_once()
        assert no_step_alerts() == []  # within the limit
        monkeypatch.setattr(adoption, "STALL_S", 0.0)  # the limit has passed
        for _ in range(3):
            orch.pump_once()
        expected = ("No new step for 0 minutes after step 2, though the worker is alive: a step, an evaluation or a "
                    "save is taking that long, or is blocked (a reward or data loader that never returns). Stop or "
                    "Cancel ends it.")
        assert no_step_alerts() == [expected]  # once, however many ticks see the same step
        monkeypatch.setattr(adoption, "STALL_S", 3600.0)
        release.touch()
        wait_until(lambda: orch.pump_once() or store.get_run(run_id).status.is_terminal(), what="the run to end")
    finally:
        orch.close()
    assert store.get_run(run_id).status is RunStatus.COMPLETED
    assert [e.message for e in store.get_events(run_id) if e.kind == "alert"] == [expected]
