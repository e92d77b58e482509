"""Pushing an export to the hub: a push never writes into an existing repo unless asked (and then only one this studio
made, or for an admin), the repo is created without exist_ok so one made since the preflight is never written, the
Export form asks before updating an existing repo, and the model card quotes every user value. The hub is faked (no
network)."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError
from markdown_it import MarkdownIt

from db.store import Store
from trainer_core.auth import access
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.export import card
from trainer_core.export.spec import ExportSpec
from trainer_core.jobs.orchestrator import Orchestrator, RunRefused
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev, paths
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


# ====================================================================== the hub push
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


# ====================================================================== the model card
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
