"""The placement watch of a multi-worker Ray run's driver (trainer_core/worker/ray_entry.py): while Ray cannot place
the run's Ray Train workers, the run's phase says what they need and what is free (trainer_core/launchers/
ray_waiting.py). Runs in the driver, which imports ray but never the ML stack."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from trainer_core.launchers import ray_waiting
from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import RunStatus

PLACED_EVERY_S = 5.0  # how often a run whose workers are placed is asked (each is a request to Ray's state API)


class PlacementWatch(threading.Thread):
    """Says in the run's timeline while Ray cannot place the workers (this job's placement group waits:
    ``waiting for the cluster: needs 3 CPUs, 2 free``) and again once it has (trainer_core/launchers/ray_waiting.py).
    While they wait no rank reads the control file, so this answers Stop and Cancel: the run ends cancelled and
    this driver exits, which ends Ray Train's controller and its pending placement group with it. It watches the
    whole run, so the restarted workers after a lost node say what they wait for too."""

    def __init__(self, run_dir: Path, processes: int, resources: dict, every_s: float = 1.0):
        super().__init__(name="placement-watch", daemon=True)
        self.run_dir, self.processes, self.resources, self.every_s = run_dir, processes, resources, every_s
        self.done = threading.Event()
        self.shown = ""  # the waiting phase last written ("" none)

    def run(self) -> None:
        import ray
        from ray.util.state import list_placement_groups

        job = ray.get_runtime_context().get_job_id()
        pending_before, every = False, self.every_s
        while not self.done.wait(every):
            try:  # this job's placement groups: Ray Train's workers' (its controller is an actor of this job)
                states = {g.state for g in list_placement_groups(filters=[("creator_job_id", "=", job)],
                                                                 detail=True, raise_on_missing_output=False)}
            except Exception:  # noqa: BLE001 - Ray's state API did not answer this time: asked again next second
                continue
            pending = bool(states & {"PENDING", "RESCHEDULING"})
            if pending and self.shown and control.read(self.run_dir) is not None:
                self.answer_request()
            if pending and pending_before:  # one second pending: not the instant between asking and placing
                largest = ray_waiting.largest_node(n["Resources"] for n in ray.nodes() if n.get("Alive"))
                self.show(ray_waiting.waiting_phase(self.resources, self.processes, ray.available_resources(),
                                                    largest))
            elif self.shown and "CREATED" in states and not pending:
                self.show(ray_waiting.PLACED)
                self.shown = ""
            pending_before = pending
            # Once placed, a wait can only come back with a restart of the workers: ask less often.
            every = self.every_s if pending or "CREATED" not in states else PLACED_EVERY_S

    def show(self, phase: str) -> None:
        if phase != self.shown:
            ray_waiting.append(self.run_dir, ev.StatusEvent(status=RunStatus.STARTING.value, phase=phase))
            self.shown = phase

    def answer_request(self) -> None:
        """Stop & save or Cancel while the workers wait: nothing was trained, so the run ends cancelled (as a
        queued run does). fit() cannot be interrupted from this thread: the driver exits, and Ray ends the
        job's controller and its placement group with it."""
        ray_waiting.append(self.run_dir, ev.CompleteEvent(status=RunStatus.CANCELLED.value))
        print("Stop/Cancel requested while the workers waited for the cluster: the run ends cancelled", flush=True)
        os._exit(0)
