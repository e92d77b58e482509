"""The environment a job's worker gets; ``WorkerLauncher`` runs it on this host (trainer_core/launchers/local.py:
command, own session, worker.log, liveness).

``Orchestrator(launcher=...)`` takes any ``trainer_core.launchers.Launcher``; tests pass tests/support's
``FakeLauncher``, which keeps this environment and session but runs a fake worker.
"""
from __future__ import annotations

import os
import secrets as pysecrets
from pathlib import Path
from typing import TYPE_CHECKING

from trainer_core.auth import access
from trainer_core.host import parallel
from trainer_core.config import RAY_ADDRESS_ENV, FieldError, TrainConfig, ray_address_problem, server_cluster
from trainer_core.specs.jobspec import JobSpec
from trainer_core.launchers import JobHandle, Launcher
from trainer_core.launchers import ray as ray_jobs
from trainer_core.launchers.local import LocalLauncher
from trainer_core.protocol import paths, secrets

if TYPE_CHECKING:
    from db.entities import RunRecord

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds trainer_core/, for the worker's PYTHONPATH


class WorkerLauncher(LocalLauncher):
    """``python -m trainer_core.worker RUN_DIR`` (torchrun's launcher when the job uses several processes),
    in the run folder, in a session of its own so that it outlives the server, writing to worker.log."""

    def environment(self, run_dir: Path, cfg: TrainConfig | JobSpec, processes: int) -> dict[str, str]:
        # An allow-list: the runtime's settings and the variables this job names (a hub push's HF_TOKEN, a judge
        # key an admin declared), never the server's secrets, the database URL or other credentials.
        env = access.worker_env(os.environ, needs=cfg.env_names() if isinstance(cfg, JobSpec) else ())
        env.update(PYTHONUNBUFFERED="1", FINETUNE_STUDIO_HOME=str(paths.data_root()),
                   TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_PROGRESS_BARS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        env.update(secrets.to_env(cfg.secrets()))  # the job's secrets travel in its environment only
        env.update(parallel.worker_env(cfg, processes))
        # The worker runs in its run folder (below), so the roots it allows are pinned to ours, cwd included.
        env["FINETUNE_STUDIO_ALLOWED_ROOTS"] = os.pathsep.join(str(r) for r in paths.allowed_data_roots())
        # Unsloth compiles patched modules into its cwd by default: keep them in the run folder, never in the
        # repository and never shared by two runs that train at once.
        env["UNSLOTH_COMPILE_LOCATION"] = str(run_dir / "unsloth_compiled_cache")
        return env


class PlacingLauncher(Launcher):
    """Where each job runs: a Ray job on the cluster when its config or spec says ``launcher: ray`` (the server's
    RAY_ADDRESS, or a ``ray_address`` the server allows; an eval or export spec has no ``ray_address``: the server's
    cluster), on this host otherwise. A job started on Ray is found again by the Ray job recorded in its folder."""

    def __init__(self, local: Launcher | None = None):
        self.local = local or WorkerLauncher()

    def start(self, run_dir: Path, cfg: TrainConfig | JobSpec) -> JobHandle:
        if on_ray(cfg):
            # Checked again here, not only at validation: a queued run starts later, and the dashboard must
            # never send requests to a host a run chose (server-side request forgery).
            wanted = str(getattr(cfg, "ray_address", ""))
            problem = ray_address_problem(wanted)
            if problem:
                raise OSError(f"ray_address: {problem}")
            address = wanted.strip() or server_cluster()
            if not address.strip():  # a queued job whose server lost its cluster setting since it was submitted
                raise OSError(f"launcher: ray: no Ray cluster is configured: set {RAY_ADDRESS_ENV} in the server's "
                              "environment, or save one in Settings")
            return ray_jobs.RayLauncher(address).start(run_dir, cfg)
        return self.local.start(run_dir, cfg)

    def adopt(self, run: RunRecord) -> JobHandle:
        if (paths.run_dir(run.id) / ray_jobs.JOB_FILE).is_file():  # the launcher re-checks the address it records
            return ray_jobs.RayLauncher(server_cluster()).adopt(run)
        return self.local.adopt(run)


def on_ray(cfg: TrainConfig | JobSpec) -> bool:
    """Training runs and the job specs that have a ``launcher`` field (eval, export) may go to the cluster."""
    return getattr(cfg, "launcher", "local") == "ray"


def launcher_problems(cfg: TrainConfig | JobSpec) -> list[FieldError]:
    """What this server lacks for the job's launcher (the fields themselves: ``TrainConfig.validate``)."""
    problem = ray_jobs.shared_storage_problem(paths.runs_dir()) if on_ray(cfg) else ""
    return [FieldError("launcher", f"launcher: ray: {problem}")] if problem else []


def cluster_devices(cfg: TrainConfig | JobSpec) -> str | None:
    """The queue's device string of a job the cluster places (None for a job of this host): its own token, so
    it never waits for this host's devices, nor they for it; Ray queues it until the cluster has room."""
    return f"ray-{pysecrets.token_hex(4)}" if on_ray(cfg) else None
