"""Run details' Export section: start an export job on the run's model (or a checkpoint), follow it, list its
artifacts with size and sha256 (small ones download from the page, large ones show their path and a copy-ready
command) and its verify results. Layout only: the orchestrator does the work."""
from __future__ import annotations

import shlex
from pathlib import Path

import streamlit as st

from db.entities import ArtifactRecord, RunRecord
from trainer_core.specs import jobspec, model_source
from trainer_core.config import promptsets
from trainer_core.auth.access import Action, Role, allowed
from trainer_core.config import ConfigError
from trainer_core.export import tools
from trainer_core.export.spec import MERGED_DTYPES, TARGETS, ExportSpec, vision_gguf_offered
from trainer_core.jobs.orchestrator import Orchestrator, RunRefused
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from ui import format as fmt
from ui.auth import current_actor
from ui.ray_run import job_place
from ui.server_paths import shown
from ui.text import code, safe

DOWNLOAD_MAX_BYTES = 100 << 20  # larger artifacts are not pushed through the browser: path + command instead
TARGET_LABELS = {"adapter": "Adapter (zip)", "merged": "Merged 16-bit safetensors",
                 "gguf": "GGUF + Ollama Modelfile (vision models: + mmproj projector)",
                 "onnx": "ONNX (embedding models)"}


def copy_command(path: str) -> str:
    """A command that copies the artifact (a folder recursively) into the current folder."""
    return f"cp -r {shlex.quote(path)} ." if Path(path).is_dir() else f"cp {shlex.quote(path)} ."


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


def artifact_table(artifacts: list[ArtifactRecord]) -> list[dict]:
    return [{"file": Path(a.path).name, "kind": a.kind + (f" ({a.detail})" if a.detail else ""),
             "size": size_text(a.size), "sha256": a.sha256, "created": fmt.timestamp(a.created_at)}
            for a in artifacts]


def llama_cpp_command(artifacts: list[ArtifactRecord]) -> str | None:
    """How llama.cpp runs a vision export's language GGUF with its mmproj projector (Ollama gets no Modelfile for the
    pair), or None for an export without a projector."""
    mmproj = next((a.path for a in artifacts if a.kind == "mmproj"), None)
    model = next((a.path for a in artifacts if a.kind == "gguf"), None)
    if mmproj is None or model is None:
        return None
    return f"llama-server -m {shlex.quote(model)} --mmproj {shlex.quote(mmproj)}"


def quant_help() -> str:
    quantize = tools.llama_quantize()
    if quantize:
        return f"K-quants come from llama-quantize ({quantize})."
    return (f"f16, bf16 and q8_0 come from llama.cpp's converter. K-quants (q4_k_m, ...) need llama.cpp's "
            f"llama-quantize on PATH or in {tools.QUANTIZE_ENV}; it was not found.")


def default_targets(config: dict) -> list[str]:
    """What the form offers first for a run: its model kind's default exports (trainer_core.kinds), GGUF only where
    llama.cpp's converter writes a vision model's language model and projector. The export spec still checks
    whatever is picked."""
    from trainer_core import kinds, methods
    from trainer_core.planning import model_info, modality

    method = config.get("method") or "sft"
    output = methods.METHODS[method].output if method in methods.METHODS else "text"
    model = str(config.get("model_name") or "")
    base = None
    if output == "text":  # the base model's files tell a vision-language model from a text one
        try:
            base = modality.detect_kind(model)
        except (model_info.ModelInfoError, OSError, ValueError):
            pass
    kind = kinds.of_output(output, base)
    return [t for t in kind.default_exports
            if not (t == "gguf" and kind.gguf_needs_converter and not vision_gguf_offered(model))]


def render_export(orch: Orchestrator, run: RunRecord) -> None:
    if run.kind is JobKind.EXPORT:  # the export job's own page: its artifacts and verify results
        st.subheader("Artifacts")
        _job(orch, run)
        return
    if run.kind is not JobKind.TRAIN:
        return
    st.subheader("Export")
    if not RunStatus(run.status).is_terminal():
        st.caption("Export the model once the run has ended (a checkpoint can be exported then too).")
    elif allowed(current_actor(), Action.START):
        _form(orch, run)
    for job in orch.export_jobs(run.id):
        _job(orch, job)


def _form(orch: Orchestrator, run: RunRecord) -> None:
    with st.expander("New export", icon="📦"):
        steps = model_source.checkpoint_steps(run.id)
        choice = st.selectbox("Model", ["final", *steps], key=f"export_source_{run.id}",
                              format_func=lambda s: "Final model" if s == "final" else f"Checkpoint at step {s}")
        targets = st.multiselect("Targets", TARGETS, default=default_targets(orch.run_config(run.id)),
                                 format_func=TARGET_LABELS.get,
                                 key=f"export_targets_{run.id}")
        quants = st.multiselect("GGUF types", tools.available_types(), default=["q8_0"], help=quant_help(),
                                key=f"export_quants_{run.id}", disabled="gguf" not in targets)
        st.caption(quant_help())
        if "gguf" in targets and tools.converter_script() is None:
            st.warning(safe(tools.missing_converter_message()), icon="⚠️")
        cols = st.columns(3)
        dtype = cols[0].selectbox("Merged dtype", MERGED_DTYPES, key=f"export_dtype_{run.id}")
        verify = cols[1].checkbox("Verify after export", value=True, key=f"export_verify_{run.id}",
                                  help="Reload the merged model and the GGUF and replay a prompt set greedily next "
                                       "to the unmerged adapter.")
        prompt_set = cols[2].selectbox("Prompt set", promptsets.names(), key=f"export_prompts_{run.id}",
                                       disabled=not verify)
        repo = st.text_input("Push to the Hugging Face hub (repo id, optional)", key=f"export_repo_{run.id}",
                             placeholder="your-name/model-name", help="The token comes from HF_TOKEN in the "
                                                                     "dashboard's environment.")
        hub_cols = st.columns(2)
        private = hub_cols[0].checkbox("Private repo", value=True, key=f"export_private_{run.id}", disabled=not repo,
                                       help="For a repo the push creates; an existing repo keeps its visibility.")
        admin = current_actor().role is Role.ADMIN
        update = hub_cols[1].checkbox(
            "Update an existing repo", value=False, key=f"export_update_{run.id}", disabled=not repo,
            help="Without it, a repo id that already exists on the hub is refused. With it, the push goes into an "
                 "existing repo " + ("(as an admin: any repo the token can write)." if admin else
                                     "only if Finetune Studio created it (its model card says so)."))
        launcher, gpus = job_place(f"export_launcher_{run.id}", "export",
                                   "; the artifacts land in the job folder there")
        if not st.button("Start export", icon="📦", key=f"export_start_{run.id}"):
            return
        source = model_source.ModelSource(run_id=run.id, checkpoint=None if choice == "final" else choice)
        spec = ExportSpec(source=source,
                          targets=targets, quantizations=quants, merged_dtype=dtype, verify=verify,
                          prompt_set=prompt_set or "quick-check", push_repo_id=repo.strip(), push_private=private,
                          push_update=update and bool(repo.strip()),
                          push_update_any=update and admin and bool(repo.strip()), launcher=launcher, ray_gpus_per_worker=gpus)
        try:
            job_id = orch.submit(spec, actor=current_actor())
        except ConfigError as exc:
            for error in exc.errors:
                st.error(f"{safe(error.field)}: {safe(shown(error.message))}")
            return
        except RunRefused as exc:
            st.warning(safe(exc), icon="⏳")
            return
        job = orch.get_run(job_id)
        if job is not None and job.status == RunStatus.QUEUED.value:  # its devices are busy: say so, not "started"
            st.success(f"Export job {safe(job_id)} queued: it starts by itself when the jobs before it end; it is "
                       "listed below.", icon="⏳")
        else:
            st.success(f"Export job {safe(job_id)} started; it is listed below.", icon="📦")


def _title(job: RunRecord) -> str:
    status = RunStatus(job.status)
    return f"{status.icon} {job.name} · {job.dataset} · {JobKind.EXPORT.status_label(status)}"


def _job(orch: Orchestrator, job: RunRecord) -> None:
    status = RunStatus(job.status)
    title = _title(job)
    with st.container(border=True):
        st.markdown(safe(title))
        if not status.is_terminal():
            st.progress(job.steps_done / job.total_steps if job.total_steps else 0.0,
                        text=safe(f"{job.phase or 'waiting'} ({job.steps_done}/{job.total_steps})"))
            if st.button("Refresh", key=f"export_refresh_{job.id}", icon="🔄"):
                st.rerun()
        if status is RunStatus.FAILED and job.error:
            st.error(safe(job.error))
        events = orch.events(job.id)
        for event in events:
            if event.kind == "verify":
                st.markdown(("⚠️ " if "first difference" in event.message else "✅ ") + safe(event.message))
        artifacts = orch.artifacts(job_id=job.id)
        if not artifacts:
            return
        st.dataframe(artifact_table(artifacts), hide_index=True,
                     column_config={"sha256": st.column_config.TextColumn("sha256", width="medium")})
        command = llama_cpp_command(artifacts)
        if command:
            st.caption("A vision model's GGUF runs with its mmproj projector in llama.cpp (llama-server, or "
                       "llama-mtmd-cli with --image); Ollama gets no Modelfile for the pair:")
            st.code(command, language="bash")
        job_dir, roots = paths.run_dir(job.id), jobspec.export_roots(paths.run_dir(job.id))
        for artifact in artifacts:
            try:  # checked again here: a row from an older database, or a file turned into a symlink since
                path = paths.inside_run(job_dir, artifact.path, roots)
            except paths.UnsafePathError:
                st.caption(f"{code(Path(artifact.path).name)}: not offered, its path lies outside the job's folder.")
                continue
            if path.is_file() and artifact.size <= DOWNLOAD_MAX_BYTES:
                st.download_button(f"Download {path.name}", data=lambda p=path: p.read_bytes(), file_name=path.name,
                                   key=f"export_dl_{job.id}_{path.name}", icon="⬇️")
            elif path.exists():
                st.caption(f"{code(path.name)} ({size_text(artifact.size)}) is at {code(str(path))}; copy it with:")
                st.code(copy_command(str(path)), language="bash")
            else:
                st.caption(f"{code(path.name)}: the file is gone from {code(str(path))}.")
