"""Roles, run ownership, API tokens and the fail-closed authentication settings."""
from __future__ import annotations

import dataclasses
import getpass
import os
import time

import psutil
import pytest

from db import users
from db.entities import RunRecord
from db.store import Store
from gateway import settings, signin
from gateway.__main__ import main as share_main
from tests.support import fake
from tests.support.apptest import open_page
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.auth import access
from trainer_core.protocol import paths
from trainer_core.__main__ import cli_actor, main
from trainer_core.auth.access import Action, Actor, NotAllowed, Role, allowed, check, child_env
from trainer_core.config import TrainConfig, builtin_loader_names
from trainer_core.jobs.orchestrator import RunRefused
from trainer_core.protocol.status import RunStatus
from ui import auth
from ui.state import get_orchestrator

ANN = Actor("ann", Role.OPERATOR)
BOB = Actor("bob", Role.OPERATOR)
VAL = Actor("val", Role.VIEWER)
ADA = Actor("ada", Role.ADMIN)


# ====================================================================== role rules
@pytest.mark.parametrize("actor, action, owner, expected", [
    (VAL, Action.START, "", False),
    (VAL, Action.STOP, "val", False),  # a viewer cannot even stop a run recorded under its name
    (ANN, Action.START, "", True),
    (ANN, Action.STOP, "ann", True),
    (ANN, Action.CANCEL, "ann", True),
    (ANN, Action.DELETE, "ann", True),
    (ANN, Action.RESUME, "ann", True),
    (ANN, Action.REORDER, "ann", True),
    (ANN, Action.STOP, "bob", False),
    (ANN, Action.DELETE, "bob", False),
    (ANN, Action.RESUME, "bob", False),
    (ANN, Action.STOP, "", False),  # a run from before ownership belongs to nobody: only admins touch it
    (ANN, Action.MANAGE_USERS, "", False),
    (ANN, Action.MAINTAIN, "", False),
    (ANN, Action.MAINTAIN, "ann", False),
    (VAL, Action.MAINTAIN, "", False),
    (ADA, Action.MAINTAIN, "", True),
    (ADA, Action.STOP, "bob", True),
    (ADA, Action.DELETE, "", True),
    (ADA, Action.MANAGE_USERS, "", True),
    (VAL, Action.VOTE, "", True),  # issue 34: everyone's judgement counts
    (ANN, Action.VOTE, "", True),
    (VAL, Action.EXPORT_FEEDBACK, "", False),  # exporting writes a dataset to train on
    (ANN, Action.EXPORT_FEEDBACK, "", True),
    (ADA, Action.EXPORT_FEEDBACK, "", True),
])
def test_role_rules(actor, action, owner, expected):
    assert allowed(actor, action, owner) is expected


def test_refusals_say_why():
    with pytest.raises(NotAllowed, match="val is a viewer and cannot stop runs"):
        check(VAL, Action.STOP, "bob")
    with pytest.raises(NotAllowed, match="this run belongs to bob; operators can only delete their own runs"):
        check(ANN, Action.DELETE, "bob")


def test_child_env_drops_every_secret(monkeypatch, tmp_path):
    secrets = tmp_path / "secrets.toml"
    secrets.write_text('studio_password = "p"\nmy_db_password = "d"\n[oidc]\nclient_secret = "c"\n')
    monkeypatch.setattr(access, "secrets_files", lambda: [tmp_path / "missing.toml", secrets])
    env = {"PATH": "/bin", "FINETUNE_STUDIO_PASSWORD": "p", "FINETUNE_STUDIO_OIDC_CLIENT_SECRET": "c",
           "FINETUNE_STUDIO_SESSION_KEY": "k", "FINETUNE_STUDIO_TOKEN": "t", "HF_TOKEN": "h", "WANDB_API_KEY": "w",
           "FINETUNE_STUDIO_HOME": "/data",
           # Streamlit copies the root-level keys of secrets.toml into its own environment at start
           "studio_password": "p", "my_db_password": "d"}
    assert child_env(env) == {"PATH": "/bin", "FINETUNE_STUDIO_HOME": "/data"}


# ====================================================================== ownership through the orchestrator
def test_owner_is_recorded_and_operators_cannot_stop_or_delete_others_runs(orch, monkeypatch, capsys):
    run_id = orch.start(fake(monkeypatch, steps=1000, delay=0.05), actor=BOB)
    assert orch.get_run(run_id).owner == "bob"
    assert (paths.run_dir(run_id) / "owner.txt").read_text() == "bob\n"  # rebuildable from the run folder
    with pytest.raises(RunRefused, match="Not allowed: this run belongs to bob"):
        orch.stop(run_id, actor=ANN)
    with pytest.raises(RunRefused, match="val is a viewer"):
        orch.cancel(run_id, actor=VAL)
    with pytest.raises(RunRefused, match="val is a viewer"):
        orch.start(fake(monkeypatch, steps=1), actor=VAL)
    assert orch.get_run(run_id).status in (RunStatus.STARTING.value, RunStatus.RUNNING.value)

    orch.stop(run_id, actor=ADA)
    assert orch.wait(run_id, timeout=60, interval=0.1).status is RunStatus.STOPPED
    messages = [e.message for e in orch.events(run_id) if e.kind == "control"]
    assert messages == ["stop requested by ada"]
    with pytest.raises(RunRefused, match="belongs to bob"):
        orch.delete_run(run_id, actor=ANN)
    orch.delete_run(run_id, actor=BOB)
    assert orch.get_run(run_id) is None
    assert f"[finetune-studio] run {run_id} ('fake train') deleted by bob\n" in capsys.readouterr().err


def test_queue_actions_record_who_did_them(orch, monkeypatch):
    running = orch.start(fake(monkeypatch, steps=1000, delay=0.05), actor=ANN)
    queued = orch.start(fake(monkeypatch, steps=1), actor=ANN)
    with pytest.raises(RunRefused, match="belongs to ann"):
        orch.remove_from_queue(queued, actor=BOB)
    with pytest.raises(RunRefused, match="belongs to ann"):
        orch.move_in_queue(queued, -1, actor=BOB)
    orch.remove_from_queue(queued, actor=ANN)
    assert [e.message for e in orch.events(queued) if e.kind == "control"] == ["removed from the queue by ann"]
    orch.cancel(running, actor=ANN)
    assert orch.wait(running, timeout=60, interval=0.1).status is RunStatus.CANCELLED
    assert [e.message for e in orch.events(running) if e.kind == "control"] == ["cancel requested by ann"]


# ====================================================================== users and tokens
def test_users_keep_the_role_an_admin_gave_them(store):
    assert users.ensure_user(store, "ann", Role.VIEWER).role == "viewer"
    users.set_role(store, "ann", Role.OPERATOR)
    assert users.ensure_user(store, "ann", Role.VIEWER).role == "operator"  # signing in again keeps it
    assert users.actor_for(store, "ann") == Actor("ann", Role.OPERATOR)
    assert users.actor_for(store, "stranger") == Actor("stranger", Role.VIEWER)
    with pytest.raises(KeyError, match="no user 'nobody'"):
        users.set_role(store, "nobody", Role.ADMIN)


def test_api_tokens_are_stored_hashed_and_can_be_revoked(store):
    users.ensure_user(store, "ann", Role.OPERATOR)
    token = users.create_token(store, "ann", label="laptop")
    assert token.startswith("fts_")
    [row] = users.tokens_of(store, "ann")
    assert token not in row.token_hash and token.split("_", 2)[2] not in row.token_hash
    assert row.token_hash.startswith("$argon2id$")
    assert users.user_for_token(store, token) == Actor("ann", Role.OPERATOR)
    assert users.tokens_of(store, "ann")[0].last_used_at is not None
    with pytest.raises(users.UnknownToken, match="unknown or was revoked"):
        users.user_for_token(store, token[:-1] + ("A" if token[-1] != "A" else "B"))
    with pytest.raises(users.UnknownToken, match="start with fts_"):
        users.user_for_token(store, "hf_abc")
    assert users.revoke_token(store, "bob", row.id) is False  # only its owner revokes it
    assert users.revoke_token(store, "ann", row.id) is True
    with pytest.raises(users.UnknownToken):
        users.user_for_token(store, token)


# ====================================================================== fail-closed settings
def test_a_malformed_secrets_file_refuses_to_start_naming_file_and_line(tmp_path):
    broken = tmp_path / "secrets.toml"
    broken.write_text('# comment\nstudio_password = "unterminated\n')
    with pytest.raises(settings.SettingsError) as err:
        settings.read_secrets([broken])
    assert str(broken) in str(err.value) and "line 2" in str(err.value)


def test_a_password_that_is_not_a_string_is_refused():
    with pytest.raises(settings.SettingsError, match="must be a string"):
        settings.configured_password({"studio_password": 1234})


@pytest.mark.parametrize("env, secrets, problem", [
    ({}, {}, "no password and no OIDC provider"),
    ({"FINETUNE_STUDIO_PASSWORD": "short"}, {}, "has 5 characters; use at least 8"),
    ({"FINETUNE_STUDIO_OIDC_ISSUER": "https://id.example.com"}, {}, "FINETUNE_STUDIO_OIDC_CLIENT_ID"),
    ({"FINETUNE_STUDIO_OIDC_ISSUER": "http://id.example.com", "FINETUNE_STUDIO_OIDC_CLIENT_ID": "a",
      "FINETUNE_STUDIO_OIDC_CLIENT_SECRET": "b"}, {}, "must be an https:// URL"),
    ({"FINETUNE_STUDIO_PASSWORD": "long enough", "FINETUNE_STUDIO_DEFAULT_ROLE": "root"}, {}, "choose one of viewer"),
    ({"FINETUNE_STUDIO_PASSWORD": "long enough", "FINETUNE_STUDIO_TLS_CERT": "/nope.pem"}, {}, "set both"),
    ({}, {"oidc": "yes"}, "[oidc] in secrets.toml must be a table"),
    ({"FINETUNE_STUDIO_PASSWORD": "long enough", "FINETUNE_STUDIO_PUBLIC_URL": "https://x.example/studio"}, {},
     "without a path"),
])
def test_bad_auth_settings_refuse_to_start(env, secrets, problem):
    with pytest.raises(settings.SettingsError, match="nothing was started") as err:
        settings.load(env, secrets)
    assert problem in str(err.value)


def test_good_settings_password_and_oidc():
    s = settings.load({"FINETUNE_STUDIO_ADMINS": "ada, root@example.com"}, {"studio_password": "from the file"})
    assert (s.mode, s.password, s.admins) == ("password", "from the file", ("ada", "root@example.com"))
    assert s.role_for_new_user("ada") is Role.ADMIN and s.role_for_new_user("ann") is Role.VIEWER
    assert "from the file" not in repr(s)  # never printed by accident
    s = settings.load({"FINETUNE_STUDIO_DEFAULT_ROLE": "operator", "FINETUNE_STUDIO_PUBLIC_URL": "https://studio.example.com"},
                      {"oidc": {"issuer": "https://id.example.com/", "client_id": "studio", "client_secret": "x"}})
    assert (s.mode, s.issuer, s.client_id, s.default_role) == ("oidc", "https://id.example.com", "studio", Role.OPERATOR)
    assert s.public_url == "https://studio.example.com"  # OIDC needs it (issue 24): the redirect is built from it
    assert "client_secret='x'" not in repr(s)


# ====================================================================== builtin loader names (13.6)
def test_builtin_loader_names_come_from_the_installed_datasets_package():
    names = builtin_loader_names()
    assert {"json", "csv", "text", "parquet", "arrow", "pandas", "imagefolder", "audiofolder", "webdataset"} <= names


@pytest.mark.parametrize("hub_id", ["json", "csv", "Text", "parquet", "imagefolder", "webdataset"])
def test_builtin_loader_names_are_refused_as_hub_datasets(hub_id):
    errors = [str(e) for e in TrainConfig(hf_dataset=hub_id, local_datasets=[]).validate() if e.field == "hf_dataset"]
    assert errors == [f"hf_dataset: '{hub_id}' is a builtin loader of the datasets library, not a hub dataset: clear "
                      "hf_dataset and put your file or folder in local_datasets instead"]


# ====================================================================== the CLI's identity
def test_cli_acts_as_the_token_user_or_the_local_os_user(home, monkeypatch, tmp_path, capsys):
    store = Store()
    users.ensure_user(store, "val", Role.VIEWER)
    token = users.create_token(store, "val")
    monkeypatch.delenv("FINETUNE_STUDIO_TOKEN", raising=False)
    assert cli_actor(store) == Actor(getpass.getuser(), Role.ADMIN)
    monkeypatch.setenv("FINETUNE_STUDIO_TOKEN", token)
    assert cli_actor(store) == Actor("val", Role.VIEWER)

    config = tmp_path / "run.yaml"
    config.write_text("max_steps: 2\n")
    assert main(["run", "--config", str(config)]) == 2  # a viewer's token: refused before anything starts
    assert "refused: Not allowed: val is a viewer and cannot start runs" in capsys.readouterr().err
    monkeypatch.setenv("FINETUNE_STUDIO_TOKEN", token[:-2] + "xx")
    assert main(["run", "--config", str(config)]) == 2
    assert "refused: the API token is unknown or was revoked" in capsys.readouterr().err
    assert store.list_runs() == []
    store.engine.dispose()


# ====================================================================== pages as a signed-in user
def _as_user(monkeypatch, name: str) -> None:
    """Shared mode, as if nginx had set X-Studio-User and X-Studio-Session (AppTest has no proxy in front):
    a session of the user's current generation."""
    monkeypatch.setenv(auth.SHARED_ENV, "1")
    monkeypatch.setattr(auth, "proxy_user", lambda: name)
    monkeypatch.setattr(auth, "proxy_session", lambda: getattr(users.get_user(get_orchestrator().store, name),
                                                               "session_generation", None))


def _seed_runs(store) -> None:
    now = time.time()
    store.create_run(RunRecord(id="20250101-000000-bobbob", name="bob's run", owner="bob", status=RunStatus.RUNNING.value,
                         created_at=now, pid=os.getpid(), pid_started_at=psutil.Process().create_time(), devices="cpu"))
    store.create_run(RunRecord(id="20250101-000000-oldold", name="bob's old run", owner="bob",
                         status=RunStatus.STOPPED.value, created_at=now - 60, finished_at=now - 30))
    store.create_run(RunRecord(id="20250101-000000-annann", name="ann's run", owner="ann",
                         status=RunStatus.STOPPED.value, created_at=now - 90, finished_at=now - 80))
    for run_id in ("20250101-000000-bobbob", "20250101-000000-oldold", "20250101-000000-annann"):
        paths.run_dir(run_id).mkdir(parents=True, exist_ok=True)


@pytest.fixture
def shared_store(app_home):
    store = get_orchestrator().store
    users.ensure_user(store, "val", Role.VIEWER)
    users.ensure_user(store, "ann", Role.OPERATOR)
    users.ensure_user(store, "ada", Role.ADMIN)
    _seed_runs(store)
    return store


def test_a_viewer_sees_every_run_but_every_action_is_disabled(shared_store, monkeypatch):
    _as_user(monkeypatch, "val")
    at = open_page("pages/live.py")
    assert [t.value for t in at.title] == ["Live"]
    stop = next(b for b in at.button if b.label == "Stop & save")
    assert stop.disabled and "only bob or an admin can: you are viewer" in stop.help
    sidebar = [c.value for c in open_page().sidebar.caption]
    assert "Signed in as **val** (viewer) · [Sign out](/auth/logout)" in sidebar, sidebar
    at = open_page("pages/new_run.py")  # no form: no upload, preview or preset save either
    assert [i.value for i in at.info] == ["Viewers watch runs (Live, History, Run details, Compare); an admin can "
                                          "make you an operator on the Account page."]
    assert not at.button and not at.text_input and not at.get("file_uploader")
    at = open_page("pages/history.py")
    at.selectbox(key="history_pick").set_value("20250101-000000-annann").run()
    assert next(b for b in at.button if b.label == "Delete").disabled
    assert next(b for b in at.button if b.label == "Resume").disabled


def test_an_operator_acts_on_own_runs_only_and_history_filters_by_owner(shared_store, monkeypatch):
    _as_user(monkeypatch, "ann")
    at = open_page("pages/live.py")
    assert next(b for b in at.button if b.label == "Stop & save").disabled  # bob's run
    at = open_page("pages/history.py")
    at.selectbox(key="history_pick").set_value("20250101-000000-oldold").run()
    assert next(b for b in at.button if b.label == "Delete").disabled
    at.selectbox(key="history_pick").set_value("20250101-000000-annann").run()
    assert not next(b for b in at.button if b.label == "Delete").disabled
    at.multiselect(key="history_owners").set_value(["ann"]).run()
    assert [o.split(" · ")[0] for o in at.selectbox(key="history_pick").options] == ["ann's run"]


def test_an_admin_stops_someone_elses_run_and_the_timeline_says_who(shared_store, monkeypatch):
    _as_user(monkeypatch, "ada")
    at = open_page("pages/live.py")
    next(b for b in at.button if b.label == "Stop & save").click().run()
    assert not at.exception, at.exception
    events = [e.message for e in shared_store.get_events("20250101-000000-bobbob") if e.kind == "control"]
    assert events == ["stop requested by ada"]


def test_account_page_tokens_are_shown_once_and_admins_manage_roles(shared_store, monkeypatch):
    _as_user(monkeypatch, "ann")
    at = open_page("pages/account.py")
    assert "Users" not in [s.value for s in at.subheader]
    at.text_input(key="account_token_label").input("laptop")
    next(b for b in at.button if b.label == "Create token").click().run()
    [shown] = [c.value for c in at.code]
    assert users.user_for_token(shared_store, shown) == Actor("ann", Role.OPERATOR)
    at.run()
    assert [c.value for c in at.code] == []  # shown once
    next(b for b in at.button if b.label == "Revoke").click().run()
    assert users.tokens_of(shared_store, "ann") == []

    _as_user(monkeypatch, "ada")
    at = open_page("pages/account.py")
    assert "Users" in [s.value for s in at.subheader]
    at.button(key="role_val_operator").click().run()  # a button per change (issue 24): no remembered selectbox
    assert users.actor_for(shared_store, "val") == Actor("val", Role.OPERATOR)
    assert not [b for b in at.button if b.key and b.key.startswith("role_ada_")]  # not your own


def test_make_share_without_authentication_starts_nothing(home, monkeypatch, tmp_path, capsys):
    for name in ("FINETUNE_STUDIO_PASSWORD", *settings.OIDC_ENV.values()):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(access, "secrets_files", lambda: [tmp_path / "none.toml"])
    assert share_main(["--port", "1"]) == 2
    assert "shared mode never starts without authentication" in capsys.readouterr().err
    assert not (home / "share" / "nginx.conf").exists()  # nothing was written, nothing was started


@pytest.mark.parametrize("claims, name", [
    ({"sub": "u1", "email": "ana@example.com", "email_verified": True}, "ana@example.com"),
    ({"sub": "u1", "email": "ana@example.com"}, "ana@example.com"),  # providers that do not say
    ({"sub": "u1", "email": "ada@example.com", "email_verified": False}, "u1"),  # could be anyone's address
    ({"sub": "u1"}, "u1"),
    ({}, ""),
])
def test_oidc_user_name(claims, name):
    assert signin.oidc_user_name(claims) == name


@pytest.mark.parametrize("target, expected", [
    ("/run?run=a", "/run?run=a"), ("/compare?run=a&run=b", "/compare?run=a&run=b"), ("", "/"), (None, "/"),
    ("//evil.example", "/"), ("/\\evil.example", "/"), ("https://evil.example", "/"), ("/auth/logout", "/"),
    ("/x\r\nSet-Cookie: a=b", "/"),
])
def test_sign_in_returns_only_to_this_site(target, expected):
    assert signin.safe_next(target) == expected


@pytest.mark.parametrize("name, may_rebuild", [("val", False), ("ann", False), ("ada", True)])
def test_only_admins_may_rebuild_the_database(shared_store, monkeypatch, name, may_rebuild):
    _as_user(monkeypatch, name)
    at = open_page("pages/settings.py")
    button = next(b for b in at.button if b.label == "Rebuild the database from the run folders")
    assert button.disabled is not may_rebuild
    assert ("Only an admin can rebuild the database." in [i.value for i in at.info]) is not may_rebuild


# ---- trust_remote_code is an admin's, like a custom Python reward (issue 31, item 1)
def test_only_an_admin_starts_or_resumes_a_run_that_trusts_remote_code(orch, monkeypatch):
    cfg = dataclasses.replace(fake(monkeypatch, steps=1), trust_remote_code=True)
    with pytest.raises(RunRefused, match="only an admin may start a run with it"):
        orch.start(cfg, actor=ANN)
    assert orch.list_runs() == []
    run_id = orch.start(cfg, actor=ADA)
    assert orch.wait(run_id, timeout=60, interval=0.1).status is RunStatus.COMPLETED


def test_jobs_that_load_a_run_trusting_remote_code_are_an_admins(home):
    from tests.support.factories import run_folder
    from trainer_core.evaluation.spec import EvalSpec
    from trainer_core.export.spec import ExportSpec
    from trainer_core.specs.model_source import ModelSource
    from trainer_core.serving.spec import ServeSpec

    run_folder("20260101-000000-trusts")
    run_folder("20260101-000000-plain0")
    config = paths.run_dir("20260101-000000-trusts") / "config.yaml"
    config.write_text(dataclasses.replace(TrainConfig.from_yaml(config.read_text()), trust_remote_code=True).to_yaml())
    trusting, plain = ModelSource(run_id="20260101-000000-trusts"), ModelSource(run_id="20260101-000000-plain0")
    reason = ("source: run 20260101-000000-trusts loads code shipped with its model (trust_remote_code), which runs "
              "on this host: only an admin may load it; ask an admin")
    assert EvalSpec(source=trusting, data="x.jsonl").admin_only() == [reason]
    assert ExportSpec(source=trusting).admin_only() == [reason]
    assert ServeSpec(sources=[plain, trusting]).admin_only() == [reason]
    assert EvalSpec(source=plain, data="x.jsonl").admin_only() == ExportSpec(source=plain).admin_only() == []


def test_the_form_says_trust_remote_code_is_an_admins():
    from ui import form

    state = {form.K + "trust_remote_code": True, form.K + "trust_remote_code_confirm": True}
    assert [e.message for e in form.remote_code_errors(state, admin=False)] == [form.REMOTE_CODE_ADMIN_ONLY]
    assert form.remote_code_errors(state, admin=True) == []


def test_a_methods_admin_reasons_hook_refuses_an_operator_and_its_job_files_land_in_the_run(orch, monkeypatch, tmp_path):
    """GRPO's Python reward through MethodSpec's hooks (no method name in the orchestrator): refused for an operator
    naming the reason, and for an admin the reward's file is copied into the run folder with its hash."""
    from trainer_core.methods import METHODS

    reward = tmp_path / "mine.py"
    reward.write_text("def score(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    cfg = dataclasses.replace(fake(monkeypatch, steps=1), method="grpo",
                              method_settings=GRPOSettings(rewards=[{"python": str(reward), "function": "score"}]))
    assert METHODS["grpo"].admin_reasons(cfg) == [METHODS["grpo"].admin_reasons.__globals__["ADMIN_REASON"]]
    assert all(spec.admin_reasons is None or spec.admin_reasons(fake(monkeypatch, steps=1)) == []
               for spec in METHODS.values())
    with pytest.raises(RunRefused, match="^Not allowed: a custom Python reward runs its code on this host"):
        orch.start(cfg, actor=ANN)
    folder = tmp_path / "folder"
    folder.mkdir()
    METHODS["grpo"].job_files(cfg, folder)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == [
        "rewards", "rewards/manifest.json", "rewards/score.py"]
    assert (folder / "rewards" / "score.py").read_text() == reward.read_text()


def test_grpo_tools_are_an_admins_like_python_rewards(orch, monkeypatch, tmp_path):
    """Issue 32: a GRPO run with tool files runs their code on this host: an operator is refused naming grpo.tools and
    the way out; the refusal comes before validation, so nothing is recorded."""
    tool = tmp_path / "calc.py"
    tool.write_text('def add(a: int, b: int) -> int:\n    """Add.\n\n    Args:\n        a: A.\n        b: B.\n    """\n'
                    "    return a + b\n")
    cfg = dataclasses.replace(fake(monkeypatch, steps=1), method="grpo",
                              method_settings=GRPOSettings(rewards=["length"], tools=[str(tool)]))
    with pytest.raises(RunRefused, match=r"^Not allowed: grpo\.tools run their code on this host during training, so "
                                         r"only an admin may start a run with them; leave out grpo\.tools, or ask an "
                                         r"admin to start it\.$"):
        orch.start(cfg, actor=ANN)
    assert orch.list_runs() == []
