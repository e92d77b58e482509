"""ray_max_failures without a cluster: the field's check, the job's environment, what Ray Train's controller
records before it restarts the workers, the checkpoint the restarted ranks resume from and the timeline's words
(trainer_core/worker/ray_entry.py). The restart itself on a real cluster: tests/launchers/test_ray_node_loss.py."""
from __future__ import annotations

import json

import pytest

from tests.launchers.test_ray_failures import WorkerGroupFailed, exited, run_folder
from trainer_core.specs import checkpoints
from trainer_core.config import FieldError, TrainConfig
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.paths import UnsafePathError
from trainer_core.worker import ranks
from trainer_core.worker.ray_entry import (RESTARTS_FILE, exit_path, read_restarts, record_restart, report_failure,
                                          resume_from, resumed_message)


def saved(run_dir, step: int, complete: bool = True):
    folder = run_dir / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def warnings_in(run_dir) -> list[str]:
    events, _ = ev.read_new(run_dir / ev.LOG_NAME, 0)
    return [e.message for e in events if isinstance(e, ev.WarningEvent)]


@pytest.mark.parametrize("value", [-1, 11, 1.5, "2", True])
def test_ray_max_failures_is_a_whole_number_up_to_ten(value, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    def problems(**values) -> list[FieldError]:
        return [p for p in TrainConfig(launcher="ray", **values).validate() if p.field == "ray_max_failures"]

    assert problems(ray_max_failures=value, num_processes=2) == [FieldError(
        "ray_max_failures", f"use a whole number from 0 (a lost worker fails the run) to 10, got {value!r}")]
    assert problems(ray_max_failures=10, num_processes=2) == []
    assert problems(ray_max_failures=0, num_processes=1) == []
    assert problems(ray_max_failures=1, num_processes=1) == [FieldError(
        "ray_max_failures", "restarts apply to Ray Train's workers: set num_processes to 2 or more, or "
                            "ray_max_failures to 0")]


def test_the_job_environment_carries_max_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path))
    env = ray_jobs.RayLauncher("http://head:8265").environment(paths.run_dir("r1"), 2, 0.0, 3)
    assert env[ray_jobs.MAX_FAILURES_ENV] == "3"
    assert ray_jobs.RayLauncher("http://head:8265").environment(paths.run_dir("r1"), 2, 0.0)[
        ray_jobs.MAX_FAILURES_ENV] == "0"


def test_before_a_restart_the_lost_rank_and_its_node_are_named_and_the_failed_ranks_files_set_aside(tmp_path):
    run_dir = run_folder(tmp_path)
    exited(run_dir, 0, 1, own_error="RuntimeError: gloo: Connection reset by peer")
    failure = {0: RuntimeError("rank 0 exited with code 1"), 1: RuntimeError("A worker health check failed.")}
    lost = record_restart(run_dir, 2, failure, restart=1, max_failures=2)
    assert lost == "Rank 1 of 2 on node 10.0.0.2 (bbbbbbbbbbbb) was lost: its Ray worker died (A worker health check failed.)"
    assert warnings_in(run_dir) == [f"{lost}. Ray Train restarts the workers from the latest checkpoint (restart 1 of at "
                                    "most 2)."]
    [record] = read_restarts(run_dir)
    assert (record["restart"], record["rank"], record["node_id"], record["address"], record["lost"]) == (
        1, 1, "bbbbbbbbbbbb2222", "10.0.0.2", lost)
    assert resumed_message(record, "", 2).endswith(", after rank 1 on node 10.0.0.2 (bbbbbbbbbbbb) was lost.")
    assert not exit_path(run_dir, 0).exists() and not ranks.rank_error_path(run_dir, 0).exists()
    kept = run_dir / "ranks" / "ray-attempt-1"
    assert sorted(p.name for p in kept.iterdir()) == ["rank-0.error.json", "ray-rank-0.exit.json"]


def test_a_restart_after_a_rank_failed_on_its_own_says_failed_not_lost(tmp_path):
    run_dir = run_folder(tmp_path)
    exited(run_dir, 1, 1, own_error="ValueError: bad row")
    record_restart(run_dir, 2, {1: RuntimeError("rank 1 exited with code 1")}, restart=1, max_failures=1)
    assert warnings_in(run_dir)[0].startswith("Rank 1 of 2 on node 10.0.0.2 (bbbbbbbbbbbb) failed: ValueError: bad row. ")
    assert resumed_message(read_restarts(run_dir)[-1], "", 1).endswith(
        ", after rank 1 on node 10.0.0.2 (bbbbbbbbbbbb) failed.")


def test_restarted_ranks_resume_from_the_latest_completed_checkpoint(tmp_path):
    run_dir = run_folder(tmp_path)
    assert resume_from(run_dir, []) == ""  # the first start: config.yaml decides
    record_restart(run_dir, 2, {1: RuntimeError("A worker health check failed.")}, restart=1, max_failures=1)
    assert resume_from(run_dir, read_restarts(run_dir)) == ""  # nothing saved yet: from step 0
    saved(run_dir, 4)
    saved(run_dir, 8, complete=False)  # the lost workers' save that never finished
    exited(run_dir, 0, 1)  # written by the old rank 0 after the restart was recorded
    resume = resume_from(run_dir, read_restarts(run_dir))
    assert resume == str(run_dir / "checkpoints" / "checkpoint-4")
    assert not exit_path(run_dir, 0).exists()  # the next failure is judged on its own account
    assert resumed_message(read_restarts(run_dir)[-1], resume, 1) == (
        "Restart 1 of at most 1: resuming from checkpoint-4 (step 4), after rank 1 on node 10.0.0.2 (bbbbbbbbbbbb) "
        "was lost.")
    assert resumed_message(read_restarts(run_dir)[-1], "", 1) == (
        "Restart 1 of at most 1: starting over from step 0 (no checkpoint had been saved), after rank 1 on node "
        "10.0.0.2 (bbbbbbbbbbbb) was lost.")


def test_the_worker_resumes_from_the_restart_checkpoint_only_when_it_is_its_own(tmp_path):
    run_dir = run_folder(tmp_path)
    mine, other = saved(run_dir, 4), saved(tmp_path / "other-run", 6)
    assert checkpoints.resume_point(run_dir, "", {}) is None
    assert checkpoints.resume_point(run_dir, "/runs/a/checkpoint-2", {}) == "/runs/a/checkpoint-2"
    environ = {checkpoints.RESUME_ENV: str(mine)}
    assert checkpoints.resume_point(run_dir, "/runs/a/checkpoint-2", environ) == str(mine)
    with pytest.raises(UnsafePathError, match="is not a completed checkpoint of this run"):
        checkpoints.resume_point(run_dir, "", {checkpoints.RESUME_ENV: str(other)})


def test_a_run_that_fails_after_its_restarts_says_how_many_it_used(tmp_path):
    run_dir = run_folder(tmp_path)
    (run_dir / RESTARTS_FILE).write_text(json.dumps({"restart": 1, "rank": 1}) + "\n")
    message = report_failure(run_dir, 2, WorkerGroupFailed({1: RuntimeError("A worker health check failed.")}))
    assert message == ("Rank 1 of 2 on node 10.0.0.2 (bbbbbbbbbbbb) was lost: its Ray worker died (A worker health "
                       "check failed.) (after 1 restart of the workers)")


def test_the_resume_checkpoint_is_never_inherited_from_the_servers_environment():
    """Hostile review: FINETUNE_STUDIO_RESUME_FROM left in the server's environment reached every worker (local,
    torchrun, Ray) and made each run fail resolving it; only ray_entry sets it, for the workers it restarts."""
    from trainer_core.auth import access
    from trainer_core.specs import checkpoints

    env = access.worker_env({checkpoints.RESUME_ENV: "/tmp/x/checkpoints/checkpoint-4", "FINETUNE_STUDIO_HOME": "/d"})
    assert checkpoints.RESUME_ENV not in env and env["FINETUNE_STUDIO_HOME"] == "/d"
