"""The "waiting for the cluster" phase of a Ray job Ray cannot place yet: its wording, and the dashboard's side
of a single-worker job Ray holds PENDING (trainer_core/launchers/ray_waiting.py), against a real run folder. The
real cluster's account is tests/launchers/test_ray_waiting.py."""
from __future__ import annotations

from types import SimpleNamespace

from trainer_core.launchers import ray as ray_jobs, ray_waiting as rw
from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.__main__ import _status_text
from ui import format as fmt


def test_the_phase_names_each_short_resource_with_what_is_free():
    assert rw.waiting_phase({"CPU": 1, "GPU": 1}, 4, {"CPU": 12, "GPU": 2}) == \
        "waiting for the cluster: needs 4 GPUs, 2 free"
    assert rw.waiting_phase({"CPU": 1, "GPU": 0}, 3, {"CPU": 2.0}) == "waiting for the cluster: needs 3 CPUs, 2 free"
    assert rw.waiting_phase({"CPU": 1, "GPU": 0.5}, 1, {}) == \
        "waiting for the cluster: needs 0.5 GPU, 0 free; needs 1 CPU, 0 free"
    assert rw.waiting_phase({"CPU": 1, "test-node-5": 1}, 1, {"CPU": 2}) == \
        "waiting for the cluster: needs 1 test-node-5, 0 free"


def test_a_worker_no_node_can_hold_is_named_even_when_enough_is_free_in_all():
    largest = rw.largest_node([{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}])
    assert largest == {"CPU": 8, "GPU": 1}
    assert rw.waiting_phase({"CPU": 1, "GPU": 2}, 1, {"CPU": 16, "GPU": 2}, largest) == \
        "waiting for the cluster: needs 2 GPUs, 1 CPU, free in all but not yet placed by Ray; no node has 2 GPUs " \
        "for one worker"


def test_a_single_worker_jobs_needs_are_read_from_what_ray_holds_of_it():
    details = SimpleNamespace(runtime_env={"env_vars": {ray_jobs.GPUS_ENV: "2.0", "PYTHONPATH": "/x"}})
    assert ray_jobs.job_needs(details) == {"CPU": 1.0, "GPU": 2.0}
    assert ray_jobs.job_needs(SimpleNamespace(runtime_env=None)) == {"CPU": 1.0, "GPU": 0.0}


def read_log(run_dir) -> list[ev.Event]:
    return [ev.decode(line) for line in (run_dir / ev.LOG_NAME).read_bytes().splitlines()]


def test_a_pending_job_says_what_it_waits_for_once_then_that_it_was_placed(tmp_path, monkeypatch):
    monkeypatch.setattr(rw, "CHECK_EVERY_S", 0.0)
    usage = {"a": {"CPU": (0.0, 1.0), "GPU": (1.0, 2.0)}, "b": {"CPU": (1.0, 1.0)}}
    job = rw.PendingJob(tmp_path, lambda: usage, stop_job=lambda: None)
    job.follow("PENDING", {"CPU": 1, "GPU": 2})
    job.follow("PENDING", {"CPU": 1, "GPU": 2})  # the same shortfall: not written twice
    job.follow("RUNNING", {"CPU": 1})
    assert [(e.status, e.phase) for e in read_log(tmp_path)] == [
        ("starting", "waiting for the cluster: needs 2 GPUs, 1 free"), ("starting", rw.PLACED)]


def test_a_pending_job_with_room_is_starting_not_waiting(tmp_path, monkeypatch):
    monkeypatch.setattr(rw, "CHECK_EVERY_S", 0.0)
    job = rw.PendingJob(tmp_path, lambda: {"a": {"CPU": (2.0, 2.0)}}, stop_job=lambda: None)
    job.follow("PENDING", {"CPU": 1})  # room enough: Ray is setting up its runtime environment
    rw.PendingJob(tmp_path, lambda: {}, stop_job=lambda: None).follow("PENDING", {"CPU": 1})  # usage unknown
    assert not (tmp_path / ev.LOG_NAME).exists()


def test_placed_is_not_written_once_the_worker_wrote_its_own_status(tmp_path, monkeypatch):
    monkeypatch.setattr(rw, "CHECK_EVERY_S", 0.0)
    job = rw.PendingJob(tmp_path, lambda: {"a": {"CPU": (0.0, 1.0)}}, stop_job=lambda: None)
    job.follow("PENDING", {"CPU": 1})
    rw.append(tmp_path, ev.StatusEvent(status="running", phase="training"))  # the worker got there first
    job.follow("RUNNING", {"CPU": 1})
    assert [e.status for e in read_log(tmp_path)] == ["starting", "running"]  # never taken back to starting


def test_cancel_of_a_pending_job_records_it_cancelled_and_stops_it_on_ray(tmp_path):
    stopped = []
    job = rw.PendingJob(tmp_path, lambda: {"a": {"CPU": (0.0, 1.0)}}, stop_job=lambda: stopped.append(True))
    assert job.follow("PENDING", {"CPU": 1}) is False  # no request: it waits on (and says so)
    control.request(tmp_path, control.Action.CANCEL)
    assert job.follow("PENDING", {"CPU": 1}) is True  # over for the run, though Ray still holds the job
    assert job.follow("PENDING", {"CPU": 1}) is True  # recorded and stopped once
    assert [(e.kind, e.status) for e in read_log(tmp_path)] == [("status", "starting"), ("complete", "cancelled")]
    assert stopped == [True]


def test_history_and_the_cli_show_a_starting_jobs_phase():
    phase = "waiting for the cluster: needs 4 GPUs, 2 free"
    assert fmt.status_badge(RunStatus.STARTING, JobKind.TRAIN, phase) == f"🚀 Starting · {phase}"
    assert fmt.status_badge(RunStatus.RUNNING, JobKind.TRAIN, "training") == "🏃 Training"
    assert _status_text(SimpleNamespace(status="starting", phase=phase)) == f"Starting ({phase})"


def test_a_wait_that_cannot_be_written_never_stops_the_pump(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rw, "CHECK_EVERY_S", 0.0)
    job = rw.PendingJob(tmp_path / "deleted", lambda: {"a": {"CPU": (0.0, 1.0)}}, stop_job=lambda: None)
    job.follow("PENDING", {"CPU": 1})  # the run folder is gone: said, not raised into the pump's tick
    assert "could not be followed: FileNotFoundError" in capsys.readouterr().err


def test_junk_in_the_clusters_usage_text_is_skipped_not_raised(monkeypatch):
    """Ray's dashboard answers the per-node usage as text lines ("1.0/2.0 CPU"): a line the pattern half-matches
    ("1.2.3/4 CPU") raised ValueError out of node_usage, which New run's capacity line and free_resources call
    without a guard. Such a line says nothing; the node's other lines still count."""
    import io
    import json

    body = json.dumps({"data": {"nodeLogicalResources": {"n1": "1.2.3/4.0 CPU\n0.0/1.0 GPU", "n2": "1.0/2.0 CPU"}}})
    monkeypatch.setattr(rw.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(body.encode()))
    assert rw.node_usage("http://head:8265") == {"n1": {"GPU": (1.0, 1.0)}, "n2": {"CPU": (1.0, 2.0)}}
    assert ray_jobs.free_resources("http://head:8265") == {"n1": {"GPU": 1.0}, "n2": {"CPU": 1.0}}
