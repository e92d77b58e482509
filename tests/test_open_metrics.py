"""Open metrics end to end (issue 18): a worker reports keys no schema names (GRPO's rewards/<function>/mean);
the pump stores them, the live state, Run details and Compare chart them on request, the CSV export holds
them and `db rebuild` restores them, with no schema change."""
from __future__ import annotations

import io
import json
import textwrap

import pandas as pd
import pytest
from sqlmodel import Session, select

from db.models import Metric, MetricValue
from db.store import Store
from tests.support import FakeLauncher, run_python
from tests.support.apptest import open_page
from trainer_core import __main__ as cli
from trainer_core.views import charts
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs import rebuild
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import events as ev
from trainer_core.protocol.status import RunStatus

# Writes through the real EventWriter what a GRPO worker reports: rewards per function, a NaN one at step 3,
# an eval with its own keys. FAKE_SCALE sets the format reward, so two runs differ.
WORKER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from trainer_core.protocol import events as ev
    scale = float(os.environ["FAKE_SCALE"])
    w = ev.EventWriter(Path(sys.argv[1]) / ev.LOG_NAME)
    w.emit(ev.StatusEvent(status="running", phase="training"))
    for step in range(1, 5):
        w.emit(ev.ProgressEvent(step=step, total_steps=4, loss=2.0 / step, metrics={
            "rewards/format/mean": scale * step / 4, "completions/mean_length": 10.0 * step,
            "rewards/answer_match/mean": float("nan") if step == 3 else 0.5}))
    w.emit(ev.EvalEvent(step=4, eval_loss=0.9, metrics={"eval_rewards/format/mean": scale * 0.8}))
    w.emit(ev.CompleteEvent(status="completed", steps=4, final_loss=0.5))
    w.close()
""")
KEY = "rewards/format/mean"


def start_runs(store: Store, monkeypatch) -> list[str]:
    orch = Orchestrator(store=store, launcher=FakeLauncher(WORKER))
    try:
        ids = []
        for scale, name in ((1.0, "grpo a"), (2.0, "grpo b")):
            monkeypatch.setenv("FAKE_SCALE", str(scale))
            ids.append(orch.start(TrainConfig(model_name=BUNDLED_MODEL, run_name=name, max_steps=4)))
            orch.wait(ids[-1], timeout=60, interval=0.05)
        live = orch.snapshot(ids[0])
        assert live.metric_keys == ("rewards/format/mean", "completions/mean_length", "rewards/answer_match/mean",
                                    "eval_rewards/format/mean")
        assert live.metrics[KEY].tolist() == [0.25, 0.5, 0.75, 1.0]
    finally:
        orch.close()
    for run_id in ids:
        assert store.get_run(run_id).status == RunStatus.COMPLETED.value, store.get_run(run_id).error
    return ids


def long_rows(store: Store) -> list[tuple]:
    with Session(store.engine) as session:
        return sorted((m.run_id, m.step, m.key, m.value) for m in session.exec(select(MetricValue)))


def test_a_new_metric_key_is_stored_charted_compared_downloaded_and_rebuilt(app_home, monkeypatch, capsys):
    store = Store()
    a, b = start_runs(store, monkeypatch)

    # stored: the long table, the NaN named in the wide row's nonfinite, the wide columns as before
    rows = [r for r in long_rows(store) if r[0] == a]
    assert rows == sorted([(a, s, KEY, s / 4) for s in range(1, 5)]
                          + [(a, s, "completions/mean_length", 10.0 * s) for s in range(1, 5)]
                          + [(a, s, "rewards/answer_match/mean", 0.5) for s in (1, 2, 4)]
                          + [(a, 4, "eval_rewards/format/mean", 0.8)])
    with Session(store.engine) as session:
        wide = {m.step: m for m in session.exec(select(Metric).where(Metric.run_id == a))}
    assert wide[3].nonfinite == "metrics.rewards/answer_match/mean"
    assert (wide[4].loss, wide[4].eval_loss) == (0.5, 0.9)
    assert store.metric_keys(b) == ["completions/mean_length", "eval_rewards/format/mean", "rewards/answer_match/mean",
                                    KEY]

    # charted on request, with the same downsampling as the wide metrics
    built = charts.live_charts(store.metrics_frame(a), extra=[KEY])
    assert list(built) == ["loss", KEY]
    spec = built[KEY].to_dict()
    assert spec["title"] == KEY
    assert [(d["step"], d["value"]) for d in spec["datasets"][spec["data"]["name"]]] == \
        [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0)]
    assert list(charts.live_charts(store.metrics_frame(a))) == ["loss"]  # not asked for: the default charts only

    # downloaded: the CSV export has a column per key
    assert cli.main(["runs", "export", a, "--format", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert csv[KEY].tolist() == [0.25, 0.5, 0.75, 1.0]
    assert csv["rewards/answer_match/mean"].isna().tolist() == [False, False, True, False]
    assert csv["eval_rewards/format/mean"].fillna(-1).tolist() == [-1, -1, -1, 0.8]
    before = long_rows(store)

    # rebuilt: the database lost and rebuilt from the run folders holds the same long rows
    store.engine.dispose()
    (app_home / "studio.db").unlink()
    report = rebuild.rebuild(store.url)
    assert sorted(report.runs) == sorted([a, b])
    store = Store()
    assert long_rows(store) == before

    # Run details: the picker offers the run's other keys; the key picked is charted
    at = open_page("pages/run.py", detail_run_id=a, run_extra=[KEY])
    assert at.multiselect(key="run_extra").options == ["completions/mean_length", "eval_rewards/format/mean",
                                                       "rewards/answer_match/mean", KEY]
    titles = [json.loads(c.proto.spec).get("title") for c in at.get("vega_lite_chart")]
    assert titles == ["Loss", KEY]  # the worker logged no learning rate, grad norm or tokens/s
    assert any("Non-finite values (metrics.rewards/answer_match/mean) first at step 3" in w.value for w in at.warning)

    # Compare: both runs overlaid on the picked key, its final value in the summary
    at = open_page("pages/compare.py", compare_ids=[a, b], cmp_extra=[KEY])
    specs = {json.loads(c.proto.spec).get("title"): c for c in at.get("vega_lite_chart")}
    assert list(specs) == ["Train loss", "Eval loss", KEY]
    summary = next(d.value for d in at.dataframe if "final " + KEY in d.value.columns)
    assert summary["final " + KEY].tolist() == [1.0, 2.0]
    store.engine.dispose()


WORKER_CALLBACK = textwrap.dedent("""
    import json, types
    from trainer_core.worker import train
    emitted, warnings = [], []
    fake = types.SimpleNamespace(events=types.SimpleNamespace(emit=emitted.append), requested=lambda: None,
                                 distributed=False, warn=warnings.append)
    callback = train.make_callback(fake)
    callback.memory_mb = lambda: 0.0
    state = types.SimpleNamespace(global_step=3, max_steps=10, num_input_tokens_seen=0, epoch=0.3)
    callback.on_train_begin(None, state, None)
    logs = {"loss": 1.0, "grad_norm": 0.5, "learning_rate": 1e-5, "epoch": 0.3, "num_tokens": 640.0,
            "rewards/format/mean": 0.75, "rewards/chosen": 2, "logps/rejected": -12.5, "a,b": 1.0,
            "completions/clipped_ratio": True, "note": "text"}
    callback.on_log(None, state, None, logs=logs)
    callback.on_log(None, state, None, logs={**logs, "a,b": 2.0})  # the refused name is warned about once
    callback.on_log(None, state, None, logs={"eval_loss": 0.9, "eval_runtime": 1.5, "eval_rewards/chosen": 0.25,
                                             "epoch": 0.3})
    print(json.dumps({"events": [[e.kind, e.metrics] for e in emitted], "tokens": emitted[0].tokens_seen,
                      "warnings": warnings}))
""")


@pytest.mark.subprocess  # the worker's callback imports transformers
def test_the_progress_callback_passes_every_numeric_log_key_besides_the_wide_fields():
    result = run_python(WORKER_CALLBACK)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    train_metrics = {"rewards/format/mean": 0.75, "rewards/chosen": 2.0, "logps/rejected": -12.5}
    assert out["events"] == [["progress", train_metrics], ["progress", train_metrics],
                             ["eval", {"eval_runtime": 1.5, "eval_rewards/chosen": 0.25}]]
    assert out["tokens"] == 640
    assert out["warnings"] == ["The trainer logged a metric 'a,b' that is not recorded: its name contains a comma: use "
                               "another separator such as '/' or '_'."]
    # what the callback emits is a valid event
    event = ev.ProgressEvent(step=3, total_steps=10, metrics=train_metrics)
    assert ev.decode(ev.encode(event)).metrics == train_metrics
