"""The New run page's speech panel (issue 22): for a dataset of clips, a player for the first ones with their
transcript and duration, and a histogram of every clip's duration against the longest clip trained on (a speech-to-
text model's window; a text-to-speech run's tts.max_clip_s): clips past it are left out of training, counted.
Dashboard side: clip headers only (soundfile), paths resolved and checked by the data loader (only where user data
lives) before a clip is read. A player gets the clip as decoded and written again (data.audio.playable_wav), never a
path or the file's own bytes; a clip that does not decode gets none."""
from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

from trainer_core.data import DatasetError
from trainer_core.data import audio as audio_data
from ui.text import safe

PLAYERS = 3  # clips with a player under the dataset picker
HISTOGRAM_MAX = 5_000  # clips whose durations are read for the histogram (headers only)


def clip_rows(rows: list[dict], folder: Path, mapping: dict[str, str] | None) -> tuple[list[dict], str]:
    """Up to HISTOGRAM_MAX rows as {row, audio, text, seconds} (row: its index in the file) with their clips resolved
    and checked ([] when the rows hold no audio); or a problem (a URL, a path outside the allowed roots) as the loader
    words it."""
    sample = rows[:HISTOGRAM_MAX]
    if audio_data.audio_column(sample, mapping) is None or audio_data.text_column(sample, mapping) is None:
        return [], ""
    try:
        resolved = audio_data.resolve_rows(sample, folder, "local_datasets", mapping)
    except DatasetError as exc:
        return [], exc.message
    column, text = audio_data.audio_column(resolved, mapping), audio_data.text_column(resolved, mapping)
    out = []
    for index, row in enumerate(resolved):
        clip = row.get(column) if isinstance(row, dict) else None
        if clip in (None, "", b""):
            continue
        try:
            seconds = audio_data.duration_s(clip)
        except ValueError:
            seconds = None  # unreadable: the data check counts it
        out.append({"row": index, "audio": clip, "text": str(row.get(text) or ""), "seconds": seconds})
    return out, ""


@st.cache_data(max_entries=64, show_spinner=False)
def _player_wav(path: str, stamp: tuple[int, int]) -> bytes | None:
    """A clip file's player bytes, or None when it does not decode. ``stamp`` (mtime, size): an edited file is
    decoded again."""
    return _wav_or_none(path)


def _wav_or_none(clip) -> bytes | None:
    try:
        return audio_data.playable_wav(clip)
    except ValueError:
        return None


def player_wav(clip) -> bytes | None:
    """What a player plays: the decoded clip as WAV (cached per file), or None when it does not decode."""
    if isinstance(clip, str):
        try:
            stat = Path(clip).stat()
        except OSError:
            return None
        return _player_wav(clip, (stat.st_mtime_ns, stat.st_size))
    return _wav_or_none(clip)


def clip_limit(config) -> float:
    """The longest clip the run trains on: tts.max_clip_s for text-to-speech, the model's window for speech-to-text."""
    if config.method == "tts":
        return config.method_settings.max_clip_s  # a TtsSettings
    return audio_data.window_of(config.model_name)


def duration_chart(seconds: list[float], window_s: float) -> alt.LayerChart:
    """Clips per duration bin, with the model's window as a rule: what is right of it is left out."""
    frame = pd.DataFrame({"seconds": seconds})
    bars = alt.Chart(frame).mark_bar().encode(
        x=alt.X("seconds:Q", bin=alt.Bin(maxbins=30), title="clip duration (s)"),
        y=alt.Y("count():Q", title="clips"))
    rule = alt.Chart(pd.DataFrame({"window": [window_s]})).mark_rule(color="red", strokeDash=[4, 4]).encode(
        x="window:Q", tooltip=[alt.Tooltip("window:Q", title="model window (s)")])
    return alt.layer(bars, rule).properties(height=180)


def clips_panel(rows: list[dict], source: Path | None, mapping: dict[str, str] | None, window_s: float) -> None:
    """Players for the first clips of ``source`` (the first dataset file) and the duration histogram."""
    if source is None:
        return
    clips, problem = clip_rows(rows, source if source.is_dir() else source.parent, mapping)
    if problem:
        st.warning(f"**local_datasets**: {safe(problem)}")
        return
    if not clips:
        return
    readable = [c["seconds"] for c in clips if c["seconds"] is not None]
    over = sum(s > window_s for s in readable)
    st.markdown(f"**Clips** ({len(clips):,} in the first file{' read' if len(rows) > HISTOGRAM_MAX else ''}: "
                f"{sum(readable):.1f} s of speech)")
    tried = [c for c in clips if c["seconds"] is not None][:PLAYERS * 2]  # a clip that does not decode gets none
    players = [(clip, wav) for clip, wav in ((c, player_wav(c["audio"])) for c in tried) if wav is not None][:PLAYERS]
    for column, (clip, wav) in zip(st.columns(len(players)) if players else [], players):
        column.audio(wav, format="audio/wav")
        column.caption(f"{clip['seconds']:.1f} s · {safe(clip['text'][:80])}")
    if readable:
        st.altair_chart(duration_chart(readable, window_s), width="stretch")
    if over:
        st.warning(f"{over:,} clip(s) are longer than {window_s:g} s (the longest clip trained on) and will be left "
                   f"out: {audio_data.too_long_reason(window_s)}.")
    unreadable = [c["row"] for c in clips if c["seconds"] is None]
    if unreadable:
        rows_named = ", ".join(f"row {r}" for r in unreadable[:5]) + (" and more" if len(unreadable) > 5 else "")
        st.warning(f"{len(unreadable):,} clip(s) cannot be read (not WAV/FLAC/OGG/MP3 files soundfile decodes) and "
                   f"will be left out: {rows_named}. Replace them with clips that play, or remove the rows.")
