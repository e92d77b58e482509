"""The Playground's speech mode (issue 22): record or upload a clip, and up to three speech-to-text models (a
Whisper base, a run's final model, its checkpoints) transcribe it side by side.

The models are served like the chat mode's (a serve job started through the orchestrator; transformers serve's
``/v1/audio/transcriptions`` behind the key gate), so a clip reaches a model the same way a teammate's client
would send it. ``render`` lays the mode out; the rest is logic without Streamlit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import streamlit as st

from db.entities import RunRecord
from trainer_core.specs import model_source
from trainer_core.config import ConfigError
from trainer_core.specs.model_source import ModelSource, SourceError
from trainer_core.serving.client import ServeError, transcribe
from trainer_core.serving.gate import MAX_AUDIO_BYTES
from ui import playground as pg
from ui.playground_server import server_panel
from ui.text import safe

K = "pgs_"
SERVER, RESULTS = K + "server", K + "results"
CLIP_TYPES = ("wav", "flac", "ogg", "mp3")


# ====================================================================== logic
def clip_problem(clip: bytes | None) -> str | None:
    """Why this clip cannot be sent (None when it can)."""
    if not clip:
        return "Record a clip or upload an audio file first."
    if len(clip) > MAX_AUDIO_BYTES:
        return (f"The clip is {len(clip) / 1e6:.1f} MB; the server takes at most {MAX_AUDIO_BYTES / 1e6:.0f} MB: "
                "send a shorter clip (Whisper hears 30 s at a time).")
    return None


@dataclass(frozen=True)
class Result:
    label: str
    text: str = ""
    seconds: float = 0.0
    error: str = ""


def transcribe_all(url: str, key: str, columns: list[pg.Column], clip: bytes, filename: str) -> list[Result]:
    """Each loaded model's transcript of ``clip``, in column order; a model that fails says why in its column."""
    results = []
    for column in columns:
        try:
            found = transcribe(url, key, column.model, clip, filename=filename)
        except ServeError as exc:
            results.append(Result(column.label, error=str(exc)))
            continue
        results.append(Result(column.label, found.text, found.seconds))
    return results


# ====================================================================== layout
def _picker(i: int, runs: dict[str, RunRecord], labels: dict[str, str]) -> ModelSource | None:
    if not runs:
        return None
    run_id = st.selectbox("Run", list(runs), key=f"{K}run_{i}", format_func=lambda r: labels[r])
    choices = ["base", *pg.versions(run_id)]
    picked = st.selectbox("Version", choices, key=f"{K}version_{i}", index=0 if i == 0 else 1,
                          format_func=lambda v: "its base model" if v == "base" else pg.version_label(v))
    if picked == "base":
        try:
            return pg.base_source(run_id)
        except SourceError as exc:
            st.error(safe(exc), icon="🚫")
            return None
    return ModelSource(run_id=run_id, checkpoint=picked)


def render(orch: Any, actor: Any, may_start: bool, runs: list[RunRecord], labels: dict[str, str]) -> None:
    """The speech mode; ``runs``: the finished speech-to-text runs (playground.offered_runs)."""
    offered = {r.id: r for r in runs}
    if not offered:
        st.info("No speech-to-text run yet: train a Whisper model with method stt (docs/speech.md), then "
                "compare its transcripts with its base model's here.", icon="🎙️")
        return
    count = st.radio("Side by side", [1, 2, 3], index=1, key=K + "count", horizontal=True)
    picked = []
    for i, col in enumerate(st.columns(count)):
        with col:
            picked.append(_picker(i, offered, labels))
    columns, problems = pg.check_sources(picked)
    for problem in problems:
        st.error(safe(problem), icon="🚫")

    server = st.session_state.get(SERVER)
    wanted = [c.key for c in columns]
    loaded = [c.key for c in server["columns"]] if server else []
    if st.button("Load models", icon="▶️", type="primary", key=K + "load",
                 disabled=bool(problems) or None in picked or not may_start
                 or (server is not None and wanted == loaded and pg.job_alive(orch, server["job"]))):
        sources = [ModelSource.from_key(c.key) for c in columns]
        try:
            job_id = orch.find_server(sources, actor)
            api_key = orch.server_key(job_id) if job_id else None
            if job_id is None or api_key is None:
                if server and pg.job_alive(orch, server["job"]):
                    orch.stop(server["job"], actor=actor)  # other models are loaded: end that server first
                job_id, api_key = orch.start_server(sources, actor=actor, purpose="playground")
        except ConfigError as exc:
            for error in exc.errors:
                st.error(f"**{safe(error.field)}**: {safe(error.message)}", icon="🚫")
        except (SourceError, model_source.SourceError, RuntimeError) as exc:
            st.error(safe(exc), icon="🚫")
        else:
            server = st.session_state[SERVER] = {"job": job_id, "key": api_key, "columns": columns}
            st.session_state.pop(RESULTS, None)
    if not may_start:
        st.info("Viewers cannot load models (it starts a job on the device).", icon="👀")
        return
    if server is None:
        st.info("Pick the models to compare, then press Load models.", icon="👆")
        return
    if wanted != loaded and not problems:
        st.info("The models picked above are not the ones loaded: press Load models to switch.", icon="🔄")
    state = pg.server_state(orch, server["job"])
    server_panel(orch, server["job"], state.phase)
    if not state.ready:
        return

    recorded = st.audio_input("Record a clip", key=K + "record")
    uploaded = st.file_uploader("…or upload one", type=list(CLIP_TYPES), key=K + "upload")
    source = uploaded if uploaded is not None else recorded
    clip = source.getvalue() if source is not None else None
    filename = getattr(source, "name", "") or "clip.wav"
    if clip:
        st.audio(clip)
    problem = clip_problem(clip)
    if st.button("Transcribe", icon="📝", key=K + "go", disabled=problem is not None):
        models = [pg.Column(c.key, c.label, state.models.get(c.key, "")) for c in server["columns"]]
        missing = [c.label for c in models if not c.model]
        if missing:
            st.error(safe(f"The server does not serve {', '.join(missing)}: press Load models again."), icon="🛑")
            return
        with st.spinner("Transcribing…"):
            st.session_state[RESULTS] = transcribe_all(state.url, server["key"], models, clip, filename)
    elif problem and clip:
        st.warning(safe(problem), icon="⚠️")
    results = st.session_state.get(RESULTS)
    if results:
        for col, result in zip(st.columns(len(results)), results):
            with col:
                st.markdown(f"**{safe(result.label)}**")
                if result.error:
                    st.error(safe(result.error), icon="🛑")
                    continue
                st.text(result.text or "(no words heard)")  # model output: plain text, never markdown
                st.caption(f"{result.seconds:.1f} s")
