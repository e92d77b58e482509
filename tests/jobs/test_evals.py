"""Eval jobs on the orchestrator's side: results reach the database through the pump (idempotently), the
base-model baseline is queued once per data and settings and reused, and the CLI refuses bad input."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from db.entities import RunRecord
from tests.support import ROOT, fake, wait_until
from trainer_core.specs import jobspec
from trainer_core.__main__ import main as cli
from trainer_core.config import BUNDLED_MODEL, ConfigError
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobs import pump
from trainer_core.jobs.live import LiveRun
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev
from trainer_core.protocol import control, paths
from trainer_core.protocol.status import JobKind, RunStatus

DATA = ROOT / "tests" / "fixtures" / "datasets"


def eval_events(job_dir, metrics: dict) -> None:
    writer = ev.EventWriter(job_dir / ev.LOG_NAME)
    writer.emit(ev.StatusEvent(status="running", phase="generating"))
    for index, (answer, exact) in enumerate([("5", 1.0), ("chien", 0.0)]):
        writer.emit(ev.EvalSampleEvent(index=index, prompt=f"q{index} <b>", reference="ref", answer=answer, exact=exact,
                                       rouge_l=exact, bleu=None, loss=float("nan") if index else 0.5, tokens=2))
        writer.emit(ev.ProgressEvent(step=index + 1, total_steps=2))
    writer.emit(ev.EvalResultEvent(source_key="run:r1", base_model=BUNDLED_MODEL, data_fingerprint="fp",
                                   settings_hash="sh", metrics=metrics, source_run_id="r1", data_label="alpaca.jsonl"))
    writer.emit(ev.CompleteEvent(status="completed", steps=2))
    writer.close()


def replay(store, job_id, job_dir) -> pump.Tracker:
    tracker = pump.Tracker(job_id, job_dir, LiveRun(job_id, "eval", RunStatus.RUNNING), 0,
                           open(job_dir / ".pump.lock", "w"), kind=JobKind.EVAL)
    pump.drain(tracker, store, max_reads=None)
    pump.flush(tracker, store)
    tracker.lock_fh.close()
    tracker.log.close()
    return tracker


def test_samples_and_the_result_reach_the_store_once_however_often_the_log_is_read(home, store):
    job_id = "20260101-000000-e0e0e0"
    job_dir = paths.run_dir(job_id)
    job_dir.mkdir(parents=True)
    store.create_run(RunRecord(id=job_id, kind=JobKind.EVAL, status=RunStatus.RUNNING))
    metrics = {"samples": 2, "exact": 0.5, "lm_eval": {"tiny": {"acc,none": 1.0}}}
    eval_events(job_dir, metrics)
    assert replay(store, job_id, job_dir).terminal[0] is RunStatus.COMPLETED
    replay(store, job_id, job_dir)  # a restart reads the log again from its start: nothing doubles
    samples = store.eval_samples(job_id)
    assert samples[["index", "prompt", "answer", "exact"]].values.tolist() == [[0, "q0 <b>", "5", 1.0],
                                                                              [1, "q1 <b>", "chien", 0.0]]
    assert samples["loss"].tolist()[0] == 0.5 and samples["loss"].isna().tolist() == [False, True]  # NaN: no loss
    result = store.eval_result(job_id)
    assert (result.metrics, result.source_run_id, result.data_label) == (metrics, "r1", "alpaca.jsonl")
    store.finish_run(job_id, RunStatus.COMPLETED)
    assert store.latest_eval_metrics(["r1", "other"]) == {"r1": metrics}
    assert store.find_eval("run:r1", "fp", "sh").job_id == job_id and store.find_eval("run:r1", "fp", "x") is None
    store.delete_run(job_id)
    assert store.eval_result(job_id) is None and store.eval_samples(job_id).empty


@pytest.fixture
def trained(orch, monkeypatch):
    """A finished (fake) training run with an adapter on disk, and a test file."""
    cfg = fake(monkeypatch, steps=2)
    run_id = orch.start(dataclasses.replace(cfg, run_name="trained"))
    orch.wait(run_id, timeout=60, interval=0.05)
    adapter = paths.run_dir(run_id) / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    return run_id


def hold_workers(monkeypatch, tmp_path) -> Path:
    """Fake workers started from now on hold after their first step until the returned file exists: a job under
    way stays under way however busy the machine (a fake eval reports no scored samples, so once it has completed
    it is rightly never reused: the old test relied on the second submission beating the baseline's worker)."""
    release = tmp_path / "release-workers"
    monkeypatch.setenv("FAKE_PAUSE_AT", "1")
    monkeypatch.setenv("FAKE_PAUSE_UNTIL", str(release))
    return release


def test_the_baseline_is_queued_once_and_reused(orch, trained, home, tmp_path, monkeypatch):
    hold_workers(monkeypatch, tmp_path)
    data = tmp_path / "test.jsonl"
    data.write_bytes((DATA / "alpaca.jsonl").read_bytes())
    spec = EvalSpec(source=ModelSource(run_id=trained), data=str(data), max_new_tokens=8)
    first, baseline = orch.start_eval(spec)
    assert baseline is not None and first != baseline
    again, same = orch.start_eval(dataclasses.replace(spec, source=ModelSource(run_id=trained, checkpoint=None)))
    assert same == baseline and again not in (first, baseline)
    base_evals = [r for r in orch.list_runs() if r.kind is JobKind.EVAL and r.model == f"base:{BUNDLED_MODEL}"]
    assert [r.id for r in base_evals] == [baseline]
    # The baseline ran the same settings on the same data; the run's eval reads rows with the run's format settings.
    base_spec = jobspec.read_spec(paths.run_dir(baseline))
    assert (base_spec.source, base_spec.data, base_spec.baseline) == (ModelSource(model=BUNDLED_MODEL), str(data), False)
    assert orch.eval_result(first).base_model == BUNDLED_MODEL
    assert orch.eval_baseline(orch.eval_result(first)).job_id == baseline
    # Other scored settings, or other data: another baseline; one waiting in the queue (the held baseline has the
    # only device) is reused like one that runs.
    _, other = orch.start_eval(dataclasses.replace(spec, max_new_tokens=9))
    assert other not in (None, baseline) and orch.store.get_run(other).status is RunStatus.QUEUED
    _, queued = orch.start_eval(dataclasses.replace(spec, max_new_tokens=9))
    assert queued == other
    data.write_text(data.read_text() + '{"instruction": "x", "output": "y"}\n')
    _, changed = orch.start_eval(spec)
    assert changed not in (None, baseline, other)


def test_a_failed_baseline_is_not_reused(orch, trained, tmp_path, monkeypatch):
    data = tmp_path / "test.jsonl"
    data.write_bytes((DATA / "alpaca.jsonl").read_bytes())
    spec = EvalSpec(source=ModelSource(run_id=trained), data=str(data), max_new_tokens=10)
    fake(monkeypatch, mode="raise")
    _, failing = orch.start_eval(spec)
    assert orch.wait(failing, timeout=60, interval=0.05).status is RunStatus.FAILED
    _, retried = orch.start_eval(spec)
    assert retried not in (None, failing)


def test_a_baseline_being_stopped_is_not_reused(orch, trained, tmp_path, monkeypatch):
    """A stopped or cancelled eval never counts as a baseline, so one on its way there does not either."""
    release = hold_workers(monkeypatch, tmp_path)
    data = tmp_path / "test.jsonl"
    data.write_bytes((DATA / "alpaca.jsonl").read_bytes())
    spec = EvalSpec(source=ModelSource(run_id=trained), data=str(data), max_new_tokens=8)
    _, baseline = orch.start_eval(spec)
    wait_until(lambda: orch.snapshot(baseline).step >= 1, what="the baseline's first step")  # held from now on
    orch.stop(baseline)  # the held worker reads the request only once released: the row says stopping until then
    assert orch.store.get_run(baseline).status is RunStatus.STOPPING
    _, fresh = orch.start_eval(spec)
    assert fresh not in (None, baseline)
    release.touch()
    assert orch.wait(baseline, timeout=60, interval=0.05).status is RunStatus.STOPPED


def test_an_eval_that_cannot_be_submitted_takes_back_the_baseline_it_launched(orch, trained, tmp_path, monkeypatch):
    """Both or neither: the baseline is submitted first, and was left running unfollowed when the eval then failed."""
    release = hold_workers(monkeypatch, tmp_path)
    data = tmp_path / "test.jsonl"
    data.write_bytes((DATA / "alpaca.jsonl").read_bytes())
    spec = EvalSpec(source=ModelSource(run_id=trained), data=str(data), max_new_tokens=8)
    submit = orch.submit

    def no_room_for_the_eval(job, actor=None):
        if job.baseline:  # the eval itself (its baseline is submitted with baseline=False, before it)
            raise OSError(28, "No space left on device")
        return submit(job, actor)

    def baseline_of_failed(settings: EvalSpec) -> RunRecord:
        before = {r.id for r in orch.list_runs()}
        monkeypatch.setattr(orch, "submit", no_room_for_the_eval)
        with pytest.raises(OSError, match="No space left"):
            orch.start_eval(settings)
        monkeypatch.setattr(orch, "submit", submit)
        [baseline] = [r for r in orch.list_runs() if r.id not in before]
        assert baseline.model == f"base:{BUNDLED_MODEL}"
        return baseline

    launched = baseline_of_failed(spec)  # launched at once (the device was free), then asked to cancel
    assert control.read(paths.run_dir(launched.id)) is control.Action.CANCEL  # its worker, held, reads it once released
    _, kept = orch.start_eval(dataclasses.replace(spec, max_new_tokens=9))  # queued, or held once the first ended
    monkeypatch.setattr(orch, "submit", no_room_for_the_eval)
    with pytest.raises(OSError, match="No space left"):
        orch.start_eval(dataclasses.replace(spec, max_new_tokens=9))  # found ``kept``: nothing of it to take back
    monkeypatch.setattr(orch, "submit", submit)
    assert control.read(paths.run_dir(kept)) is None and not orch.store.get_run(kept).status.is_terminal()
    # ``kept`` is ahead of it (queued, or held by its worker): this one waits in the queue, and leaves it at once
    assert baseline_of_failed(dataclasses.replace(spec, max_new_tokens=10)).status is RunStatus.CANCELLED
    release.touch()
    assert orch.wait(launched.id, timeout=60, interval=0.05).status is RunStatus.CANCELLED


def test_start_eval_refuses_bad_input_with_every_problem(orch, trained, tmp_path):
    with pytest.raises(ConfigError) as refused:
        orch.start_eval(EvalSpec(source=ModelSource(run_id=trained, checkpoint=3), data=str(tmp_path / "none.jsonl"),
                                 metrics=["exact", "f1"]))
    assert [e.field for e in refused.value.errors] == ["checkpoint", "metrics", "data"]
    assert orch.list_runs() and all(r.kind is JobKind.TRAIN for r in orch.list_runs())  # nothing half-submitted


def test_the_cli_says_what_is_wrong_and_exits_2(orch, trained, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", orch.store.url)  # the CLI's own orchestrator, on the same database
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli(["eval", trained[:12], "--data", str(empty)]) == 2
    assert "error: data: empty.jsonl has no rows" in capsys.readouterr().err
    assert cli(["eval", trained, "--checkpoint", "9", "--data", str(DATA / "alpaca.jsonl")]) == 2
    assert "error: checkpoint: run 'trained' has no checkpoint at step 9" in capsys.readouterr().err
    assert cli(["eval", "no-such-run", "--data", str(DATA / "alpaca.jsonl")]) == 2
    assert "no run matches 'no-such-run'" in capsys.readouterr().err
    (tmp_path / "text.csv").write_bytes((DATA / "text.csv").read_bytes())
    assert cli(["eval", trained, "--data", str(tmp_path / "text.csv"), "--metrics", "exact"]) == 2
    assert "error: data: raw text has no reference answers" in capsys.readouterr().err
    assert all(r.kind is JobKind.TRAIN for r in orch.list_runs())


def test_a_nul_in_a_test_row_is_stored_as_a_replacement_character_and_the_eval_completes(home, store):
    """PostgreSQL refuses NUL in text: the sample write failed at every flush (a DataError), so nothing after it
    (the result, the offset) reached the database."""
    job_id = "20260101-000000-e0e0e1"
    job_dir = paths.run_dir(job_id)
    job_dir.mkdir(parents=True)
    store.create_run(RunRecord(id=job_id, kind=JobKind.EVAL, status=RunStatus.RUNNING))
    writer = ev.EventWriter(job_dir / ev.LOG_NAME)
    writer.emit(ev.EvalSampleEvent(index=0, prompt="a\x00b", reference="r\x00", answer="\x00x", exact=0.0))
    writer.emit(ev.CompleteEvent(status="completed", steps=1))
    writer.close()
    assert replay(store, job_id, job_dir).terminal[0] is RunStatus.COMPLETED
    assert store.eval_samples(job_id)[["prompt", "reference", "answer"]].values.tolist() == [
        ["a\ufffdb", "r\ufffd", "\ufffdx"]]
