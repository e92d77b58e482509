"""Which rank a failed Ray Train run blames (trainer_core/worker/ray_entry.report_failure), from what the ranks
left in the run folder and Ray Train's per-rank failures, without a cluster: a rank whose Ray worker died comes
first, then a rank killed by a signal, then the earliest error a rank reported itself."""
from __future__ import annotations

import json
import time

from trainer_core.protocol import events as ev
from trainer_core.worker import ranks
from trainer_core.worker.ray_entry import PLACEMENT_FILE, exit_path, report_failure

NODES = [{"rank": 0, "node_id": "aaaaaaaaaaaa1111", "address": "10.0.0.1", "gpus": []},
         {"rank": 1, "node_id": "bbbbbbbbbbbb2222", "address": "10.0.0.2", "gpus": []}]


class WorkerGroupFailed(Exception):
    """Ray Train's WorkerGroupError as report_failure reads it: {world rank: exception}."""

    def __init__(self, worker_failures: dict[int, Exception]):
        super().__init__("Training failed due to worker errors")
        self.worker_failures = worker_failures


def run_folder(tmp_path):
    (tmp_path / "ranks").mkdir()
    (tmp_path / PLACEMENT_FILE).write_text(json.dumps(NODES))
    (tmp_path / "ranks" / "ray-rank-1.log").write_text("loading\nstep 3\n")
    return tmp_path


def exited(run_dir, rank: int, code: int, own_error: str = "") -> None:
    exit_path(run_dir, rank).write_text(json.dumps({"exitcode": code}))
    if own_error:
        ranks.rank_error_path(run_dir, rank).write_text(json.dumps({"message": own_error, "exc_type": "RuntimeError",
                                                                    "ts": time.time()}))


def error_event(run_dir) -> ev.ErrorEvent:
    events, _ = ev.read_new(run_dir / ev.LOG_NAME, 0)
    assert len(events) == 1 and isinstance(events[0], ev.ErrorEvent)
    return events[0]


def test_a_rank_whose_ray_worker_died_is_blamed_over_its_peer_that_failed_in_a_collective(tmp_path):
    run_dir = run_folder(tmp_path)
    exited(run_dir, 0, 1, own_error="RuntimeError: gloo: Connection reset by peer")  # the symptom, not the cause
    failure = WorkerGroupFailed({0: RuntimeError("rank 0 exited with code 1"),
                                 1: RuntimeError("A worker health check failed.\nmore detail")})
    message = report_failure(run_dir, 2, failure)
    assert message == ("Rank 1 of 2 on node 10.0.0.2 (bbbbbbbbbbbb) was lost: its Ray worker died (A worker health "
                       "check failed.)")
    event = error_event(run_dir)
    assert (event.message, event.exc_type, event.traceback) == (message, "RankLost", "loading\nstep 3")


def test_a_rank_killed_by_a_signal_is_blamed_over_the_error_its_peer_reported(tmp_path):
    run_dir = run_folder(tmp_path)
    exited(run_dir, 0, 1, own_error="RuntimeError: gloo: Connection reset by peer")
    exited(run_dir, 1, -9)
    failure = WorkerGroupFailed({0: RuntimeError("exited 1"), 1: RuntimeError("exited -9")})
    assert report_failure(run_dir, 2, failure) == (
        "Rank 1 of 2 on node 10.0.0.2 (bbbbbbbbbbbb) was killed by SIGKILL (often the out-of-memory killer)")


def test_without_any_account_from_the_ranks_the_run_fails_with_rays_first_line(tmp_path):
    run_dir = run_folder(tmp_path)
    message = report_failure(run_dir, 2, RuntimeError("\nTraining failed due to controller error:\nplacement"))
    assert message == "The Ray Train run failed: Training failed due to controller error:"
    assert error_event(run_dir).exc_type == "RuntimeError"
