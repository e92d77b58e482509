"""Issue 24's export findings: a hub push never writes into an existing repo unless asked (and then only one this
studio made, or for an admin); the model card quotes every user value; a chosen out_dir stays in an export
folder; a killed export takes its converter along and its staging folder is removed later; the step count, the
timeline's label and the CLI's first line tell the truth. The hub is faked (no network)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
import pytest
import yaml
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError
from markdown_it import MarkdownIt

from db.entities import RunRecord
from db.store import Store
from tests.support import ROOT
from trainer_core.auth import access
from trainer_core.specs import jobspec
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.export import card, staging
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs import pump
from trainer_core.jobs.live import LiveRun
from trainer_core.jobs.orchestrator import Orchestrator, RunRefused
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev, paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.worker import export as worker_export
from trainer_core.worker.export import ExportWorker, Plan

RUN = "20260124-100000-aaaaaa"
HOSTILE = "```\n</code></pre><img src=x onerror=alert(1)>\n# Owned heading\n| a | b |\n[link](javascript:x)"


@pytest.fixture
def run(home, monkeypatch):
    """A finished LoRA run (named only: nothing here loads it)."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    return folder


def errors(spec: ExportSpec) -> dict[str, str]:
    found: dict[str, str] = {}
    for error in spec.validate():
        found.setdefault(error.field, error.message)
    return found


# ====================================================================== the hub push (Security 8)
def not_found(kind=RepositoryNotFoundError):
    response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))
    return kind("404 Client Error: not found", response=response)


class FakeHub:
    """HfApi as the worker uses it: whoami, repo_info, hf_hub_download of README.md, create_repo, upload_folder.
    ``repos`` maps a repo id to (private, README text or None); calls are recorded."""

    def __init__(self, repos: dict[str, tuple[bool, str | None]]):
        self.repos, self.calls = repos, []

    def __call__(self, token=None):
        return self

    def whoami(self):
        return {"name": "me"}

    def repo_info(self, repo_id, repo_type=None):
        self.calls.append(("repo_info", repo_id))
        if repo_id not in self.repos:
            raise not_found()
        return SimpleNamespace(private=self.repos[repo_id][0])

    def hf_hub_download(self, repo_id, filename, repo_type=None, local_dir=None):
        self.calls.append(("download", repo_id, filename))
        readme = self.repos[repo_id][1]
        if readme is None:
            raise not_found(RemoteEntryNotFoundError)
        path = Path(local_dir) / filename
        path.write_text(readme)
        return str(path)

    def create_repo(self, repo_id, private=None, exist_ok=False):
        self.calls.append(("create_repo", repo_id, private, exist_ok))
        if repo_id in self.repos and not exist_ok:
            raise RuntimeError(f"409 Conflict: You already created this model repo: {repo_id}")
        self.repos.setdefault(repo_id, (bool(private), None))

    def upload_folder(self, folder_path, repo_id, commit_message):
        self.calls.append(("upload_folder", repo_id))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/abc")


STUDIO_CARD = card.render(title="m", source_label="tone · final", base_model=BUNDLED_MODEL, method="SFT · LoRA",
                          data="", config={}, facts=card.RunFacts(), artifacts=[], verify=[], chart_file=None)


@pytest.fixture
def hub(home, monkeypatch, tmp_path):
    import huggingface_hub

    fake = FakeHub({"me/new-made-by-studio": (True, STUDIO_CARD), "org/their-repo": (True, "# Their model\n"),
                    "org/no-card": (True, None), "me/public-studio": (False, STUDIO_CARD)})
    monkeypatch.setattr(huggingface_hub, "HfApi", fake)
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    monkeypatch.setenv("HF_TOKEN", "hf_push_secret_123")
    return fake


def hub_problem(tmp_path, **values) -> tuple[list[str], Plan]:
    spec = ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], **values)
    plan = Plan(spec, SimpleNamespace(source=spec.source, label="tone · final"), final=tmp_path / "artifacts",
                staging=tmp_path / ".artifacts.tmp-1", base_dir="")
    worker = ExportWorker(tmp_path)
    try:
        return worker.hub_problems(plan), plan
    finally:
        worker.events.close()


def test_a_push_into_an_existing_repo_is_refused_unless_an_update_of_a_studio_repo_was_chosen(hub, tmp_path):
    """`--push org/their-repo` validated and the worker wrote into it (create_repo(exist_ok=True), then
    upload_folder), private flag ignored: any repo the server's token could write."""
    problems, _ = hub_problem(tmp_path, push_repo_id="org/their-repo")
    assert problems == ["push_repo_id: org/their-repo already exists on the hub, and an export never writes into an "
                        "existing repo unless asked: choose a new repo id, or choose to update the existing repo "
                        "(form: 'Update an existing repo'; CLI: --update-existing) if Finetune Studio created it"]
    problems, _ = hub_problem(tmp_path, push_repo_id="org/their-repo", push_update=True)
    assert problems == ["push_repo_id: org/their-repo was not created by Finetune Studio (its README.md front matter "
                        "has no `finetune_studio: true`), so an export does not update it: choose a new repo id, or "
                        "ask an admin to push it"]
    assert hub_problem(tmp_path, push_repo_id="org/no-card", push_update=True)[0][0].startswith(
        "push_repo_id: org/no-card was not created by Finetune Studio")
    assert hub_problem(tmp_path, push_repo_id="me/public-studio", push_update=True)[0] == [
        "push_repo_id: me/public-studio is public, and the export was asked to push privately: make the repo "
        "private on the hub first, choose a public push (CLI: --public), or choose a new repo id"]
    # What may go through: a new repo, an update of one this studio made, an admin's update of any repo.
    assert hub_problem(tmp_path, push_repo_id="me/brand-new")[0] == []
    assert hub_problem(tmp_path, push_repo_id="me/new-made-by-studio", push_update=True)[0] == []
    assert hub_problem(tmp_path, push_repo_id="me/public-studio", push_update=True, push_private=False)[0] == []
    assert hub_problem(tmp_path, push_repo_id="org/their-repo", push_update=True, push_update_any=True)[0] == []
    assert ("download", "org/their-repo", "README.md") in hub.calls


def test_the_push_creates_a_new_repo_without_exist_ok_so_a_repo_made_since_preflight_is_never_written(hub, tmp_path):
    _, plan = hub_problem(tmp_path, push_repo_id="me/brand-new")
    hub.repos["me/brand-new"] = (False, "# someone was faster\n")  # created between preflight and push
    worker = ExportWorker(tmp_path)
    with pytest.raises(worker_export.ExportError, match=r"^the push to me/brand-new failed \(409 Conflict"):
        worker.push(plan)
    assert ("upload_folder", "me/brand-new") not in hub.calls
    assert hub.calls[-1] == ("create_repo", "me/brand-new", True, False)

    _, plan = hub_problem(tmp_path, push_repo_id="me/new-made-by-studio", push_update=True)
    worker.push(plan)
    worker.events.close()
    assert hub.calls[-2:] == [("create_repo", "me/new-made-by-studio", True, True),
                              ("upload_folder", "me/new-made-by-studio")]
    status = [e for e in ev.read_new(tmp_path / ev.LOG_NAME, 0)[0] if e.kind == "status"][-1]
    assert status.message == ("pushed to https://huggingface.co/me/new-made-by-studio/commit/abc (an existing repo, "
                              "its visibility unchanged)")


def test_updating_any_repo_is_for_admins_only(run, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    spec = ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], push_repo_id="org/their-repo",
                      push_update=True, push_update_any=True)
    assert errors(spec) == {}
    assert errors(ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], push_update=True,
                             push_update_any=True)) == {
        "push_update": "updating an existing repo needs push_repo_id (the repo to update)"}
    assert errors(ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], push_repo_id="me/x",
                             push_update_any=True)) == {"push_update_any": "only together with push_update"}
    orch = Orchestrator(start_pump=False)
    try:
        with pytest.raises(RunRefused) as refused:
            orch.submit(spec, actor=access.Actor("olga", access.Role.OPERATOR))
        assert str(refused.value) == ("Not allowed: push_update_any: only an admin may update a hub repo this studio "
                                      "did not create; push to a new repo id, or update one whose model card "
                                      "Finetune Studio wrote")
        assert orch.store.children(RUN) == []
    finally:
        orch.close()


# ====================================================================== the model card (Security 11)
def test_the_model_card_quotes_every_user_value(tmp_path):
    """A system_prompt with a code fence, an <img onerror> and a heading broke out of the card's YAML block, and
    CommonMark rendered the tag and the heading; run and dataset names went into the card as markdown too."""
    config = TrainConfig(run_name=HOSTILE, system_prompt=HOSTILE).to_public_dict()
    facts = card.RunFacts(losses=[(1, 2.0), (2, 1.5)], final_loss=1.5, steps=2)
    text = card.render(title="tone", source_label=f"{HOSTILE} · final", base_model=f"org/m`x`{HOSTILE}",
                       method="SFT · LoRA", data=HOSTILE, config=config, facts=facts,
                       artifacts=[("m-adapter.zip", f"the adapter of {HOSTILE}")],
                       verify=[{"format": "merged", "identical": 1, "total": 2,
                                "first_difference": f"prompt 1 ({HOSTILE!r}): adapter '<b>', merged '#'"}],
                       chart_file=None)
    front, body = re.fullmatch(r"---\n(.*?)\n---\n(.*)", text, re.DOTALL).groups()  # the hub strips the front matter
    assert yaml.safe_load(front) == {"finetune_studio": True, "tags": ["finetune-studio"]}
    assert card.is_studio_card(text) and not card.is_studio_card(body) and not card.is_studio_card("# x\n")

    html = MarkdownIt("commonmark").enable("table").render(body)
    assert "<img" not in html and "<a " not in html and "<b>" not in html
    assert re.findall(r"<h(\d)>(.*?)</h\1>", html) == [
        ("1", "tone"), ("2", "Files"), ("2", "Training loss"), ("2", "Verification"), ("2", "Training config (no secrets)")]
    tokens = MarkdownIt("commonmark").enable("table").parse(body)
    [block] = [t for t in tokens if t.type == "fence"]
    assert block.info == "yaml" and yaml.safe_load(block.content) == config
    assert config["system_prompt"] == HOSTILE and config["run_name"] == HOSTILE
    cells = [t.content for t in tokens if t.type == "inline"]
    flat = HOSTILE.replace("\n", " ")
    assert f"Exported from **{card.text(flat)} · final** with Finetune Studio." in cells
    # each value renders as exactly itself, on one line: the data cell, the base model, the verify difference
    rendered = re.sub(r"<[^>]+>", "", html).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"') \
        .replace("&amp;", "&")
    assert flat in rendered and f"org/m`x`{flat}" in rendered and f"the adapter of {flat}" in rendered


# ====================================================================== out_dir (Security 13)
def test_a_chosen_out_dir_stays_inside_an_export_folder(run, tmp_path):
    """out_dir accepted any new folder under the data root or the project checkout: a run's folder, models/,
    the code. Only the exports/ folder of the data root or of an allowed root takes artifacts."""
    home = paths.data_root()
    exports = [home / "exports", tmp_path / "exports"]
    outside = {str(paths.run_dir(RUN) / "x"): paths.run_dir(RUN) / "x", str(home / "models" / "x"): home / "models" / "x",
               str(tmp_path / "code"): tmp_path / "code"}
    for given, resolved in outside.items():
        assert errors(ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=given)) == {
            "out_dir": f"{given} resolves to {resolved}, which is outside the allowed folders "
                       f"({exports[0]}, {exports[1]}): exports go in a new folder under {exports[0]} or {exports[1]}"}
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "link").symlink_to(paths.run_dir(RUN))  # a symlink out of the export folder
    assert "which is outside the allowed folders" in errors(ExportSpec(
        source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=str(tmp_path / "exports" / "link" / "x")))["out_dir"]
    assert errors(ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=str(exports[1]))) == {
        "out_dir": f"{exports[1]} is the export folder itself: name a new folder inside it, e.g. "
                   f"{exports[1] / 'my-export'}"}
    fine = ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"], out_dir=str(home / "exports" / "mine"))
    assert errors(fine) == {} and fine.output_dir(run) == home / "exports" / "mine"  # exports/ is made on demand


# ====================================================================== a killed export (Wrong states 6)
FAKE_CONVERTER = textwrap.dedent("""
    import os, sys, time
    out = sys.argv[1]
    open(out + ".pid", "w").write(str(os.getpid()))
    with open(out, "ab") as fh:
        while True:  # a conversion that takes long: it writes into the staging folder until it is killed
            fh.write(b"GGUF"); fh.flush(); time.sleep(0.05)
""")

# The export worker's own code around a conversion: its staging folder (locked), then run_tool on a converter.
KILLED_WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from trainer_core.export import staging
    from trainer_core.worker.export import ExportWorker
    job, converter = Path(sys.argv[1]), sys.argv[2]
    worker = ExportWorker(job)
    worker.begin()
    folder, _ = staging.create(job / "artifacts")
    worker.run_tool([sys.executable, converter, str(folder / "m-q8_0.gguf")], "convert_hf_to_gguf")
""")


def export_job(job_id: str, spec: ExportSpec) -> Path:
    job = paths.run_dir(job_id)
    job.mkdir(parents=True)
    jobspec.write_spec(job, spec)
    write_kind(job, JobKind.EXPORT)
    return job


def wait_for(condition, what: str, limit_s: float = 120.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"still waiting for {what} after {limit_s:.0f}s")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def worker_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_a_killed_export_takes_its_converter_along_and_the_next_start_removes_its_staging(run, tmp_path):
    """SIGKILL of the worker left the converter writing into .artifacts.tmp-<pid> (it shared no fate with the
    worker), and the staging folder stayed forever (274 MB for the bundled model)."""
    job = export_job("20260124-100001-killed", ExportSpec(source=ModelSource(run_id=RUN), targets=["gguf"]))
    converter = tmp_path / "fake_convert.py"
    converter.write_text(FAKE_CONVERTER)
    worker = subprocess.Popen([sys.executable, "-c", KILLED_WORKER, str(job), str(converter)], env=worker_env(),
                              cwd=job, start_new_session=True)
    folder = job / f".artifacts.tmp-{worker.pid}"
    pid_file = folder / "m-q8_0.gguf.pid"
    converter_pid = int(wait_for(lambda: pid_file.is_file() and pid_file.read_text(), "the converter to start"))
    assert psutil.Process(converter_pid).ppid() == worker.pid
    os.kill(worker.pid, signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: gone(converter_pid), "the converter to die with its worker")
    assert folder.is_dir()  # a SIGKILL leaves it: the next start removes it

    # A staging folder someone holds (this process, as a live worker would) is left alone.
    live_job = export_job("20260124-100002-living", ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"]))
    live, lock = staging.create(live_job / "artifacts")
    try:
        broken = export_job("20260124-100003-nextup", ExportSpec(source=ModelSource(run_id="20260124-000000-gone00"),
                                                                  targets=["adapter"]))
        done = subprocess.run([sys.executable, "-m", "trainer_core.worker", str(broken)], env=worker_env(),
                              cwd=broken, capture_output=True, text=True, timeout=600)
        assert done.returncode == 1, done.stderr[-2000:]
        assert f"removed the stale staging folder {folder}" in done.stdout
        assert not folder.exists() and live.is_dir()
    finally:
        os.close(lock)


def test_an_orchestrator_adopting_an_export_job_removes_its_dead_workers_staging(run):
    job = export_job("20260124-100004-adopt0", ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"]))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = job / f".artifacts.tmp-{dead.pid}"
    (left / "merged").mkdir(parents=True)
    (left / "merged" / "model.safetensors").write_bytes(b"w" * 100)
    store = Store()
    store.create_run(RunRecord(id=job.name, name="export", status=RunStatus.RUNNING.value, kind=JobKind.EXPORT,
                               created_at=time.time(), started_at=time.time(), pid=dead.pid,
                               pid_started_at=time.time() - 5, output_dir=str(job)))
    orch = Orchestrator(store, start_pump=False)  # adopts the jobs nobody follows as it starts
    try:
        assert not left.exists()
    finally:
        orch.close()


# ====================================================================== cosmetic truths
def test_the_timeline_names_the_job_kind_not_training(run):
    """The timeline said "Training: publish" for an export and "Training: generating" for an eval."""
    for kind, phase, expected in [(JobKind.EXPORT, "publish", "Exporting: publish"),
                                  (JobKind.EVAL, "generating", "Evaluating: generating"),
                                  (JobKind.TRAIN, "training", "Training: training")]:
        tracker = pump.Tracker("20260124-100005-tl0000", run, LiveRun("x", kind.value, RunStatus.RUNNING), 0, None,
                               kind=kind)
        pump.handle(tracker, ev.StatusEvent(status=RunStatus.RUNNING.value, phase=phase))
        assert tracker.timeline[-1][1:] == ("status", expected)
        tracker.log.close()


def test_the_cli_says_queued_when_the_export_waits_for_the_device(run, monkeypatch, capsys):
    """The CLI printed "export job ... started" for a job that sat in the queue behind a training run."""
    from tests.support.factories import insert_finished_run
    from trainer_core.__main__ import main

    monkeypatch.delenv("FINETUNE_STUDIO_TOKEN", raising=False)
    store = Store()
    insert_finished_run(store, RUN, "tone", [2.0, 1.5])
    me = psutil.Process()
    store.create_run(RunRecord(id="20260124-100006-busy00", name="busy", status=RunStatus.RUNNING.value,
                               created_at=time.time(), started_at=time.time(), devices="cpu", pid=me.pid,
                               pid_started_at=me.create_time()))  # alive, no folder: nobody adopts it
    store.engine.dispose()
    monkeypatch.setattr(Orchestrator, "wait", lambda self, job_id, **kw: SimpleNamespace(
        status=RunStatus.CANCELLED, warnings=[], error=""))
    assert main(["export", RUN, "--to", "adapter"]) == 3
    first = capsys.readouterr().err.splitlines()[0]
    assert re.fullmatch(rf"export job \S+ queued for run {RUN}: it starts when the device is free \(Ctrl-C cancels "
                        r"it\)", first), first
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_completed_export_shows_every_step_done(run, monkeypatch):
    """A finished adapter export showed 3/4 steps (and merged + GGUF 6/7): preflight was one of the steps but never
    counted. The stages are the worker's own; only the ones that need a model are played here."""
    job = export_job("20260124-100007-steps0", ExportSpec(source=ModelSource(run_id=RUN), targets=["adapter"],
                                                          verify=False))
    spec = jobspec.read_spec(job)

    def preflight(self, spec):
        final = spec.output_dir(self.run_dir)
        resolved = SimpleNamespace(source=spec.source, served_name="m", label="tone · final")
        return Plan(spec, resolved, final=final, staging=staging.staging_path(final), base_dir="")

    def zip_weights(self, plan):
        (plan.staging / "m-adapter.zip").write_bytes(b"PK")
        plan.staged.append(worker_export.Staged("m-adapter.zip", "adapter", "adapter"))

    def write_card(self, plan):
        (plan.staging / "README.md").write_text(STUDIO_CARD)
        plan.staged.append(worker_export.Staged("README.md", "card"))

    monkeypatch.setattr(ExportWorker, "preflight", preflight)
    monkeypatch.setattr(ExportWorker, "zip_weights", zip_weights)
    monkeypatch.setattr(ExportWorker, "write_card", write_card)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert ExportWorker(job).run() == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    events = ev.read_new(job / ev.LOG_NAME, 0)[0]
    progress = [(e.step, e.total_steps) for e in events if e.kind == "progress"]
    assert spec.stages() == ["preflight", "adapter", "model card", "publish"]
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert (events[-1].kind, events[-1].status, events[-1].steps) == ("complete", "completed", 4)


def test_the_export_form_asks_before_updating_an_existing_repo(app_home, monkeypatch):
    """The form's "Update an existing repo" is the user's explicit choice (off by default); an admin's choice
    covers any repo (push_update_any), which the orchestrator accepts from admins only."""
    from tests.support.factories import insert_finished_run
    from tests.support.apptest import open_page

    monkeypatch.setenv("HF_TOKEN", "hf_x")
    store = Store()
    insert_finished_run(store, RUN, "tone", [2.0, 1.5])
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    store.engine.dispose()
    asked = []

    def submit(self, spec, actor=None):
        asked.append((spec.push_repo_id, spec.push_update, spec.push_update_any, actor.role))
        raise RunRefused("not now")  # nothing is started: only what the form asked for matters here

    monkeypatch.setattr(Orchestrator, "submit", submit)
    at = open_page("pages/run.py", detail_run_id=RUN)
    assert at.checkbox(key=f"export_update_{RUN}").disabled and not at.checkbox(key=f"export_update_{RUN}").value
    at.text_input(key=f"export_repo_{RUN}").input("me/tone")
    at.multiselect(key=f"export_targets_{RUN}").set_value(["adapter"])
    at.button(key=f"export_start_{RUN}").click().run()
    at.checkbox(key=f"export_update_{RUN}").check()
    at.button(key=f"export_start_{RUN}").click().run()
    assert not at.exception
    assert asked == [("me/tone", False, False, access.Role.ADMIN), ("me/tone", True, True, access.Role.ADMIN)]
