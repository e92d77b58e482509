"""What a Ray job submission carries and where it goes, whatever a user tries through ``launcher: ray``, without a
cluster (a fake Jobs client records what would reach Ray): proxy credentials and other secrets of the server never reach what Ray stores, a run cannot
point the dashboard at an address of its choosing (nor can a tampered ray_job.json at adoption), the CLI gives a
Ray run the tokens of its environment as it gives a local one (tests/launchers/test_ray_secrets.py: they travel
through the run folder), and "job not found" is read from Ray's status code."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from tests.support.ray_cluster import SERVER, shared  # noqa: F401 - shared: a fixture
from trainer_core.__main__ import load_config
from trainer_core.config import FieldError, TrainConfig
from trainer_core.jobs.launcher import PlacingLauncher, WorkerLauncher
from trainer_core.launchers import JobState
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import paths

# The server's environment: every value here is a credential that must never reach Ray's job table.
SECRETS = {
    "HF_TOKEN": "hf_server_token", "WANDB_API_KEY": "wandb_server_key",
    "DATABASE_URL": "postgresql://studio:dbpass@db/s",
    "PGPASSWORD": "pg_password", "FINETUNE_STUDIO_PASSWORD": "dashboard_password", "studio_password": "lower_password",
    "FINETUNE_STUDIO_SESSION_KEY": "session_key", "OPENAI_API_KEY": "judge_key", "JUDGE_API_KEY": "judge_key_2",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "aws_secret", "AWS_SESSION_TOKEN": "aws_session",
    "HUGGING_FACE_HUB_TOKEN": "hf_hub_token", "HF_HUB_TOKEN": "hf_hub_token_2",
}
PROXIES = {  # proxy settings with credentials: the nodes get the proxy, never its user and password
    "HTTP_PROXY": ("http://proxyuser:proxypass@proxy:3128", "http://proxy:3128"),
    "https_proxy": ("https://proxyuser:proxypass@proxy:3129/", "https://proxy:3129/"),
    "ALL_PROXY": ("socks5h://alice:p%40ss@socks:1080", "socks5h://socks:1080"),
    "all_proxy": ("bob:pa/ss@proxy:8080", "proxy:8080"),  # no scheme, and a '/' in the password
    "HTTPS_PROXY": ("http://proxy:3128", "http://proxy:3128"),  # nothing to strip
    "NO_PROXY": ("localhost,.internal", "localhost,.internal"),
    "HF_ENDPOINT": ("https://mirroruser:mirrorpass@mirror.example/hf", "https://mirror.example/hf"),
}
LEAKS = ("proxyuser", "proxypass", "alice", "p%40ss", "bob", "pa/ss", "mirroruser", "mirrorpass")


class FakeJobs:
    """Ray's JobSubmissionClient as the launcher uses it: records the address and every submission."""

    def __init__(self, address: str, calls: list, fail: Exception | None = None):
        self.address, self.calls, self.fail = address, calls, fail

    def submit_job(self, **kwargs):
        self.calls.append((self.address, kwargs))
        return kwargs["submission_id"]

    def get_job_info(self, job_id: str):
        if self.fail is not None:
            raise self.fail
        return SimpleNamespace(status="RUNNING", message="")


@pytest.fixture
def calls(monkeypatch) -> list:
    recorded: list = []
    monkeypatch.setattr(ray_jobs, "job_client", lambda address: FakeJobs(address, recorded))
    return recorded


def run_folder(run_id: str = "r1"):
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True)
    return run_dir


class Run:
    pid, pid_started_at = None, None

    def __init__(self, run_id: str):
        self.id = run_id


# --- secrets and proxy credentials ---------------------------------------------------------------------------

def test_proxy_credentials_are_stripped_from_the_job_environment(shared, monkeypatch):
    for name, (value, _) in PROXIES.items():
        monkeypatch.setenv(name, value)
    env = ray_jobs.RayLauncher(SERVER).environment(paths.run_dir("r1"), 1, 0.0)
    assert {name: env.get(name) for name in PROXIES} == {name: kept for name, (_, kept) in PROXIES.items()}


def test_no_secret_of_the_server_reaches_what_ray_stores(shared, calls, monkeypatch):
    for name, value in {**SECRETS, **{n: v for n, (v, _) in PROXIES.items()}}.items():
        monkeypatch.setenv(name, value)
    run_dir = run_folder()
    PlacingLauncher(WorkerLauncher()).start(run_dir, TrainConfig(launcher="ray", num_processes=2))
    [(address, submitted)] = calls
    assert address == SERVER and submitted["submission_id"] == ray_jobs.submission_id("r1")
    stored = json.dumps(submitted)  # entrypoint, metadata and runtime_env: what Ray's dashboard shows anyone
    assert [v for v in (*SECRETS.values(), *LEAKS) if v in stored] == []
    assert not set(SECRETS) & set(submitted["runtime_env"]["env_vars"])
    assert json.loads((run_dir / ray_jobs.JOB_FILE).read_text()) == {"address": SERVER, "job_id": "finetune-studio-r1"}


# --- the cluster address is the server's ---------------------------------------------------------------------

def ray_address_errors(cfg: TrainConfig) -> list[FieldError]:
    return [e for e in cfg.validate() if e.field == "ray_address"]


def refused(address: str) -> FieldError:
    return FieldError("ray_address", f"{address!r} is not a Ray cluster this server may use: leave ray_address empty "
                      "to use the server's cluster (RAY_ADDRESS), or ask an admin to add it to "
                      "FINETUNE_STUDIO_RAY_ADDRESSES (comma-separated) in the server's environment")


def test_a_run_cannot_point_the_dashboard_at_an_address_of_its_choosing(shared):
    for address in ("http://169.254.169.254/latest/meta-data", "http://other:8265", "http://head:8265.evil.example"):
        assert ray_address_errors(TrainConfig(launcher="ray", ray_address=address)) == [refused(address)]
    for address in ("", SERVER, SERVER + "/", f" {SERVER} "):  # empty: the server's own; the same one spelled again
        assert ray_address_errors(TrainConfig(launcher="ray", ray_address=address)) == []


def test_an_admin_allow_list_names_the_other_clusters_a_run_may_choose(shared, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", " http://gpu-b:8265/ ,http://gpu-c:8265,, ")
    for address in ("http://gpu-b:8265", "http://gpu-c:8265/"):
        assert ray_address_errors(TrainConfig(launcher="ray", ray_address=address)) == []
    assert ray_address_errors(TrainConfig(launcher="ray", ray_address="http://gpu-d:8265")) == [
        refused("http://gpu-d:8265")]
    monkeypatch.delenv("RAY_ADDRESS")  # a run may name an allow-listed cluster on a server without its own
    assert ray_address_errors(TrainConfig(launcher="ray", ray_address="http://gpu-b:8265")) == []


def test_the_launcher_refuses_an_address_the_server_does_not_allow_before_any_request(shared, calls, monkeypatch):
    launcher = PlacingLauncher(WorkerLauncher())
    run_dir = run_folder()
    # A config validated earlier (queued) or built without validation still cannot reach another host.
    with pytest.raises(OSError) as info:
        launcher.start(run_dir, TrainConfig(launcher="ray", ray_address="http://169.254.169.254"))
    assert str(info.value) == f"ray_address: {refused('http://169.254.169.254').message}"
    assert calls == [] and not (run_dir / ray_jobs.JOB_FILE).exists()
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", "http://gpu-b:8265")
    launcher.start(run_dir, TrainConfig(launcher="ray", ray_address="http://gpu-b:8265"))
    assert [address for address, _ in calls] == ["http://gpu-b:8265"]


def test_adoption_asks_the_servers_cluster_not_an_address_written_in_the_run_folder(shared, monkeypatch):
    run_folder("r1")
    (paths.run_dir("r1") / ray_jobs.JOB_FILE).write_text(json.dumps(
        {"address": "http://169.254.169.254", "job_id": "../../api/other"}))  # a tampered record
    handle = PlacingLauncher(WorkerLauncher()).adopt(Run("r1"))
    assert (handle.address, handle.job_id) == (SERVER, "finetune-studio-r1")
    monkeypatch.setenv("FINETUNE_STUDIO_RAY_ADDRESSES", "http://gpu-b:8265")
    run_folder("r2")
    (paths.run_dir("r2") / ray_jobs.JOB_FILE).write_text(json.dumps(
        {"address": "http://gpu-b:8265", "job_id": "finetune-studio-r2"}))  # started on an allowed cluster
    handle = PlacingLauncher(WorkerLauncher()).adopt(Run("r2"))
    assert (handle.address, handle.job_id) == ("http://gpu-b:8265", "finetune-studio-r2")


# --- the CLI and the server's tokens -------------------------------------------------------------------------

def test_the_cli_gives_a_ray_run_the_tokens_of_its_environment_as_a_local_run(shared, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_cli")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_cli")
    (tmp_path / "ray.yaml").write_text(yaml.safe_dump({"launcher": "ray"}))
    (tmp_path / "local.yaml").write_text(yaml.safe_dump({"launcher": "local"}))
    for cfg in (load_config(str(tmp_path / "ray.yaml"), []),
                load_config(str(tmp_path / "local.yaml"), ["launcher=ray"]), load_config(str(tmp_path / "local.yaml"), [])):
        assert (cfg.hf_token, cfg.wandb_token) == ("hf_cli", "wandb_cli")
        assert [e for e in cfg.validate() if e.field in ("hf_token", "wandb_token", "launcher", "ray_address")] == []


# --- "job not found" ----------------------------------------------------------------------------------------

def ray_error(status: int, text: str) -> Exception:
    """The exception Ray's Jobs client raises for an HTTP error answer (its own ``_raise_error``)."""
    sdk = pytest.importorskip("ray.dashboard.modules.dashboard_sdk")
    try:
        sdk.SubmissionClient._raise_error(None, SimpleNamespace(status_code=status, text=text))
    except Exception as exc:  # noqa: BLE001 - whatever Ray raises is what the launcher gets
        return exc
    raise AssertionError("Ray's _raise_error did not raise")


def state_when(monkeypatch, job_id: str, fail: Exception) -> JobState:
    monkeypatch.setattr(ray_jobs, "job_client", lambda address: FakeJobs(address, [], fail))
    return ray_jobs.RayHandle(SERVER, job_id).state()


def test_a_job_is_unknown_only_when_ray_answers_404(monkeypatch):
    gone = state_when(monkeypatch, "finetune-studio-r1", ray_error(404, "Job finetune-studio-r1 does not exist"))
    assert gone == JobState(False, f"is not known to the Ray cluster at {SERVER} (job finetune-studio-r1)")
    # "404" or "does not exist" elsewhere in a failure is a blip, retried until the grace period ends
    for job_id, fail in [("finetune-studio-run404", ray_error(503, "finetune-studio-run404 is busy")),
                         ("finetune-studio-r404", ray_error(500, "Internal error: 404 workers")),
                         ("finetune-studio-r1", ConnectionError("Failed to connect to Ray at address: http://x:404.")),
                         ("finetune-studio-r1", FileNotFoundError("Path to CA certificates: '/c', does not exist.")),
                         ("finetune-studio-r1", RuntimeError("Version check returned 404. the dashboard is too old"))]:
        assert state_when(monkeypatch, job_id, fail) == JobState(True), fail
