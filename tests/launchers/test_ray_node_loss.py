"""Losing a node (issue 23) against a real local Ray cluster of three nodes (a head and two ``ray start --address``
nodes, one CPU each): a two-worker run with ``ray_max_failures: 1`` loses the node of one of its ranks after a
checkpoint; Ray Train restarts the workers on the capacity left (the head and the spare node), every rank resumes
from the run's latest checkpoint, the timeline names the lost rank, its node and the step it resumed from, and the
run completes with exactly one metrics row per step. (With ``ray_max_failures: 0`` the same loss fails the run
naming the rank and node: tests/launchers/test_ray_cluster.py.) Skips without ray."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.launchers.test_ray_cluster import cluster, on_ray, studio  # noqa: F401 - fixtures
from tests.support.ray_cluster import local_cluster
from tests.support import wait_until
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.ray_entry import PLACEMENT_FILE, RESTARTS_FILE

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

pytestmark = [pytest.mark.ray, pytest.mark.train]

MAX_STEPS, SAVE_STEPS = 16, 4  # the loss comes at step 6 or soon after: 10 steps of margin before the end


@pytest.fixture(scope="module")
def ray_cluster():
    """Three nodes: room for the two workers once one node is gone."""
    with local_cluster(nodes=3) as running:
        yield running


def test_losing_a_node_resumes_from_the_latest_checkpoint_with_one_row_per_step(studio, ray_cluster,  # noqa: F811
                                                                                 tiny_model):
    run_id = studio.start(on_ray(tiny_model, num_processes=2, max_steps=MAX_STEPS, save_steps=SAVE_STEPS,
                                 ray_max_failures=1))
    run_dir = paths.run_dir(run_id)

    def past_the_first_checkpoint() -> bool:  # a few steps past it, which the restarted workers train again
        snap = studio.snapshot(run_id)
        assert not snap.status.is_terminal(), f"run ended early: {snap.status} {snap.error}\n{studio.log_tail(run_id)}"
        return snap.step >= SAVE_STEPS + 2 and (run_dir / "checkpoints" / f"checkpoint-{SAVE_STEPS}").is_dir()

    wait_until(past_the_first_checkpoint, timeout=240, what=f"step {SAVE_STEPS + 2}")
    placement = json.loads((run_dir / PLACEMENT_FILE).read_text())
    # Never the head: it holds the job's driver and Ray Train's controller. One rank at least is elsewhere.
    lost = next(p for p in sorted(placement, key=lambda p: -p["rank"]) if ray_cluster.index_of(p["node_id"]) != 0)
    seen = studio.snapshot(run_id).step  # reported before the loss
    ray_cluster.lose_node(ray_cluster.index_of(lost["node_id"]))
    assert not studio.snapshot(run_id).status.is_terminal()  # lost mid-run, not after the last step

    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, (snap.error, studio.log_tail(run_id))

    # The timeline: the loss named at once by Ray Train's controller, then the restart and its step.
    node = f"node {lost['address']} ({lost['node_id'][:12]})"
    warnings = [e.message for e in studio.events(run_id) if e.kind == "warning"]
    [loss] = [w for w in warnings if w.startswith("Rank ")]
    assert loss.startswith(f"Rank {lost['rank']} of 2 on {node} was lost: its Ray worker died ("), loss
    assert loss.endswith("). Ray Train restarts the workers from the latest checkpoint (restart 1 of at most 1).")
    [resumed] = [w for w in warnings if w.startswith("Restart 1 of at most 1: ")]
    assert warnings.index(loss) < warnings.index(resumed)
    step = int(resumed.split("(step ")[1].split(")")[0])
    assert resumed == (f"Restart 1 of at most 1: resuming from checkpoint-{step} (step {step}), after rank "
                       f"{lost['rank']} on {node} was lost.")
    assert step >= SAVE_STEPS and step % SAVE_STEPS == 0
    [restart] = [json.loads(line) for line in (run_dir / RESTARTS_FILE).read_text().splitlines()]
    assert (restart["rank"], restart["node_id"]) == (lost["rank"], lost["node_id"])
    now = json.loads((run_dir / PLACEMENT_FILE).read_text())  # the restarted workers, on the nodes left
    assert lost["node_id"] not in {p["node_id"] for p in now} and len(now) == 2

    # Metrics: one row per step; the steps up to the checkpoint were trained once, the ones after it that the lost
    # workers had reported were trained again, and their rows hold the resumed run's values.
    progress, _ = ev.read_new(run_dir / ev.LOG_NAME, 0)
    reported = [e for e in progress if isinstance(e, ev.ProgressEvent) and e.loss is not None]
    times = Counter(e.step for e in reported)
    assert sorted(times) == list(range(1, MAX_STEPS + 1))
    assert all(times[s] == 1 for s in range(1, step + 1)), times  # resumed from the checkpoint, not from step 0
    assert all(times[s] == 2 for s in range(step + 1, seen + 1)) and set(times.values()) <= {1, 2}, (seen, times)
    frame = studio.metrics(run_id).dropna(subset=["loss"])
    assert list(frame["step"]) == list(range(1, MAX_STEPS + 1))
    last_reported = {e.step: e.loss for e in reported}  # the last report of each step wins
    assert dict(zip(frame["step"], frame["loss"])) == pytest.approx(last_reported)
