"""Starting, resuming and previewing recipes, for the Data page, the CLI and the API: the studio's models a recipe
names are served first (one serve job for all of them, found or started, idling out after the recipe), and the
serve job's key travels to the recipe's worker in its environment only."""
from __future__ import annotations

import dataclasses
import json
import os
import secrets as pysecrets
import shutil
import subprocess
import sys
from pathlib import Path

from trainer_core.auth import access
from trainer_core.config import ConfigError, FieldError
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.jobs.refusals import RunRefused, authorize
from trainer_core.protocol import files, paths, sandbox
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.recipes import starters
from trainer_core.recipes.spec import RecipeSpec
from trainer_core.specs import jobspec

ROOT = Path(__file__).resolve().parents[2]
TEACHER_IDLE_S = 600  # the teacher's serve job ends this long after the recipe's last request
PREVIEW_ROWS_MAX = 20
PREVIEW_TIMEOUT_S = float(os.environ.get("FINETUNE_STUDIO_TEACHER_WAIT_S", "900")) + 300


class PreviewError(RuntimeError):
    """The preview could not run; the message names why."""


def from_fields(fields: dict) -> RecipeSpec:
    """A RecipeSpec from a recipe file's or form's fields (``starter: NAME`` fills in that starter's first, the
    given fields over it). ConfigError names every problem."""
    fields = dict(fields)
    if fields.get("starter") and not fields.get("recipe"):
        try:
            fields = {**starters.spec_fields(str(fields["starter"])), **fields}
        except KeyError as exc:
            raise ConfigError([FieldError("starter", str(exc.args[0]))]) from None
    spec = RecipeSpec.from_dict(fields)
    return spec


def serve_models(orch: Orchestrator, spec: RecipeSpec, actor: access.Actor | None) -> RecipeSpec:
    """``spec`` with ``served_by`` set and the serve job's key attached, when it names models of this studio."""
    sources = spec.model_sources()
    if not sources or not spec.uses_teacher():
        return spec
    unique = list({s.key: s for s in sources}.values())
    job_id, key = orch.start_server(unique, actor=actor, purpose="playground", tied=False,
                                    idle_timeout_s=TEACHER_IDLE_S,
                                    name=f"Teacher · {spec.dataset_name}"[:80])
    return dataclasses.replace(spec, served_by=job_id).with_teacher_key(key)


def checked(orch: Orchestrator, spec: RecipeSpec, actor: access.Actor | None) -> RecipeSpec:
    """``spec`` as this actor may run it: valid, admin-only settings from an admin, ``resume_from`` a recipe job that
    ended without completing and that the actor may resume, and no serve job of anyone else's (``served_by`` is set
    here only). ConfigError lists every problem; RunRefused says who may."""
    authorize(actor, access.Action.START, "")
    errors = spec.validate()
    if errors:
        raise ConfigError(errors)
    if actor is not None and actor.role is not access.Role.ADMIN and spec.admin_only():
        raise RunRefused("Not allowed: " + "; ".join(spec.admin_only()))
    if spec.resume_from:
        old = orch.get_run(spec.resume_from)
        if old is None or old.kind is not JobKind.RECIPE:
            raise RunRefused(f"resume_from: there is no recipe job {spec.resume_from}.")
        if not old.status.is_terminal() or old.status is RunStatus.COMPLETED:
            raise RunRefused(f"resume_from: recipe job {spec.resume_from} is {old.status.label.lower()}: only a "
                             "stopped, cancelled or failed recipe job is continued")
        authorize(actor, access.Action.RESUME, old.owner)
    return dataclasses.replace(spec, served_by="")


def start(orch: Orchestrator, spec: RecipeSpec, actor: access.Actor | None = None) -> str:
    """Submit the recipe job (its models served first). ConfigError lists every problem; RunRefused says who may."""
    spec = checked(orch, spec, actor)
    return orch.submit(serve_models(orch, spec, actor), actor)


def resume(orch: Orchestrator, job_id: str, actor: access.Actor | None = None) -> str:
    """A new recipe job that continues ``job_id`` (stopped, cancelled or failed) where it ended."""
    run = orch.get_run(job_id)
    if run is None or run.kind is not JobKind.RECIPE:
        raise RunRefused(f"There is no recipe job {job_id}.")
    if not run.status.is_terminal():
        raise RunRefused(f"Recipe job {job_id} is still {run.status.label.lower()}: resume it once it has ended.")
    if run.status is RunStatus.COMPLETED:
        raise RunRefused(f"Recipe job {job_id} completed: start it again for a new version instead.")
    old = jobspec.read_spec(paths.run_dir(job_id))
    assert isinstance(old, RecipeSpec)
    spec = dataclasses.replace(old, resume_from=job_id, served_by="", name=(old.name or "")[:70])
    return start(orch, spec, actor)


def preview(orch: Orchestrator, spec: RecipeSpec, actor: access.Actor | None = None, rows: int = 5) -> dict:
    """A few records generated and checked as the job would, shown before the job: see worker/recipe_preview.py.
    PreviewError names why it could not run; ConfigError the spec's problems."""
    spec = checked(orch, dataclasses.replace(spec, resume_from=""), actor)
    rows = max(1, min(int(rows), PREVIEW_ROWS_MAX))
    served = serve_models(orch, spec, actor)
    out = paths.data_root() / "cache" / "recipe-previews" / pysecrets.token_hex(6)
    out.mkdir(parents=True)
    try:
        request = {**served.to_dict(), "_preview_rows": rows}
        (out / "spec.json").write_text(json.dumps(request))
        env = {**access.worker_env(os.environ, needs=served.env_names()),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "FINETUNE_STUDIO_ALLOWED_ROOTS": os.pathsep.join(str(r) for r in paths.allowed_data_roots())}
        if served.secrets():
            env["FINETUNE_STUDIO_TEACHER_KEY"] = served.secrets()["teacher_key"]
        command = [sys.executable, "-m", "trainer_core.worker.recipe_preview", str(out / "spec.json"), str(out)]
        try:
            command = sandbox.child_command(command, served.to_dict(), env, writable=[out])
            subprocess.run(command, capture_output=True, text=True, env=env, timeout=PREVIEW_TIMEOUT_S, cwd=out,
                           check=False)
        except sandbox.SandboxError as exc:
            raise PreviewError(str(exc)) from None
        except subprocess.TimeoutExpired:
            raise PreviewError(f"the preview took longer than {PREVIEW_TIMEOUT_S:.0f} s") from None
        try:
            result = json.loads(files.read_regular(out / "preview.json", 32 << 20))
        except (OSError, ValueError):
            raise PreviewError("the preview process ended without a result (see the server's log)") from None
        if "error" in result:
            raise PreviewError(result["error"])
        result["served_by"] = served.served_by
        return result
    finally:
        shutil.rmtree(out, ignore_errors=True)
