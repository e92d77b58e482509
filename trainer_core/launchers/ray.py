"""Workers on a Ray cluster: each job is a Ray job (Ray Jobs), so it outlives the dashboard; a training run with
several processes runs Ray Train's ``TorchTrainer`` inside it (trainer_core/worker/ray_entry.py).

The run folder lives on storage every node mounts (``FINETUNE_STUDIO_SHARED_STORAGE``), so the pump, the control
file (Stop & save, Cancel) and ``db rebuild`` work as for a local run. The Ray job id is a function of the run id
and is also written into the run folder (``ray_job.json``, with the cluster's address), which is what ``adopt``
reads: the database stays a cache of the run folders. Liveness is Ray's job status. The dashboard only ever
talks to a cluster the server allows (its RAY_ADDRESS or FINETUNE_STUDIO_RAY_ADDRESSES: config
``ray_address_problem``), whatever a run or its folder says.

Secrets never enter what Ray keeps: a job's entrypoint, metadata and runtime_env are in its job table, which
anyone with access to its dashboard can read. The job gets an allow-listed environment with no secret in it
(proxy URLs without their user and password); the secrets it needs (a run's HF token and W&B key, a hub push's
HF_TOKEN, a judge's key) wait in its run folder on the shared storage, readable by this user alone, and its
worker takes them from there (trainer_core/protocol/secret_file.py).

An eval or an export job (``launcher: ray`` in its spec) is a single-worker Ray job the same way: the same entry
point runs the worker of the job's kind (kind.txt), its artifacts and results stay in its job folder on the shared
storage.

Kept whole: one launcher implementation (the launcher interface: start, state, stop, kill, adopt) over Ray Jobs,
with the secret-free environment and the address checks it cannot run without.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_core.auth import access
from trainer_core.config import (LAUNCHERS, RAY_ADDRESS_ENV, RAY_ADDRESSES_ENV, SHARED_STORAGE_ENV, FieldError,
                                 ray_address_problem, server_cluster)
from trainer_core.launchers.base import ALIVE, JobHandle, JobState, Launcher
from trainer_core.launchers.ray_waiting import PendingJob, node_usage
from trainer_core.host.parallel import NPROC_ENV
from trainer_core.protocol import cluster_settings, files, paths, secret_file
from trainer_core.protocol import secrets as run_secrets

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from db.entities import RunRecord
    from trainer_core.config import TrainConfig
    from trainer_core.specs.jobspec import JobSpec

RAY_GPUS_MAX = 64  # GPUs one job's worker may ask Ray for
JOB_FILE = "ray_job.json"  # in the run folder: the Ray job id and the cluster it was submitted to
GPUS_ENV = "FINETUNE_STUDIO_RAY_GPUS_PER_WORKER"  # read by trainer_core.worker.ray_entry
MAX_FAILURES_ENV = "FINETUNE_STUDIO_RAY_MAX_FAILURES"  # config ray_max_failures, read by trainer_core.worker.ray_entry
PYTHON_ENV = "FINETUNE_STUDIO_RAY_PYTHON"  # the Python of the cluster's nodes, when not the same path as ours
ROOT = Path(__file__).resolve().parents[2]  # the folder that holds trainer_core/, for the job's PYTHONPATH
STOP_WAIT_ENV, STOP_WAIT_S = "RAY_JOB_STOP_WAIT_TIME_S", 30  # read by Ray's job supervisor from the job's env
STATE_EVERY_S = 1.0  # the pump asks several times a second; the cluster is asked at most once a second
NO_NODE_TRIES = 3  # how often the node list is asked again when the cluster reports none alive
UNREACHABLE_S = 60.0  # a cluster that does not answer for this long ends the run (not a hang)
# Names of the allow-listed environment that describe this host, not the cluster's nodes.
HOST_ONLY = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TMP", "TEMP", "VIRTUAL_ENV",
                       "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES",
                       "PYTHONPATH", "PYTHONHOME", "TERM"})
PROXY_ENV = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "FTP_PROXY"})  # upper or lower case
# Ray's Jobs client raises RuntimeError(f"Request failed with status code {code}: {text}.") for an HTTP error answer
# (ray/dashboard/modules/dashboard_sdk.py ``_raise_error``), with no status attribute: the code is read from there.
NOT_FOUND = re.compile(r"Request failed with status code 404: ")


def submission_id(run_id: str) -> str:
    """The Ray job id of a run (one job per run folder)."""
    return f"finetune-studio-{run_id}"


def shared_storage() -> tuple[str, str]:
    """The shared storage path in force and where it is set: the server's environment (``SHARED_STORAGE_ENV``) wins
    over the path saved in Settings ("Settings"); ("", "") when neither is set."""
    shared = os.environ.get(SHARED_STORAGE_ENV, "")
    if shared:
        return shared, SHARED_STORAGE_ENV
    saved = cluster_settings.saved().shared_storage
    return (saved, "Settings") if saved else ("", "")


def shared_storage_problem(folder: Path) -> str:
    """Why run folders in ``folder`` cannot be used by Ray jobs ("" when they can): they must be on the storage
    every node mounts."""
    shared = shared_storage()[0]
    if not shared:
        return (f"run folders must be on storage every node of the Ray cluster mounts: set {SHARED_STORAGE_ENV} to "
                "that path in the server's environment, with FINETUNE_STUDIO_HOME under it")
    if not folder.resolve().is_relative_to(Path(shared).resolve()):
        return (f"{folder} is not under the shared storage {shared} ({SHARED_STORAGE_ENV}): set "
                "FINETUNE_STUDIO_HOME to a folder under it")
    return ""


def spec_problems(spec: JobSpec) -> list[FieldError]:
    """What keeps a job spec's ``launcher`` (eval, export, serve) from working: an unknown value, or for ``ray``: no
    ray, no cluster configured (the server's RAY_ADDRESS, as for training), run folders off the shared storage, or
    GPUs named (Ray places the job); and ``ray_gpus_per_worker``, the GPUs Ray gives the job on its node (a job that
    asks for none sees none there: it runs on the node's CPU). A secret the job needs (``env_names``: a hub push's
    HF_TOKEN, a judge's key) goes through its run folder, never Ray's job table (``job_secrets``)."""
    launcher = getattr(spec, "launcher", "local")
    if launcher not in LAUNCHERS:
        return [FieldError("launcher", f"choose {' or '.join(LAUNCHERS)} (this host, or the server's Ray cluster)")]
    errors = []
    gpus = getattr(spec, "ray_gpus_per_worker", 0.0)
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not 0 <= gpus <= RAY_GPUS_MAX:
        errors.append(FieldError("ray_gpus_per_worker", f"0 (the job runs on the node's CPU) or a number of GPUs up "
                                                        f"to {RAY_GPUS_MAX}, not {gpus!r:.40}"))
    elif gpus and launcher != "ray":
        errors.append(FieldError("ray_gpus_per_worker", "only for launcher: ray (Ray gives the node's GPUs): on this "
                                                        "host the job takes its GPU from gpu_ids; leave it 0"))
    if launcher != "ray":
        return errors
    here = "or run it on this host (launcher: local)"
    if importlib.util.find_spec("ray") is None:
        errors.append(FieldError("launcher", f"launcher: ray needs ray, which is not installed: pip install -e "
                                             f"'.[ray]', {here}"))
    if not server_cluster():
        errors.append(FieldError("launcher", f"launcher: ray runs the job on the server's Ray cluster, and none is "
                                             f"configured: set {RAY_ADDRESS_ENV} (the cluster's dashboard, e.g. "
                                             f"http://head:8265) in the server's environment or save a cluster in "
                                             f"Settings, {here}"))
    problem = shared_storage_problem(paths.runs_dir())
    if problem:
        errors.append(FieldError("launcher", f"launcher: ray: {problem}, {here}"))
    if spec.gpu_ids:
        errors.append(FieldError("gpu_ids", "Ray places the job on the cluster: leave gpu_ids empty, or run it on "
                                            "this host (launcher: local)"))
    return errors


class RayHandle(JobHandle):
    """A Ray job, by its submission id, on the cluster at ``address``."""

    def __init__(self, address: str, job_id: str, started_here: bool = False, run_dir: Path | None = None):
        self.address, self.job_id, self.started_here = address, job_id, started_here
        # A job Ray cannot place yet (PENDING) runs nothing of ours: this handle says why and answers Stop/Cancel.
        self.waiting = PendingJob(run_dir, lambda: node_usage(self.address), self._stop) if run_dir else None
        self.pid = None  # no process of this host
        self._client: JobSubmissionClient | None = None
        self._last: tuple[float, JobState] | None = None  # (when asked, answer): Ray is asked once a second
        self._unreachable_since: float | None = None

    def record(self) -> dict[str, Any]:
        return {}  # the run folder's ray_job.json is the record (written before the job was submitted)

    def client(self) -> JobSubmissionClient:
        if self._client is None:
            self._client = job_client(self.address)
        return self._client

    def state(self) -> JobState:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < STATE_EVERY_S:
            return self._last[1]
        answer = self._ask()
        self._last = (now, answer)
        return answer

    def _ask(self) -> JobState:
        try:
            info = self.client().get_job_info(self.job_id)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the cluster: retried until UNREACHABLE_S
            self._client = None
            return self._unreachable(exc)
        self._unreachable_since = None
        if self.waiting is not None and self.waiting.follow(info.status, job_needs(info)):
            return JobState(False, "was cancelled before Ray could place it (Ray stops the job when it would start it)")
        if info.status in ("PENDING", "RUNNING"):  # JobStatus is a str enum
            return ALIVE
        if info.status == "FAILED" and NODE_DIED in (info.message or ""):  # e.g. a serve job's node went away
            return JobState(False, lost_with_node(self.address, info.driver_node_id or ""))
        message = (info.message or "").strip()
        return JobState(False, f"ended on the Ray cluster as {info.status.value}" + (f": {message}" if message else ""))

    def _unreachable(self, exc: Exception) -> JobState:
        if job_not_found(exc):
            return JobState(False, f"is not known to the Ray cluster at {self.address} (job {self.job_id})")
        self._unreachable_since = self._unreachable_since or time.monotonic()
        if time.monotonic() - self._unreachable_since < UNREACHABLE_S:
            return ALIVE  # a dashboard restart or a network blip: ask again
        return JobState(False, f"could not be followed: the Ray cluster at {self.address} has not answered for "
                               f"{UNREACHABLE_S:.0f}s ({type(exc).__name__}: {exc})")

    def request_stop(self) -> None:
        # Stop & save and Cancel already travel through the run folder's control file, which every rank reads;
        # this is the fallback for a job that does not answer it: Ray sends the job SIGTERM, then SIGKILL.
        self._stop()

    def kill(self) -> None:
        self._stop()

    def _stop(self) -> None:
        try:
            self.client().stop_job(self.job_id)
        except Exception:  # noqa: BLE001 - the job or the cluster is gone already: nothing left to stop
            self._client = None
        self._last = None


class RayLauncher(Launcher):
    """Submits each job to the Ray cluster whose dashboard answers at ``address`` (e.g. http://head:8265)."""

    def __init__(self, address: str):
        self.address = address

    def start(self, run_dir: Path, cfg: TrainConfig | JobSpec) -> RayHandle:
        problem = shared_storage_problem(run_dir)
        if problem:
            raise OSError(problem)
        processes = max(getattr(cfg, "num_processes", 1), 1)
        gpus = float(getattr(cfg, "ray_gpus_per_worker", 0.0))
        job_id = submission_id(run_dir.name)
        (run_dir / JOB_FILE).write_text(json.dumps({"address": self.address, "job_id": job_id}) + "\n")
        entry = dict(entrypoint_num_cpus=1, entrypoint_num_gpus=gpus or None) if processes == 1 else {}
        env = self.environment(run_dir, processes, gpus, int(getattr(cfg, "ray_max_failures", 0)))
        try:
            written = secret_file.write(run_dir, job_secrets(cfg))
        except ValueError as exc:  # a variable the worker never takes from the file (validation names it first)
            raise OSError(f"{exc}: the job's secrets reach a Ray job only under names like JUDGE_API_KEY (upper "
                          f"case, not a runtime variable such as PYTHON*, LD_*, RAY_*): rename the variable, or "
                          f"run the job on this host (launcher: local)") from None
        if written:  # the values wait in the run folder; Ray sees only this
            env[secret_file.FLAG_ENV] = "1"
        try:  # several processes: the driver only waits; TorchTrainer's workers hold the CPUs and GPUs
            RayHandle(self.address, job_id).client().submit_job(
                entrypoint=shlex.join([ray_python(), "-m", "trainer_core.worker.ray_entry", str(run_dir)]),
                submission_id=job_id, runtime_env={"env_vars": env},
                metadata={"finetune_studio_run": run_dir.name}, **entry)
        except Exception as exc:  # noqa: BLE001 - the cluster refused or cannot be reached: the run fails with why
            secret_file.remove(run_dir)
            raise OSError(f"the Ray cluster at {self.address} did not take the job ({type(exc).__name__}: {exc})") \
                from None
        return RayHandle(self.address, job_id, started_here=True, run_dir=run_dir)

    def adopt(self, run: RunRecord) -> RayHandle:
        # The run folder is only a record: its address is followed when the server still allows it (a run sent
        # to an allow-listed cluster), else this launcher's own; the job id is always the run's own.
        recorded = str(read_job(paths.run_dir(run.id)).get("address", ""))
        address = recorded if recorded.strip() and not ray_address_problem(recorded) else self.address
        return RayHandle(address, submission_id(run.id), run_dir=paths.run_dir(run.id))

    def environment(self, run_dir: Path, processes: int, gpus: float, max_failures: int = 0) -> dict[str, str]:
        """The job's environment: the allow-list of a local worker without this host's own paths, and never a
        secret (no ``needs``, no run secrets: ``start`` puts those in the run folder): Ray shows a job's
        runtime_env to anyone with its dashboard."""
        env = {k: v for k, v in access.worker_env(os.environ).items() if k not in HOST_ONLY}
        env.update(PYTHONUNBUFFERED="1", FINETUNE_STUDIO_HOME=str(paths.data_root()), PYTHONPATH=str(ROOT),
                   TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_PROGRESS_BARS="1", CUDA_DEVICE_ORDER="PCI_BUS_ID")
        env[NPROC_ENV] = str(processes)
        env[GPUS_ENV] = str(gpus)
        env[MAX_FAILURES_ENV] = str(max_failures)
        env["FINETUNE_STUDIO_ALLOWED_ROOTS"] = os.pathsep.join(str(r) for r in paths.allowed_data_roots())
        env["UNSLOTH_COMPILE_LOCATION"] = str(run_dir / "unsloth_compiled_cache")
        # Ray's stop_job sends SIGTERM, then SIGKILL after this many seconds (Ray's default: 3). A single worker
        # reads SIGTERM as Cancel and needs to finish its step and write its last events first.
        env[STOP_WAIT_ENV] = str(STOP_WAIT_S)
        env.pop(PYTHON_ENV, None)
        if shared_storage()[0]:  # the path in force, also when Settings saved it (an export's check reads it there)
            env[SHARED_STORAGE_ENV] = shared_storage()[0]
        return {name: without_userinfo(name, value) for name, value in env.items()}


def job_secrets(cfg: TrainConfig | JobSpec) -> dict[str, str]:
    """The secrets a job gets (environment variable -> value), as a local worker gets them in its environment: a
    run's own (hf_token, wandb_token), and the server's variables a job spec names (a hub push's HF_TOKEN, a judge
    key an admin declared). They reach the Ray job through its run folder only (protocol/secret_file.py)."""
    names = cfg.env_names() if hasattr(cfg, "env_names") else []
    values = {name: os.environ.get(name, "") for name in names}
    values.update(run_secrets.to_env(cfg.secrets()))
    return {name: value for name, value in values.items() if value}


def job_needs(info: Any) -> dict[str, float]:
    """What a single-worker job asked Ray for (``start``: one CPU and the GPUs per worker, which its environment
    carries; Ray's job details do not repeat the entrypoint's resources)."""
    env = (info.runtime_env or {}).get("env_vars") or {}
    return {"CPU": 1.0, "GPU": float(env.get(GPUS_ENV) or 0)}


def without_userinfo(name: str, value: str) -> str:
    """``value`` without the user and password of a URL (http://user:pass@proxy:3128 -> http://proxy:3128): a
    local worker may use them, a Ray job's environment is public. A proxy variable may lack a scheme or hold an
    unescaped '/' in its password, so all before its last '@' goes; another value is cut as a URL (RFC 3986)."""
    scheme, sep, rest = value.partition("://")
    if name.upper() in PROXY_ENV:
        return (scheme + sep + rest.rsplit("@", 1)[-1]) if sep else value.rsplit("@", 1)[-1]
    authority, slash, path = rest.partition("/")
    if not sep or "@" not in authority:
        return value
    return scheme + sep + authority.rsplit("@", 1)[-1] + slash + path


def shown_address(address: str) -> str:
    """A cluster address as pages and messages show it: without a user and password (RAY_ADDRESS may carry
    http://user:pass@head:8265, which every viewer of Settings would read) and without a query string."""
    return without_userinfo("RAY_ADDRESS", str(address)).split("?", 1)[0]


def redacted(text: str, address: str) -> str:
    """``text`` (an error from Ray's client, which may quote the URL it called) with ``address`` shown safely."""
    shown = shown_address(address)
    text = text.replace(str(address), shown)
    scheme, sep, rest = str(address).partition("://")
    userinfo = rest.split("/", 1)[0].rpartition("@")[0] if sep else ""
    return text.replace(userinfo + "@", "") if userinfo else text


# Ray's message for a job whose supervisor actor died with its node ("The actor died because its node has died.
# Node Id: ...", then the node's own cause): the job, its entrypoint and the worker are gone with the node.
NODE_DIED = "because its node has died"


def lost_with_node(address: str, node_id: str) -> str:
    """A job's end when its node died, naming the node by address and id, and Ray's cause when it says one."""
    found = None
    try:
        from ray.util.state import get_node

        found = get_node(node_id, address=address, timeout=5) if node_id else None
    except Exception:  # noqa: BLE001 - the state API did not answer: the node id alone names it
        pass
    where = f"{found.node_ip} ({node_id[:12]})" if found is not None else f"({node_id[:12] or 'unknown'})"
    cause = (getattr(found, "state_message", "") or "").strip() if found is not None else ""
    return f"was lost with its node {where} on the Ray cluster" + (f" ({cause})" if cause else "")


def job_not_found(exc: Exception) -> bool:
    """Whether Ray answered that the job does not exist (HTTP 404), not any failure that mentions 404."""
    return isinstance(exc, RuntimeError) and NOT_FOUND.match(str(exc)) is not None


@dataclass(frozen=True)
class RayNode:
    """One alive node as Ray reports it; ``free_*`` is None when Ray did not say."""
    node_id: str
    address: str
    head: bool
    cpus: float
    gpus: float
    free_cpus: float | None = None
    free_gpus: float | None = None
    shared: str | None = None  # the shared-storage probe's verdict: "" sees it, else why not; None: not probed


@dataclass(frozen=True)
class ClusterInfo:
    """What the cluster at ``address`` says about itself: its alive nodes, or why it could not be asked."""
    address: str
    nodes: tuple[RayNode, ...] = ()
    problem: str = ""

    def total(self, what: str) -> float:
        return sum(getattr(n, what) or 0.0 for n in self.nodes)


@dataclass(frozen=True)
class ClusterCheck:
    """The Settings check: the cluster's nodes (each with its shared-storage verdict) and every problem found."""
    info: ClusterInfo
    shared: str  # the shared storage path that was probed ("" when none is set)
    problems: tuple[str, ...] = ()


def server_addresses() -> list[str]:
    """The clusters this server may use, its own (RAY_ADDRESS) first, then the admin's FINETUNE_STUDIO_RAY_ADDRESSES
    and the one saved in Settings (the same rule as config ``ray_address_problem``)."""
    found = [os.environ.get(RAY_ADDRESS_ENV, ""), *os.environ.get(RAY_ADDRESSES_ENV, "").split(","),
             cluster_settings.saved().address]  # the one saved in Settings last
    return list(dict.fromkeys(a.strip().rstrip("/") for a in found if a.strip()))


def cluster_info(address: str, timeout_s: float = 10.0) -> ClusterInfo:
    """The alive nodes of the cluster at ``address`` with their CPUs and GPUs, total and free (Ray's state API and
    its dashboard's per-node usage); a cluster that does not answer is a problem naming the fix, never an
    exception. Pages offer only the server's own addresses (``server_addresses``)."""
    if not address.strip():
        return ClusterInfo(address, problem=f"no Ray cluster address is set: set {RAY_ADDRESS_ENV} (the cluster's "
                                            "dashboard, e.g. http://head:8265) in the server's environment")
    try:
        job_client(address)  # the Jobs API answers (what every run needs), with Ray's own message when not
        from ray.util.state import list_nodes

        for attempt in range(NO_NODE_TRIES):  # a cluster answering has its head at least: none is an answer cut short
            alive = [n for n in list_nodes(address=address, timeout=int(max(timeout_s, 1))) if n.state == "ALIVE"]
            if alive:
                break
            time.sleep(attempt + 1)
    except Exception as exc:  # noqa: BLE001 - no ray, or the cluster did not answer: said, never raised into a page
        return ClusterInfo(address, problem=unreachable(address, exc))
    if not alive:  # a check over no node would pass vacuously: the shared storage would be "seen" by every node
        return ClusterInfo(address, problem=f"the Ray cluster at {shown_address(address)} answers but reports no "
                                            "alive node: check `ray status` on its head, then check again")
    free = free_resources(address, timeout_s)
    return ClusterInfo(address, tuple(node_of(n, free.get(n.node_id))
                                      for n in sorted(alive, key=lambda n: (not n.is_head_node, n.node_ip, n.node_id))))


def node_of(state: Any, free: dict[str, float] | None) -> RayNode:
    """A RayNode from Ray's NodeState and its free resources (None: not reported yet; a resource Ray's usage does
    not list is one the node has none of, and a node with none of a resource has none free)."""
    cpus, gpus = (float(state.resources_total.get(name, 0.0)) for name in ("CPU", "GPU"))

    def free_of(name: str, total: float) -> float | None:
        return (free or {}).get(name, 0.0) if free is not None or not total else None

    return RayNode(state.node_id, state.node_ip, bool(state.is_head_node), cpus, gpus, free_of("CPU", cpus),
                   free_of("GPU", gpus))


def unreachable(address: str, exc: Exception) -> str:
    if isinstance(exc, OSError) and "not installed" in str(exc):
        return str(exc)
    return (f"the Ray cluster at {shown_address(address)} cannot be used ({type(exc).__name__}: "
            f"{redacted(str(exc), address)[:300]}): check that it "
            f"runs (`ray status` on its head) and that {RAY_ADDRESS_ENV} is its dashboard address, e.g. http://head:8265")


def free_resources(address: str, timeout_s: float = 10.0) -> dict[str, dict[str, float]]:
    """Free CPUs and GPUs per node id (``ray_waiting.node_usage``: Ray's dashboard's per-node usage); {} when it
    does not say."""
    return {node: {name: free for name, (free, _) in usage.items()}
            for node, usage in node_usage(address, timeout_s).items()}


def check_cluster(address: str, timeout_s: float = 120.0) -> list[str]:
    """What keeps the cluster at ``address`` from running jobs, one line per problem ([] when nothing does): it
    must answer, and every alive node must see the shared storage, which a probe job checks by writing one file
    per node (trainer_core/worker/ray_probe.py) that this host then finds. For Settings and the CLI."""
    return list(inspect_cluster(address, timeout_s).problems)


def inspect_cluster(address: str, timeout_s: float = 120.0, shared: str | None = None) -> ClusterCheck:
    """``check_cluster`` with what it found: the nodes, each with its verdict on the shared storage (``shared``, by
    default the one in force: Settings checks a path before saving it)."""
    shared = shared_storage()[0] if shared is None else shared
    info = cluster_info(address)
    if not shared:
        return ClusterCheck(info, "", (shared_storage_problem(paths.runs_dir()),))
    if info.problem:
        return ClusterCheck(info, shared, (info.problem,))
    folder = Path(shared) / f".ray-probe-{secrets.token_hex(4)}"
    try:
        client = job_client(address)
        folder.mkdir()
        job = client.submit_job(entrypoint=shlex.join([ray_python(), "-m", "trainer_core.worker.ray_probe", str(folder)]),
                                runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
        deadline = time.monotonic() + timeout_s
        while client.get_job_status(job) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            if time.monotonic() > deadline:
                client.stop_job(job)
                return ClusterCheck(info, shared, (f"the probe job {job} did not finish within {timeout_s:.0f}s (is "
                                                   "the cluster out of room?)",))
            time.sleep(0.5)
        job_info = client.get_job_info(job)
        if job_info.status != "SUCCEEDED":
            return ClusterCheck(info, shared, (f"the probe job {job} ended {job_info.status.value}: {job_info.message}",))
        seen = {p.name for p in folder.iterdir()}
        logs = client.get_job_logs(job) if any(n.node_id not in seen for n in info.nodes) else ""
        nodes = tuple(replace(n, shared="" if n.node_id in seen else _not_seen(logs, n.node_id)) for n in info.nodes)
        problems = tuple(f"node {n.address} ({n.node_id[:12]}) cannot share files with this host under {shared}: its "
                         f"probe file is missing here ({n.shared})" for n in nodes if n.shared)
        return ClusterCheck(replace(info, nodes=nodes), shared, problems)
    except Exception as exc:  # noqa: BLE001 - no ray, or the cluster did not answer: say so, never raise into a page
        return ClusterCheck(info, shared, (f"the Ray cluster at {address} cannot be used ({type(exc).__name__}: {exc})",))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _not_seen(logs: str, node_id: str) -> str:
    """Why this host did not find a node's probe file: the node's own write error, or that the node wrote it
    fine, on a storage of its own under the same path."""
    line = _probe_line(logs, node_id)
    return ("the node wrote and read it back on its side, so that path is another storage there than here"
            if line == "ok" else line)


def _probe_line(logs: str, node_id: str) -> str:
    """The node's own answer in the probe job's log (its write error), or what is known without it."""
    found = next((line for line in logs.splitlines() if line.startswith(f"{node_id}: ")), "")
    return found.split(": ", 1)[1] if found else "it did not report"


def job_client(address: str) -> JobSubmissionClient:
    """A Ray Jobs client. ray is imported here, not with this module: a dashboard that never uses a cluster
    does not pay its import time (seconds)."""
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError as exc:
        raise OSError("the Ray launcher needs ray, which is not installed: pip install -e '.[ray]'") from exc
    return JobSubmissionClient(address)


def ray_python() -> str:
    """The Python the job runs: the cluster's nodes are expected to have this environment at the same path
    (one image or one shared venv); ``FINETUNE_STUDIO_RAY_PYTHON`` names another."""
    return os.environ.get(PYTHON_ENV) or sys.executable


def read_job(run_dir: Path) -> dict[str, str]:
    try:  # on the shared storage: a pipe in its place is refused, never waited on by the pump's adoption
        data = json.loads(files.read_regular(run_dir / JOB_FILE, 64 << 10))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
