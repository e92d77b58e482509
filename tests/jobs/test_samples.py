"""Samples during training from the event log to the database: the store's sample methods, the pump's
"sample" handler and its alerts (one per kind per run), a fake worker's run through the orchestrator, and
``db rebuild`` restoring them."""
from __future__ import annotations

import time

from sqlmodel import Session, select

from db.entities import RunRecord
from db.models import RunEvent, Sample
from db.store import Store
from tests.support.fake_worker import SAMPLE_PROMPTS
from tests.jobs.test_rebuild import wipe
from tests.support import fake, wait_until
from trainer_core.jobs import pump, rebuild
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.jobs.remote_view import RemoteView
from trainer_core.protocol import events as ev
from trainer_core.protocol.status import JobKind, RunStatus

RUN = "20260101-000000-ssssss"


def new_run(store: Store, run_id: str = RUN) -> None:
    store.create_run(RunRecord(id=run_id, name="sampled", status=RunStatus.RUNNING.value, created_at=time.time()))


def sample(step: int, index: int, text: str = "ok", prompt: str | None = None, flags: dict | None = None) -> dict:
    return {"step": step, "index": index, "prompt": prompt or f"prompt {index}", "text": text, "new_tokens": 2,
            "flags": flags or {}, "ts": float(step)}


# ---------------------------------------------------------------------- store
def test_samples_are_upserted_read_newest_first_and_deleted_with_the_run(store):
    new_run(store)
    store.append_samples(RUN, [sample(2, 0), sample(2, 1), sample(4, 0, flags={"empty": "the answer is empty"}),
                               sample(4, 1)])
    store.append_samples(RUN, [sample(4, 1, "replayed"), sample(4, 1, "replayed twice"), sample(6, 0)])
    got = store.samples(RUN)
    assert [(s.step, s.index, s.text) for s in got] == [(6, 0, "ok"), (4, 0, "ok"), (4, 1, "replayed twice"),
                                                        (2, 0, "ok"), (2, 1, "ok")]
    assert got[1].flags == {"empty": "the answer is empty"} and got[0].flags == {}
    assert [s.step for s in store.samples(RUN, max_steps=2)] == [6, 4, 4]
    assert store.samples("no-such-run") == []
    store.finish_run(RUN, RunStatus.COMPLETED)
    assert store.delete_run(RUN)
    with Session(store.engine) as session:
        assert session.exec(select(Sample)).all() == []


def test_one_prompt_across_runs_in_the_order_asked_for(store):
    new_run(store, "r-a")
    new_run(store, "r-b")
    new_run(store, "r-c")
    store.append_samples("r-a", [sample(1, 0, "a1", "Hi?"), sample(3, 0, "a3", "Hi?"), sample(3, 1, "x", "Other")])
    store.append_samples("r-b", [sample(2, 0, "b2", "Hi?")])
    assert store.sample_prompts(["r-b", "r-a", "r-c"]) == ["Hi?", "Other"]
    got = store.prompt_samples(["r-b", "r-a", "r-c"], "Hi?")
    assert [(s.run_id, s.step, s.text) for s in got] == [("r-b", 2, "b2"), ("r-a", 3, "a3"), ("r-a", 1, "a1")]
    assert store.prompt_samples(["r-a"], "never asked") == [] and store.sample_prompts([]) == []


# ---------------------------------------------------------------------- the pump's handler
def test_the_handler_stores_samples_and_raises_one_alert_per_kind(tmp_path, store):
    new_run(store)
    t = pump.Tracker(RUN, tmp_path, LiveRun(RUN, "sampled", RunStatus.RUNNING), 0, lock_fh=None, kind=JobKind.TRAIN)
    pump.handle(t, ev.SampleEvent(step=2, index=0, prompt="p", text="fine", new_tokens=1, ts=2.0))
    pump.handle(t, ev.SampleEvent(step=2, index=1, prompt="p2", text="", flags={"empty": "the answer is empty"},
                                  ts=2.0))
    pump.handle(t, ev.SampleEvent(step=4, index=1, prompt="p2", text="\x00", flags={"empty": "again"}, ts=4.0))
    pump.handle(t, ev.SampleEvent(step=4, index=0, prompt="p", text="a<|im_end|>", ts=4.0,
                                  flags={"template_leak": "the answer contains <|im_end|>", "unknown_kind": "x"}))
    assert t.urgent
    assert [(kind, message) for _, kind, message in t.timeline] == [
        ("alert", "Sample answer 2 at step 2 is empty: the answer is empty."),
        ("alert", "Sample answer 1 at step 4 leaks template tokens: the answer contains <|im_end|>.")]
    assert [a.kind for a in t.live.snapshot().alerts] == ["sample_empty", "sample_template_leak"]
    pump.flush(t, store)
    assert t.samples == []
    got = {(s.step, s.index): s for s in store.samples(RUN)}
    assert got[(4, 1)].text == "\ufffd"  # PostgreSQL takes no NUL in text
    assert got[(4, 0)].flags == {"template_leak": "the answer contains <|im_end|>", "unknown_kind": "x"}
    assert store.event_counts([RUN], "alert") == {RUN: 2}


# ---------------------------------------------------------------------- a (fake) run, then db rebuild
def sample_rows(store: Store) -> list[tuple]:
    with Session(store.engine) as session:
        rows = session.exec(select(Sample)).all()
        alerts = session.exec(select(RunEvent.ts, RunEvent.message).where(RunEvent.kind == "alert")).all()
    return sorted((r.run_id, r.step, r.idx, r.prompt, r.text, r.new_tokens, r.flags) for r in rows), sorted(alerts)


def test_a_runs_samples_reach_the_store_with_alerts_and_come_back_after_rebuild(make_orch, store, monkeypatch):
    orch = make_orch()
    cfg = fake(monkeypatch, steps=12, nan_step="0")  # no NaN loss: the only alerts are the samples'
    monkeypatch.setenv("FAKE_SAMPLE_EVERY", "2")  # answers cycle: healthy, empty, loop, leak, healthy, empty
    run_id = orch.start(cfg)
    assert orch.wait(run_id, timeout=60, interval=0.05).status is RunStatus.COMPLETED

    got = orch.samples(run_id)
    assert [s.step for s in got[::2]] == [12, 10, 8, 6, 4, 2] and [s.index for s in got[:2]] == [0, 1]
    assert [s.text for s in got if s.index == 1] == ["", "Hi!", "Hi<|im_end|>", "hi hi hi hi hi hi hi hi", "", "Hi!"]
    assert {s.prompt for s in got} == set(SAMPLE_PROMPTS)
    alerts = [e.message for e in orch.events(run_id) if e.kind == "alert"]
    assert alerts == ["Sample answer 2 at step 4 is empty: the answer is empty.",
                      "Sample answer 2 at step 6 loops: 'hi' repeated 8 times, 100% of the answer.",
                      "Sample answer 2 at step 8 leaks template tokens: the answer contains <|im_end|>."]
    assert orch.alert_counts([run_id]) == {run_id: 3}
    assert [s.text for s in orch.prompt_samples([run_id], SAMPLE_PROMPTS[0])][:1] == ["The capital of France is Paris."]
    orch.close()

    before = sample_rows(store)
    wipe(store)
    rebuild.rebuild(store.url)
    assert sample_rows(Store(store.url)) == before


# ---------------------------------------------------------------------- views from the database, adoption
def test_a_view_from_the_database_lists_sample_alerts_once_per_kind(store):
    new_run(store)
    store.append_samples(RUN, [sample(2, 0), sample(2, 1, "", flags={"empty": "the answer is empty"})])
    view = RemoteView(store.get_run(RUN), store)
    assert [a.message for a in view.live.snapshot().alerts] == [
        "Sample answer 2 at step 2 is empty: the answer is empty."]
    store.append_samples(RUN, [sample(2, 2, "", flags={"empty": "the answer is empty"}),  # the same step grew
                               sample(4, 0, "no no no", flags={"repetition": "'no' repeated 3 times"})])
    view.refresh(store.get_run(RUN))
    assert [a.kind for a in view.live.snapshot().alerts] == ["sample_empty", "sample_repetition"]
    assert [s.step for s in store.samples_from(RUN, 4)] == [4]
    assert view.sample_alerts.observe(6, 0, {"empty": "again"}) == []


def test_a_run_adopted_after_a_restart_does_not_raise_a_sample_alert_twice(make_orch, fake_worker, store,
                                                                           monkeypatch, tmp_path):
    first = make_orch()
    cfg = fake(monkeypatch, steps=12, nan_step="0")
    go = tmp_path / "go"
    monkeypatch.setenv("FAKE_SAMPLE_EVERY", "2")  # empty at step 4 (before the restart) and again at step 12
    monkeypatch.setenv("FAKE_PAUSE_AT", "4")
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(go))
    run_id = first.start(cfg)
    wait_until(lambda: any(s.step == 4 for s in store.samples(run_id)), timeout=30, what="the samples of step 4")
    first.close()  # the server goes away; the worker waits at step 4, then trains on
    go.touch()
    second = Orchestrator(store=store, launcher=fake_worker, start_pump=False)
    try:
        wait_until(lambda: second.pump_once() or second.get_run(run_id).status == "completed", timeout=60,
                   what="the adopted run to complete")
    finally:
        second.close()
    alerts = [e.message for e in store.get_events(run_id) if e.kind == "alert"]
    assert [s.step for s in store.samples(run_id) if s.index == 1 and not s.text] == [12, 4]
    assert alerts == ["Sample answer 2 at step 4 is empty: the answer is empty.",
                      "Sample answer 2 at step 6 loops: 'hi' repeated 8 times, 100% of the answer.",
                      "Sample answer 2 at step 8 leaks template tokens: the answer contains <|im_end|>."]
