"""Data: make a dataset inside the studio. A recipe (NVIDIA NeMo Data Designer's config, from a starter) seeded from
your documents or a dataset, answered by a model this studio serves or an external endpoint; a preview of a few rows
with their source, verdict and scores and an estimate for the full job; recipe jobs live (Stop keeps what they made,
Resume continues); the datasets recipes published, with their cards, rows, set-aside rows and the runs trained on
them (docs/data-recipes.md)."""
from __future__ import annotations

import streamlit as st

from trainer_core.config import ConfigError
from trainer_core.evaluation import endpoint
from trainer_core.jobs.refusals import RunRefused
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.recipes import launch, starters, store
from ui import data_recipes as dr
from ui import format as fmt
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.state import get_orchestrator
from ui.text import code, safe

require_entrypoint("pages/data.py")

K = "data_"
REFRESH_S = 2.0
orch = get_orchestrator()
actor = current_actor()
st.title("Data")
new_tab, jobs_tab, datasets_tab = st.tabs(["New recipe", "Recipe jobs", "Datasets"])


def _starter_changed() -> None:
    st.session_state[K + "yaml"] = dr.starter_yaml(st.session_state[K + "starter"])
    fields = starters.spec_fields(st.session_state[K + "starter"])
    st.session_state[K + "name"] = fields.get("dataset_name", "")
    st.session_state[K + "rows"] = int(fields.get("num_rows", 50))


def _form_fields() -> dict:
    state = st.session_state
    source = state[K + "seed_kind"]
    if state[K + "teacher_kind"] == "studio":
        models = [{"alias": "teacher", "source": state[K + "teacher"], "max_parallel_requests": 4}]
    else:
        models = [{"alias": "teacher", "url": state[K + "url"].strip(), "model": state[K + "model"].strip(),
                   "key_env": state.get(K + "key_env") or "", "max_parallel_requests": int(state[K + "parallel"])}]
    starter_models = starters.spec_fields(state[K + "starter"]).get("models") or []
    models += [m for m in starter_models if m.get("alias") != "teacher"]  # e.g. the pairs' base model
    return {"dataset_name": state[K + "name"].strip(), "num_rows": int(state[K + "rows"]),
            "batch_size": int(state[K + "batch"]), "documents": state[K + "path"].strip() if source == "documents" else "",
            "seed_dataset": state[K + "path"].strip() if source == "dataset" else "", "models": models,
            "seed_hub_dataset": state[K + "path"].strip() if source == "hub" else "",
            "dedupe": bool(state[K + "dedupe"]), "near_duplicate": float(state[K + "near"]),
            "judge_min": float(state[K + "judge_min"])}


def _spec():
    state = st.session_state
    fields, problem = dr.spec_fields(state[K + "starter"], state[K + "yaml"], _form_fields())
    if problem:
        st.error(safe(problem), icon="🚫")
        return None
    try:
        spec = launch.from_fields(fields)
    except ConfigError as exc:
        st.error(safe("; ".join(f"{e.field}: {e.message}" for e in exc.errors)), icon="🚫")
        return None
    errors = spec.validate()
    if errors:
        for error in errors[:8]:
            st.error(safe(f"{error.field}: {error.message}"), icon="🚫")
        return None
    return spec


with new_tab:
    names = starters.names()
    if K + "starter" not in st.session_state:
        st.session_state[K + "starter"] = names[0]
        _starter_changed()
    st.selectbox("Starter recipe", names, key=K + "starter", on_change=_starter_changed,
                 format_func=lambda n: starters.get(n).label)
    chosen = starters.get(st.session_state[K + "starter"])
    st.caption(safe(f"{chosen.description} Needs: {chosen.needs}."))
    seed_cols = st.columns([1, 3])
    seed_cols[0].radio("Seed rows from", ["documents", "dataset", "hub", "none"], key=K + "seed_kind",
                       format_func={"documents": "Documents", "dataset": "A dataset file", "hub": "A hub dataset",
                                    "none": "Samplers only"}.get)
    seed_cols[1].text_input("Folder or file under the allowed roots, or a hub dataset id (org/name)", key=K + "path",
                            placeholder=str(paths.data_root() / "docs"),
                            help="Documents: PDF, DOCX, HTML, Markdown or text, chunked with overlap; each row keeps "
                                 "its file, page and chunk. A dataset: JSONL, JSON, CSV or Parquet rows.")
    teach_cols = st.columns([1, 3])
    teach_cols[0].radio("Teacher", ["studio", "external"], key=K + "teacher_kind",
                        format_func={"studio": "A model this studio serves", "external": "External endpoint"}.get)
    if st.session_state[K + "teacher_kind"] == "studio":
        finished = [r for r in orch.store.list_runs(limit=200, kinds=[JobKind.TRAIN.value])
                    if r.status in (RunStatus.COMPLETED, RunStatus.STOPPED)]
        choices = dr.teacher_choices(finished)
        teach_cols[1].selectbox("Model", list(choices), format_func=choices.get, key=K + "teacher",
                                help="Served by a serve job the recipe starts (or reuses); it idles out after.")
    else:
        ext = teach_cols[1].columns([3, 2, 2, 1])
        ext[0].text_input("Base URL", key=K + "url", placeholder="https://api.example.com/v1")
        ext[1].text_input("Model", key=K + "model")
        ext[2].selectbox("Key (a variable the admin declared)", [""] + endpoint.declared_key_envs(), key=K + "key_env",
                         format_func=lambda n: n or "none")
        ext[3].number_input("Parallel", min_value=1, max_value=64, value=4, key=K + "parallel")
    size = st.columns(5)
    size[0].text_input("Dataset name", key=K + "name", help="Published as datasets/recipes/NAME/vN/")
    size[1].number_input("Records", min_value=1, max_value=100_000, key=K + "rows")
    size[2].number_input("Batch", min_value=1, max_value=1000, value=10, key=K + "batch",
                         help="Records per batch: progress, Stop and Resume go batch by batch")
    size[3].number_input("Near-duplicate at", min_value=0.05, max_value=1.0, value=0.85, step=0.05, key=K + "near")
    size[4].number_input("Lowest judge score", min_value=0.0, max_value=100.0, value=0.0, key=K + "judge_min")
    st.checkbox("Remove duplicates (exact and near, MinHash)", value=True, key=K + "dedupe")
    with st.expander("Recipe (YAML): Data Designer's config, validators, the training row"):
        st.text_area("Recipe", key=K + "yaml", height=360, label_visibility="collapsed")
    preview_col, rows_col, start_col = st.columns([1, 1, 1], vertical_alignment="bottom")
    shown_rows = rows_col.number_input("Preview records", min_value=1, max_value=launch.PREVIEW_ROWS_MAX, value=5)
    if preview_col.button("Preview", help="A few records generated and checked as the job would, with an estimate"):
        spec = _spec()
        if spec is not None:
            with st.spinner("Serving the teacher and generating a few records…"):
                try:
                    st.session_state[K + "preview"] = launch.preview(orch, spec, actor, rows=int(shown_rows))
                except (launch.PreviewError, RunRefused, ConfigError) as exc:
                    st.session_state.pop(K + "preview", None)
                    st.error(safe(f"Preview failed: {exc}"), icon="🚫")
    if start_col.button("Generate", type="primary"):
        spec = _spec()
        if spec is not None:
            try:
                job_id = launch.start(orch, spec, actor)
                st.success(f"Recipe job {code(job_id)} started: follow it under Recipe jobs.")
            except (RunRefused, ConfigError) as exc:
                st.error(safe(str(exc)), icon="🚫")
    result = st.session_state.get(K + "preview")
    if result:
        estimate = result["estimate"]
        st.caption(safe(f"{result['made']}/{result['asked']} records in {result['elapsed_s']:.1f} s, "
                        f"{result['tokens_in'] + result['tokens_out']:,} tokens. The full job "
                        f"({estimate['rows']:,} records): about {fmt.duration(estimate['seconds'])} and "
                        f"{int(estimate['tokens']):,} tokens; {estimate['kept_share']:.0%} kept at this rate."))
        st.dataframe(dr.preview_frame(result), hide_index=True, use_container_width=True)
        for warning in result.get("warnings", []) + result.get("teacher_problems", []):
            st.warning(safe(warning))

with jobs_tab:
    @st.fragment(run_every=REFRESH_S)
    def jobs_view() -> None:
        jobs = dr.recipe_jobs(orch.store)
        if not jobs:
            st.info("No recipe job yet: start one under New recipe, or `python -m trainer_core data generate`.")
            return
        for run in jobs:
            with st.container(border=True):
                head, buttons = st.columns([4, 2])
                pace = "" if run.status.is_terminal() else dr.rate_text(orch.snapshot(run.id))
                head.markdown(f"**{safe(run.name or run.id, limit=80)}** · {fmt.status_badge(run.status, JobKind.RECIPE)} · "
                              f"{safe(run.dataset, limit=80)}  \n{safe(dr.progress_text(run))}"
                              + (f" · {safe(pace)}" if pace else ""))
                used = dr.usage(run)
                if used:
                    head.caption(safe(f"teacher tokens: {used.get('tokens_in', 0):,} in, {used.get('tokens_out', 0):,} "
                                      f"out; failed requests: {used.get('requests_failed', 0)}"
                                      + (f" · {run.error}" if run.error else "")))
                elif run.error:
                    head.caption(safe(run.error, limit=600))
                if not run.status.is_terminal():
                    if buttons.button("Stop", key=f"{K}stop_{run.id}", help="Publishes the rows kept so far"):
                        orch.stop(run.id, actor=actor)
                    if buttons.button("Cancel", key=f"{K}cancel_{run.id}", help="Publishes nothing"):
                        orch.cancel(run.id, actor=actor)
                elif run.status is not RunStatus.COMPLETED and buttons.button(
                        "Resume", key=f"{K}resume_{run.id}", help="Continues where it ended: no row lost or doubled"):
                    try:
                        new_id = launch.resume(orch, run.id, actor)
                        st.success(f"Recipe job {code(new_id)} continues it.")
                    except (RunRefused, ConfigError) as exc:
                        st.error(safe(str(exc)), icon="🚫")
    jobs_view()

with datasets_tab:
    versions = store.published()
    if not versions:
        st.info("No dataset made by a recipe yet.")
    else:
        st.dataframe(dr.datasets_frame(versions), hide_index=True, use_container_width=True)
        picked = st.selectbox("Dataset", range(len(versions)),
                              format_func=lambda i: f"{versions[i].name}@v{versions[i].version}", key=K + "dataset")
        version = versions[picked]
        st.markdown(safe((version.folder / store.README_FILE).read_text() if (version.folder / store.README_FILE)
                         .is_file() else ""))
        st.caption(f"Train on it: New run → Dataset source 'Made by a recipe', or the path {code(version.ref)}")
        trained = dr.runs_trained_on(orch.store, version)
        st.markdown("**Runs trained on it:** " + (", ".join(f"{safe(r.name or r.id)} ({code(r.id)})" for r in trained)
                                                  or "none yet"))
        kept_tab, aside_tab = st.tabs(["Rows", "Set aside"])
        kept_tab.dataframe(dr.rows_frame(version.data_path), hide_index=True, use_container_width=True)
        aside_tab.dataframe(dr.rows_frame(version.folder / store.REJECTED_FILE), hide_index=True,
                            use_container_width=True)
