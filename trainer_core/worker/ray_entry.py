"""The entry point of a Ray job (trainer_core/launchers/ray.py): ``python -m trainer_core.worker.ray_entry RUN_DIR``.

One process: the worker itself replaces this process (``exec``), writing worker.log in the run folder on the
shared storage; Ray's stop_job sends it SIGTERM, which a single worker reads as Cancel. That worker is
``python -m trainer_core.worker RUN_DIR``, which runs the entry point of the job's kind (kind.txt): a training run,
or an eval, export or serve job sent to the cluster (``launcher: ray`` in its spec), always one process. A serve job
is first told its node's address and Ray node id (``node_env``: it listens there, and records them in endpoint.json).

Several processes (``FINETUNE_STUDIO_NPROC``): Ray Train's ``TorchTrainer`` places one Ray Train worker per
process (``ScalingConfig``: one CPU each, ``FINETUNE_STUDIO_RAY_GPUS_PER_WORKER`` GPUs each) and sets up a
process group among them. Each Ray Train worker runs the same worker recipe as a local rank of torchrun: a
``python -m trainer_core.worker RUN_DIR`` child with the RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR that Ray
Train set, and a fresh MASTER_PORT agreed over Ray's process group (its own port is taken by Ray's store). The
transformers Trainer in the child then builds DDP (gloo on CPU, NCCL on GPUs) exactly as under torchrun. A
child notices when its Ray worker is gone (``Worker._watch_launcher``) and exits with it.

Rank 0 writes the run's events; the ranks' placement (Ray node id, address, GPUs) goes to ``ray_ranks.json``.
When a rank fails, Ray Train stops the others and this driver reports the rank that failed first as the run's
error event, as the torchrun launcher does (worker/launch.py). With ``ray_max_failures`` (Ray Train's
``FailureConfig``) Ray Train starts a new group of workers instead, up to that many times: its controller names the
lost rank and node in the timeline at once (``loss_recorder``), and every rank of the new group resumes from the
run's latest completed checkpoint, which rank 0 picks and shares (``checkpoints.RESUME_ENV``). The steps after that
checkpoint are trained again and reported again; the store upserts metric rows on (run, step), so each step keeps
one row, the resumed run's.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from trainer_core.specs import checkpoints
from trainer_core.launchers.ray import GPUS_ENV, MAX_FAILURES_ENV
from trainer_core.launchers.ray_record import PLACEMENT_FILE, RESTARTS_FILE  # read by the pages too
from trainer_core.host.parallel import NPROC_ENV
from trainer_core.protocol import events as ev, files, paths, secret_file
from trainer_core.protocol.status import JobKind, read_kind
from trainer_core.serving.endpoint import NODE_ADDRESS_ENV, NODE_ID_ENV
from trainer_core.worker import ranks
from trainer_core.worker.ray_placement import PlacementWatch


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainer_core.worker.ray_entry RUN_DIR", file=sys.stderr)
        return 2
    run_dir = paths.resolve_inside(argv[1], [paths.runs_dir()])
    processes = int(os.environ.get(NPROC_ENV, "1"))
    if processes <= 1:
        return run_alone(run_dir)
    return run_workers(run_dir, processes, float(os.environ.get(GPUS_ENV, "0") or 0),
                       int(os.environ.get(MAX_FAILURES_ENV, "0") or 0))


def run_alone(run_dir: Path) -> int:
    """The worker in place of this process: its output in worker.log, Ray's SIGTERM reaching it directly."""
    if serves(run_dir):
        os.environ.update(node_env())
    log = os.open(run_dir / "worker.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.execv(sys.executable, [sys.executable, "-m", "trainer_core.worker", str(run_dir)])
    return 1  # not reached: execv replaces this process


def serves(run_dir: Path) -> bool:
    try:
        return read_kind(run_dir) is JobKind.SERVE
    except ValueError:
        return False  # the worker names the unknown kind in worker.log


def node_env() -> dict[str, str]:
    """This node's address as Ray knows it and its node id, for a serve job's worker: it listens on that address
    (the dashboard host reaches the node there) and names the node in endpoint.json. Connecting to the local Ray
    node takes well under a second; the job's driver then leaves Ray before the worker replaces it."""
    import ray

    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    try:
        return {NODE_ADDRESS_ENV: ray.util.get_node_ip_address(), NODE_ID_ENV: ray.get_runtime_context().get_node_id()}
    finally:
        ray.shutdown()


def run_workers(run_dir: Path, processes: int, gpus: float, max_failures: int = 0) -> int:
    import ray.train
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = {"CPU": 1, **({"GPU": gpus} if gpus else {})}
    trainer = TorchTrainer(
        train_rank, train_loop_config={"run_dir": str(run_dir), "max_failures": max_failures},
        scaling_config=ScalingConfig(num_workers=processes, use_gpu=gpus > 0, resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
        # Ray Train's own results (not ours: events and checkpoints stay in the run folder) next to the run. A
        # preempted node counts against the same limit: Ray's default retries those forever, even with 0.
        run_config=RunConfig(name="ray-train", storage_path=str(run_dir),
                             failure_config=FailureConfig(max_failures=max_failures,
                                                          max_preemption_failures=max_failures),
                             callbacks=[loss_recorder(run_dir, processes, max_failures)]))
    print(f"Ray Train: {processes} workers, {resources} each", flush=True)
    watch = PlacementWatch(run_dir, processes, resources)
    watch.start()
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as exc:  # process boundary: a rank failed and Ray stopped the others
        report_failure(run_dir, processes, exc)
        return 1
    finally:
        watch.done.set()
        secret_file.remove(run_dir)  # read by every rank, and again by ranks restarted after a loss: no longer needed
    return 0


def train_rank(config: dict) -> None:
    """One Ray Train worker: the worker recipe as one rank of the run, in a child process."""
    import ray
    import ray.train
    import torch.distributed as dist

    run_dir = Path(config["run_dir"])
    rank = ray.train.get_context().get_world_rank()
    restarts = read_restarts(run_dir) if rank == 0 else []
    # The children's rendezvous, on rank 0's node (MASTER_ADDR), and after a restart the checkpoint every rank
    # resumes from: rank 0 picks it once (a late partial save of the lost workers must not split the ranks).
    agreed = [free_port(), resume_from(run_dir, restarts)] if rank == 0 else [0, ""]
    dist.broadcast_object_list(agreed, src=0)
    here = {"rank": rank, "node_id": ray.get_runtime_context().get_node_id(),
            "address": ray.util.get_node_ip_address(), "gpus": ray.get_gpu_ids()}
    placement = [None] * dist.get_world_size()
    dist.all_gather_object(placement, here)
    if rank == 0:
        (run_dir / PLACEMENT_FILE).write_text(json.dumps(placement, indent=1) + "\n")
        if restarts:
            emit(run_dir, ev.WarningEvent(message=resumed_message(restarts[-1], agreed[1], config["max_failures"])))
    env = dict(os.environ, MASTER_PORT=str(agreed[0]), **({checkpoints.RESUME_ENV: agreed[1]} if agreed[1] else {}))
    log_path = run_dir / "worker.log" if rank == 0 else run_dir / "ranks" / f"ray-rank-{rank}.log"
    log_path.parent.mkdir(exist_ok=True)
    with open(log_path, "ab") as log:
        if rank == 0:  # where each rank runs, in the log the dashboard shows
            log.write("".join(f"Ray: rank {p['rank']} on node {p['address']} ({p['node_id'][:12]}), GPUs "
                              f"{p['gpus'] or 'none'}\n" for p in placement).encode())
            log.flush()
        code = subprocess.call([sys.executable, "-m", "trainer_core.worker", str(run_dir)], env=env, cwd=run_dir,
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if code != 0:  # how it ended, for the driver's report (a rank whose Ray worker died leaves none)
        exit_path(run_dir, rank).write_text(json.dumps({"exitcode": code}) + "\n")
        raise RuntimeError(f"rank {rank} on node {here['node_id']} ({here['address']}) exited with code {code}")


def exit_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "ranks" / f"ray-rank-{rank}.exit.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def report_failure(run_dir: Path, processes: int, exc: BaseException) -> str:
    """The run's error event, naming the rank that failed first and its node (``blame``)."""
    failed = getattr(exc, "worker_failures", None) or {}  # Ray Train's {world rank: exception}
    rank, reason, exc_type = blame(run_dir, processes, failed)
    if rank is None:
        message, exc_type = f"The Ray Train run failed: {_first_line(exc)}", type(exc).__name__
    else:
        message = rank_message(run_dir, processes, rank, reason)
    restarts = len(read_restarts(run_dir))
    if restarts:
        message += f" (after {restarts} restart{'s' if restarts > 1 else ''} of the workers)"
    tail = tail_of(run_dir, rank or 0)
    print(f"\n---- {message}\n{tail}", flush=True)
    emit(run_dir, ev.ErrorEvent(message=message, exc_type=exc_type, traceback=tail[-8000:]))
    return message


def blame(run_dir: Path, processes: int, failed: dict) -> tuple[int | None, str, str]:
    """(rank, reason, exception type) of the rank that failed first; rank None when the ranks left no account.
    A rank whose Ray worker died (its node was lost, or the worker was killed) comes first: its peers then fail
    in a collective, which is not the cause. Then the ranks that exited, blamed as torchrun's are
    (worker/ranks.py: killed by a signal, then the earliest error a rank reported itself, then any other exit
    code). ``failed`` is Ray Train's {world rank: exception}."""
    exits = {rank: _read_json(exit_path(run_dir, rank)) for rank in range(processes)}
    lost = sorted(rank for rank in failed if not exits.get(rank))
    if lost:
        return lost[0], f"was lost: its Ray worker died ({_first_line(failed[lost[0]])})", "RankLost"
    if any(exits.values()):
        codes = {r: SimpleNamespace(exitcode=int(e["exitcode"])) for r, e in exits.items() if e}
        return ranks.root_cause(codes, run_dir)
    return None, "", ""


def rank_message(run_dir: Path, processes: int, rank: int, reason: str) -> str:
    return f"Rank {rank} of {processes}{_node_of(run_dir, rank)} {reason}"


# ---------------------------------------------------------------------- restarts (ray_max_failures)
def loss_recorder(run_dir: Path, processes: int, max_failures: int):
    """A Ray Train callback, called in its controller when ranks failed: before each restart of the workers, the
    timeline names the lost rank and its node at once (the new workers may still wait for room on the cluster)."""
    from ray.train import UserCallback

    class LossRecorder(UserCallback):
        def __init__(self):
            self.failures = 0

        def after_exception(self, run_context, worker_exceptions: dict) -> None:
            self.failures += 1
            if self.failures <= max_failures:  # past it there is no restart: the driver reports the failure
                record_restart(run_dir, processes, worker_exceptions, self.failures, max_failures)

    return LossRecorder()


def record_restart(run_dir: Path, processes: int, failed: dict, restart: int, max_failures: int) -> str:
    """The lost rank named in the run's timeline and in ``ray_restarts.jsonl``; what the ranks left about this
    failure moves to ``ranks/ray-attempt-N/``, so that a later failure is judged on its own account."""
    rank, reason, _ = blame(run_dir, processes, failed)
    lost = rank_message(run_dir, processes, rank, reason) if rank is not None else \
        f"A rank failed ({_first_line(next(iter(failed.values()), RuntimeError('no account')))})"
    where = next((p for p in _read_json(run_dir / PLACEMENT_FILE) or [] if p.get("rank") == rank), {})
    archive_rank_files(run_dir, restart)
    record = {"restart": restart, "rank": rank, "node_id": where.get("node_id", ""),
              "address": where.get("address", ""), "reason": reason, "lost": lost, "ts": time.time()}
    with open(run_dir / RESTARTS_FILE, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    emit(run_dir, ev.WarningEvent(message=f"{lost}. Ray Train restarts the workers from the latest checkpoint "
                                          f"(restart {restart} of at most {max_failures})."))
    return lost


def read_restarts(run_dir: Path) -> list[dict]:
    try:
        lines = (run_dir / RESTARTS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def archive_rank_files(run_dir: Path, restart: int) -> None:
    """Move the ranks' exit and error files of the failed workers out of the way (kept, not deleted)."""
    folder = run_dir / "ranks" / f"ray-attempt-{restart}"
    for path in [*(run_dir / "ranks").glob("ray-rank-*.exit.json"), *(run_dir / "ranks").glob("rank-*.error.json")]:
        folder.mkdir(parents=True, exist_ok=True)
        path.replace(folder / path.name)


def resume_from(run_dir: Path, restarts: list[dict]) -> str:
    """On rank 0 of restarted workers: the run's latest completed checkpoint ("" on the first start, or when
    none was saved yet: the run starts over). Anything the lost workers' ranks left since the restart was
    recorded goes to its attempt's folder first."""
    if not restarts:
        return ""
    archive_rank_files(run_dir, restarts[-1]["restart"])
    latest = checkpoints.latest_checkpoint(run_dir / "checkpoints")
    return str(latest) if latest else ""


def resumed_message(restart: dict, resume: str, max_failures: int) -> str:
    """The timeline's account of a restart that got its workers: from which step, after which loss."""
    match = checkpoints.CHECKPOINT_RE.match(Path(resume).name) if resume else None
    start = f"resuming from {Path(resume).name} (step {match.group(1)})" if match else \
        "starting over from step 0 (no checkpoint had been saved)"
    node = f" on node {restart['address']} ({restart['node_id'][:12]})" if restart.get("node_id") else ""
    # "was lost: its Ray worker died (...)" -> "was lost"; "failed: ValueError: ..." -> "failed" (the first
    # warning quoted the whole account); "was killed by SIGKILL (...)" stays whole
    reason = str(restart.get("reason", "")).split(":", 1)[0]
    cause = f"rank {restart['rank']}{node} {reason}" if restart.get("rank") is not None else restart.get("lost", "")
    return f"Restart {restart['restart']} of at most {max_failures}: {start}, after {cause}."


def emit(run_dir: Path, event: ev.Event) -> None:
    writer = ev.EventWriter(run_dir / ev.LOG_NAME)
    writer.emit(event)
    writer.close()


def _node_of(run_dir: Path, rank: int) -> str:
    placement = _read_json(run_dir / PLACEMENT_FILE) or []
    where = next((p for p in placement if p.get("rank") == rank), None)
    return f" on node {where['address']} ({where['node_id'][:12]})" if where else ""


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tail_of(run_dir: Path, rank: int) -> str:
    path = run_dir / "worker.log" if rank == 0 else run_dir / "ranks" / f"ray-rank-{rank}.log"
    return "\n".join(files.tail_lines(path, ranks.RANK_LOG_LINES)) if path.is_file() else ""


if __name__ == "__main__":
    sys.exit(main(sys.argv))
