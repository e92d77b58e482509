"""Run details' Serve tab: serve a run's model (final or a checkpoint) as an OpenAI-compatible endpoint for
teammates, show the base URL, the model name and the API key (once: only its hash is stored), and list the
run's endpoints with Stop. When the server has a Ray cluster, "Where to run" sends the endpoint there (a
single-worker Ray job on a node). A serve job's own page shows where it listens, and on which node. Layout only: the orchestrator and the
serve job do the work (docs/serving.md)."""
from __future__ import annotations

import streamlit as st

from db.entities import RunRecord
from trainer_core.specs import model_source
from trainer_core.auth.access import Action, allowed
from trainer_core.config import ConfigError
from trainer_core.jobs.orchestrator import Orchestrator, RunRefused
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving.spec import (DEFAULT_IDLE_S, DEFAULT_MAX_TOKENS_CAP, DEFAULT_REQUEST_TIMEOUT_S,
                                      MAX_TOKENS_CAP_MAX, REQUEST_TIMEOUT_MAX_S, CLUSTER_PLAIN_HTTP,
                                      plain_http_warning)
from ui import format as fmt
from ui import ray_cluster
from ui.auth import current_actor
from ui.server_paths import shown
from ui.text import code, safe

HOSTS = {"127.0.0.1": "This machine only (127.0.0.1)", "0.0.0.0": "Every interface: teammates can call it (0.0.0.0)"}
RAY_HOSTS = {"127.0.0.1": "The node's cluster address (where the dashboard reaches it)",
             "0.0.0.0": "Every interface of the node (0.0.0.0)"}
NEW_KEYS = "serve_new_keys"  # session state: job id -> API key, until the user says it is copied


def render_serve(orch: Orchestrator, run: RunRecord) -> None:
    if run.kind is JobKind.SERVE:
        _job(orch, run)
        return
    if run.kind is not JobKind.TRAIN:
        return
    st.subheader("Serve")
    st.caption("An OpenAI-compatible endpoint for this run's model, for teammates' own tools (curl, the openai "
               "client, ...). It runs as a serve job: it waits for its device like a run, and stops on request or "
               "when idle.")
    if not RunStatus(run.status).is_terminal():
        st.caption("Serve the model once the run has ended.")
    elif allowed(current_actor(), Action.START):
        _form(orch, run)
    for job in orch.endpoint_jobs(run.id):
        _job(orch, job)


def _form(orch: Orchestrator, run: RunRecord) -> None:
    with st.expander("New endpoint", icon="🔌"):
        steps = model_source.checkpoint_steps(run.id)
        choice = st.selectbox("Model", ["final", *reversed(steps)], key=f"serve_source_{run.id}",
                              format_func=lambda s: "Final model" if s == "final" else f"Checkpoint at step {s}")
        place, gpus = _where_to_run(run.id)
        host_col, port_col, idle_col = st.columns([3, 1, 1])
        hosts = RAY_HOSTS if place == "ray" else HOSTS  # each list its own widget: a choice means one place
        host = host_col.selectbox("Listen on", list(hosts), format_func=hosts.get,
                                  key=f"serve_host_{'ray_' * (place == 'ray')}{run.id}")
        port = port_col.number_input("Port", min_value=0, max_value=65535, value=0, step=1, key=f"serve_port_{run.id}",
                                     help="0 picks a free port.")
        idle = idle_col.number_input("Idle stop (min)", min_value=0, max_value=7 * 24 * 60, value=DEFAULT_IDLE_S // 60,
                                     step=5, key=f"serve_idle_{run.id}", help="Stop after this long without a "
                                                                              "request; 0 never stops by itself.")
        cap_col, timeout_col = st.columns(2)
        cap = cap_col.number_input("Longest answer (tokens)", min_value=1, max_value=MAX_TOKENS_CAP_MAX,
                                   value=DEFAULT_MAX_TOKENS_CAP, step=256, key=f"serve_cap_{run.id}",
                                   help="A request asking for more max_tokens gets this many at most.")
        timeout = timeout_col.number_input("Request timeout (s)", min_value=0, max_value=REQUEST_TIMEOUT_MAX_S,
                                           value=DEFAULT_REQUEST_TIMEOUT_S, step=30, key=f"serve_timeout_{run.id}",
                                           help="A request still running after this long is ended (0: never). A "
                                                "client that disconnects always ends its request.")
        cert_col, key_col = st.columns(2)
        cert = cert_col.text_input("TLS certificate (PEM file, optional)", key=f"serve_cert_{run.id}",
                                   help="With its key: the endpoint speaks HTTPS. The file must be under the data "
                                        "root or an allowed folder.")
        tls_key = key_col.text_input("TLS private key (PEM file)", key=f"serve_tls_key_{run.id}")
        keep = st.checkbox("Keep completions for ratings", key=f"serve_store_{run.id}",
                           help="Each chat completion is kept in the job folder, so the app using the endpoint can "
                                "rate it (POST /v1/feedback with the key): the ratings become votes on the Feedback "
                                "page. Off: nothing is kept.")
        warning = "" if cert.strip() else CLUSTER_PLAIN_HTTP if place == "ray" else plain_http_warning(host)
        if warning:
            st.warning(safe(warning), icon="🔓")
        if not st.button("Start endpoint", icon="🔌", key=f"serve_start_{run.id}"):
            return
        source = model_source.ModelSource(run_id=run.id, checkpoint=None if choice == "final" else int(choice))
        try:
            job_id, key = orch.start_server([source], actor=current_actor(), purpose="endpoint", host=host,
                                            port=int(port), idle_timeout_s=int(idle) * 60, max_tokens_cap=int(cap),
                                            request_timeout_s=int(timeout), tls_certfile=cert.strip(),
                                            tls_keyfile=tls_key.strip(), launcher=place,
                                            ray_gpus_per_worker=gpus, store_completions=keep)
        except ConfigError as exc:
            for error in exc.errors:
                st.error(f"{safe(error.field)}: {safe(shown(error.message))}")
            return
        except RunRefused as exc:
            st.warning(safe(exc), icon="🚫")
            return
        st.session_state.setdefault(NEW_KEYS, {})[job_id] = key  # shown until dismissed; never stored
        st.rerun()


def _where_to_run(run_id: str) -> tuple[str, float]:
    """("local" or "ray", the GPUs the server asks Ray for): the cluster is offered only when the server has one,
    with its size (asked at most every 15 s)."""
    addresses = ray_jobs.server_addresses()
    if not addresses:
        return "local", 0.0
    place = st.radio("Where to run", list(ray_cluster.PLACES), format_func=ray_cluster.PLACES.get, horizontal=True,
                     key=f"serve_place_{run_id}", help="The Ray cluster: a single-worker Ray job on the server's "
                                                      "cluster, on a node Ray picks, behind the same API key.")
    if place == "ray":
        info = ray_cluster.cached_cluster_info(ray_cluster.own_and_other_addresses(addresses)[0] or addresses[0])
        if info.problem:
            st.warning(f"The Ray cluster does not answer: {safe(info.problem)}", icon="🛰️")
        else:
            st.caption(f"Ray cluster: {ray_cluster.capacity_line(info)}. The job takes one CPU of a node.")
        gpus = st.number_input("GPUs on the node (0: it serves on the node's CPU)", min_value=0.0, max_value=64.0,
                               value=0.0, step=1.0, key=f"serve_gpus_{run_id}",
                               help="ray_gpus_per_worker: Ray places the server on a node with this many free GPUs.")
        return place, float(gpus)
    return place, 0.0


def _job(orch: Orchestrator, job: RunRecord) -> None:
    status = RunStatus(job.status)
    with st.container(border=True):
        st.markdown(f"{status.icon} **{safe(job.name)}** · {safe(JobKind.SERVE.status_label(status))}"
                    + (f" · {safe(job.phase)}" if job.phase and not status.is_terminal() else ""))
        endpoint = orch.endpoint(job.id)
        if endpoint is not None:
            st.markdown(f"Base URL {code(endpoint.share_url)} · model "
                        + ", ".join(code(m.name) for m in endpoint.models) + f" · engine {safe(endpoint.engine)}"
                        + (" · route " + code("POST /v1/embeddings") if endpoint.engine == "infinity" else "")
                        + (f" · Ray node {code(endpoint.node)}" if endpoint.node else ""))
        elif status is RunStatus.QUEUED:
            st.caption("Waiting for its device: a run or another job holds it.")
        elif not status.is_terminal():
            st.caption("Loading the model; the URL appears when it answers.")
        if status is RunStatus.FAILED and job.error:
            st.error(safe(job.error))
        key = st.session_state.get(NEW_KEYS, {}).get(job.id)
        if key and not status.is_terminal():
            st.warning("The API key, shown this once (only its hash is stored). Send it as "
                       "`Authorization: Bearer <key>`; requests without it get 401.", icon="🔑")
            st.code(key, language=None)
            if st.button("I have copied the key", key=f"serve_key_done_{job.id}"):
                st.session_state[NEW_KEYS].pop(job.id, None)
                st.rerun()
        if not status.is_terminal():
            may_stop = allowed(current_actor(), Action.STOP, job.owner)
            if st.button("Stop endpoint", icon="🛑", key=f"serve_stop_{job.id}", disabled=not may_stop):
                try:
                    orch.stop(job.id, actor=current_actor())
                except RunRefused as exc:
                    st.warning(safe(exc), icon="🚫")
                else:
                    st.session_state.get(NEW_KEYS, {}).pop(job.id, None)
                    st.rerun()
        elif job.finished_at:
            st.caption(f"Ended {fmt.ago(job.finished_at)}.")
