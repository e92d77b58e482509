"""The Playground's text-to-speech mode (issue 22): type a sentence, and a tts run's base model and its tuned
versions (final model, checkpoints) speak it side by side with the same seed: play each clip, see whether the model
ended it on its own or talked to the length cap, download the WAV. The speaking runs in a child process
(trainer_core/tryout/speak.py); ``render`` lays the mode out."""
from __future__ import annotations

from typing import Any

import streamlit as st

from db.entities import RunRecord
from trainer_core.tryout import speak
from trainer_core.specs.model_source import ModelSource, SourceError
from trainer_core.methods import tts
from ui import playground as pg
from ui.text import safe

K = "pgt_"
RESULTS = K + "results"


def sources_of(run_id: str, picked: list) -> list[ModelSource]:
    """The picked versions of a run as model sources: "base" is the model it was trained from."""
    return [pg.base_source(run_id) if v == "base" else ModelSource(run_id=run_id, checkpoint=v) for v in picked]


def ending(spoken: speak.Spoken, cap: float) -> str:
    """The caption under a clip: its length, and whether the model stopped by itself."""
    how = "ended on its own" if spoken.ended else f"talked to the {cap:g} s cap"
    return f"{spoken.seconds:.2f} s · {how}"


def render(orch: Any, actor: Any, may_start: bool, runs: list[RunRecord], labels: dict[str, str]) -> None:
    """The text-to-speech mode; ``runs``: the finished tts runs (playground.offered_runs(..., SPEAK))."""
    if not runs:
        st.info("No text-to-speech run yet: train a Sesame CSM model with method tts (docs/methods.md), then hear "
                "it and its base model speak here.", icon="🔊")
        return
    if not may_start:
        st.info("Viewers cannot make models speak: it loads the models in a process on the host.", icon="👀")
        return
    offered = {r.id: r for r in runs}
    run_id = st.selectbox("Run", list(offered), key=K + "run", format_func=lambda r: labels[r])
    try:
        voice = speak.run_voice(run_id)
    except SourceError as exc:
        st.error(safe(exc), icon="🚫")
        return
    versions = ["base", *pg.versions(run_id)]
    picked = st.multiselect("Models", versions, default=versions[:2], key=K + f"versions_{run_id}",
                            max_selections=speak.MODELS_MAX,
                            format_func=lambda v: "its base model" if v == "base" else pg.version_label(v))
    text = st.text_area("Text to speak", key=K + "text", max_chars=speak.TEXT_MAX, placeholder="Open the door.")
    speaker = st.number_input("Speaker", min_value=0, max_value=tts.MAX_SPEAKER, value=voice.speaker, step=1,
                              key=K + f"speaker_{run_id}", help="CSM's speaker id, written as [id] before the text "
                                                                "(the run's tts.speaker by default)")
    st.caption(f"Each model speaks for at most {voice.max_seconds:g} s (the run's tts.max_sample_s), with the same "
               "seed.")
    if st.button("Speak", icon="🔊", type="primary", key=K + "go", disabled=not picked):
        try:
            request = speak.Request(sources=tuple(sources_of(run_id, picked)), text=text, speaker=int(speaker),
                                    max_seconds=voice.max_seconds)
            with st.spinner("Speaking…"):
                st.session_state[RESULTS] = (text, voice.max_seconds, speak.speak(request))
        except speak.SpeakError as exc:
            for error in exc.errors:
                st.error(f"**{safe(error.field)}**: {safe(error.message)}", icon="🚫")
            return
        except SourceError as exc:
            st.error(safe(exc), icon="🚫")
            return
    found = st.session_state.get(RESULTS)
    if not found:
        return
    spoken_text, cap, results = found
    for i, (col, spoken) in enumerate(zip(st.columns(len(results)), results)):
        with col:
            st.markdown(f"**{safe(spoken.label)}**")
            if spoken.error:
                st.error(safe(spoken.error), icon="🛑")
                continue
            st.audio(spoken.wav, format="audio/wav")
            st.caption(ending(spoken, cap))
            st.download_button("Download WAV", spoken.wav, file_name=speak.wav_name(spoken.label, spoken_text),
                               mime="audio/wav", icon="⬇️", key=f"{K}download_{i}")
