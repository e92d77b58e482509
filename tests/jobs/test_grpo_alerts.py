"""GRPO's alerts (issue 19) from the open metrics its trainer logs: no learning signal, completions always clipped,
reward rising while completions collapse. Exact steps and messages; once per streak / run."""
from __future__ import annotations

from trainer_core.jobs.alerts import ALWAYS_CLIPPED, LENGTH_COLLAPSE, NO_LEARNING_SIGNAL, AlertMonitor, replay


def rows(**series):
    n = len(next(iter(series.values())))
    return [{"step": i + 1, **{key.replace("__", "/"): values[i] for key, values in series.items()}}
            for i in range(n)]


def kinds(alerts):
    return [(a.kind, a.step) for a in alerts]


def test_zero_spread_groups_for_patience_steps_in_a_row_is_no_learning_signal_once_per_streak():
    share = [1.0, 0.95, 0.5, 1.0, 1.0, 1.0, 0.92, 1.0, 1.0, 1.0, 1.0, 0.2, 1.0, 1.0, 1.0, 1.0, 1.0]
    alerts = replay(rows(frac_reward_zero_std=share), grpo_patience=5)
    # the streak from step 4 reaches 5 at step 8 and is alerted once; step 12 ends it; steps 13-17 alert again
    assert kinds(alerts) == [(NO_LEARNING_SIGNAL, 8), (NO_LEARNING_SIGNAL, 17)]
    # the share every step reached (step 7's 92%), not the last step's 100% (hostile review: it overstated)
    assert alerts[0].message.startswith("For 5 steps in a row (to step 8), at least 92% of the groups had no reward "
                                        "spread")


def test_always_clipped_completions_alert_and_a_finished_answer_breaks_the_streak():
    clipped = [1.0, 1.0, 1.0, 0.75, 1.0, 1.0, 1.0]
    alerts = replay(rows(completions__clipped_ratio=clipped), grpo_patience=3)
    assert kinds(alerts) == [(ALWAYS_CLIPPED, 3), (ALWAYS_CLIPPED, 7)]
    assert "Raise grpo.max_completion_length" in alerts[0].message


def test_reward_rising_while_length_collapses_is_reward_hacking_once():
    reward = [-0.5, -0.3, 0.1, 0.6, 0.9, 1.0]
    length = [40.0, 30.0, 12.0, 5.0, 2.0, 1.0]
    alerts = replay(rows(reward=reward, completions__mean_length=length))
    assert kinds(alerts) == [(LENGTH_COLLAPSE, 5)]  # 2 tokens <= 3 and <= 10% of 40, reward above -0.5
    assert alerts[0].message.startswith("Reward rose from -0.5 to 0.9 while completions shrank from 40 to 2 tokens")


def test_short_answers_without_a_rising_reward_and_healthy_runs_raise_nothing():
    assert replay(rows(reward=[1.0, 0.5, 0.2], completions__mean_length=[40.0, 2.0, 1.0])) == []
    healthy = rows(reward=[0.1, 0.3, 0.5, 0.7, 0.8, 0.9], completions__mean_length=[20.0] * 6,
                   frac_reward_zero_std=[0.2] * 6, completions__clipped_ratio=[0.1] * 6)
    assert replay(healthy, grpo_patience=2) == []


def test_a_nan_share_breaks_a_streak_and_a_repeated_step_counts_once():
    monitor = AlertMonitor(grpo_patience=3)
    seen = []
    for row in ({"step": 1, "frac_reward_zero_std": 1.0}, {"step": 1, "frac_reward_zero_std": 1.0},
                {"step": 2, "frac_reward_zero_std": 1.0},
                {"step": 3, "frac_reward_zero_std": None, "nonfinite": "metrics.frac_reward_zero_std"},
                {"step": 4, "frac_reward_zero_std": 1.0}, {"step": 5, "frac_reward_zero_std": 1.0}):
        seen += monitor.observe(row)
    assert seen == []  # steps 1, 2 then NaN at 3: the streak restarts at 4 and is only 2 long at 5
