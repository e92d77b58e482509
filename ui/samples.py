"""Samples during training on the Live, Run details and Compare pages.

``samples_table`` and ``prompt_table`` are plain functions from sample records to DataFrames (tested without
Streamlit); the renderers draw them with ``st.dataframe``, whose cells are plain text: an answer or a prompt
holding markdown or HTML shows as the characters it is. Tooltips are markdown, so they go through ``safe``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import streamlit as st

from db.entities import RunRecord, SampleRecord
from trainer_core.jobs.alerts import LABELS, SAMPLE_KINDS
from trainer_core.protocol import paths
from ui import format as fmt
from ui.text import safe

TRAJECTORY_STEPS = 3  # sampling steps of a GRPO run with tools whose trajectories are shown (newest first)
AUDIO_STEPS = 3  # sampling steps of a text-to-speech run shown with players (newest first)
CELL_CHARS = 2_000  # an answer cut to this in a table cell (a 1,024-token answer is far longer than a cell)
HEADER_CHARS = 40
EMPTY_ANSWER = "(empty)"


def flag_text(flags: dict) -> str:
    """"⚠️ sample answer loops; ..." for an answer's degenerations; "" when there are none."""
    labels = [LABELS.get(SAMPLE_KINDS.get(kind, ""), kind) for kind in flags]
    return "⚠️ " + "; ".join(labels) if labels else ""


def answer_cell(sample: SampleRecord) -> str:
    text = sample.text if sample.text.strip() else EMPTY_ANSWER
    if len(text) > CELL_CHARS:
        text = text[:CELL_CHARS - 1] + "…"
    warning = flag_text(sample.flags)
    return f"{warning} | {text}" if warning else text


def prompt_label(index: int, prompt: str) -> str:
    """A column header: the prompt's number (unique) and its start."""
    short = " ".join(prompt.split())
    short = short if len(short) <= HEADER_CHARS else short[:HEADER_CHARS - 1] + "…"
    return f"#{index + 1} {short}"


def samples_table(samples: Sequence[SampleRecord]) -> tuple[pd.DataFrame, dict[str, str]]:
    """(step x prompt table, newest step first; {column: full prompt}) of one run's samples."""
    prompts: dict[int, str] = {}
    for sample in samples:
        prompts.setdefault(sample.index, sample.prompt)
    labels = {index: prompt_label(index, prompt) for index, prompt in sorted(prompts.items())}
    rows: dict[int, dict[str, str]] = {}
    for sample in samples:
        rows.setdefault(sample.step, {"step": sample.step})[labels[sample.index]] = answer_cell(sample)
    table = pd.DataFrame([rows[step] for step in sorted(rows, reverse=True)], columns=["step", *labels.values()])
    return table.fillna(""), {labels[i]: prompts[i] for i in labels}


def prompt_table(runs: Sequence[RunRecord], labels: dict[str, str], samples: Sequence[SampleRecord]) -> pd.DataFrame:
    """One row per run: its latest answer to one prompt (runs that never sampled it read "—")."""
    latest: dict[str, SampleRecord] = {}
    for sample in samples:
        if sample.run_id not in latest or sample.step > latest[sample.run_id].step:
            latest[sample.run_id] = sample
    rows = []
    for run in runs:
        sample = latest.get(run.id)
        rows.append({"run": labels.get(run.id, run.id), "step": sample.step if sample else None,
                     "answer": answer_cell(sample) if sample else fmt.MISSING})
    return pd.DataFrame(rows, columns=["run", "step", "answer"])


def trajectory_lines(sample: SampleRecord) -> list[tuple[str, str]]:
    """(label, text) per part of a GRPO rollout with tools: the model's words, each call with its arguments (JSON
    text), each tool's result, in order; the last words are its final answer."""
    lines = []
    for turn in sample.turns:
        if turn.get("role") == "tool":
            lines.append((f"result of {turn.get('name', '')}", str(turn.get("content", ""))))
            continue
        if str(turn.get("content", "")).strip():
            lines.append(("model", str(turn["content"])))
        lines += [(f"call {call.get('name', '')}", str(call.get("arguments", ""))) for call in turn.get("calls") or []]
    return lines


def reward_text(flags: dict) -> str:
    """"correct 1 · length 0.25": a GRPO sample's reward scores by reward name."""
    return " · ".join(f"{key.removeprefix('reward:')} {value}" for key, value in flags.items()
                      if key.startswith("reward:"))


# ---------------------------------------------------------------------- renderers
def render_trajectories(samples: Sequence[SampleRecord], steps_shown: int = TRAJECTORY_STEPS) -> None:
    """A GRPO run with tools: per sampling step (newest first), each sampled rollout's calls, results, final answer
    and rewards. Labels are escaped markdown; the texts are code blocks, shown as the characters they are."""
    with_turns = [s for s in samples if s.turns]
    steps = sorted({s.step for s in with_turns}, reverse=True)
    st.markdown("**Trajectories** (rollouts with tool calls)")
    for step in steps[:steps_shown]:
        for sample in sorted((s for s in with_turns if s.step == step), key=lambda s: s.index):
            calls = sum(len(turn.get("calls") or []) for turn in sample.turns)
            label = f"Step {step} · #{sample.index + 1} · {calls} call(s) · reward {reward_text(sample.flags) or '—'}"
            with st.expander(safe(label, 200)):
                st.caption(safe(sample.prompt, 500))
                for name, text in trajectory_lines(sample):
                    st.caption(safe(name, 100))
                    st.code(text or EMPTY_ANSWER, language=None, wrap_lines=True)
    st.caption(f"The newest {min(len(steps), steps_shown)} of {len(steps)} sampling step(s) with tool calls.")



def audio_file(sample: SampleRecord) -> Path | None:
    """A spoken sample's WAV in its run's folder; None when it is not there (deleted) or leads out of the folder."""
    if not sample.audio:
        return None
    try:
        folder = paths.run_dir(sample.run_id)
        found = paths.resolve_inside(folder / sample.audio, [folder / "samples"])
    except paths.UnsafePathError:
        return None
    return found if found.is_file() else None


@st.cache_data(max_entries=64, show_spinner=False)
def _clip_bytes(path: str, mtime_ns: int, size: int) -> bytes:
    """A clip's bytes, read once per (file, version): Live redraws every second, and a clip does not change."""
    return Path(path).read_bytes()


def render_audio_samples(samples: Sequence[SampleRecord], steps_shown: int = AUDIO_STEPS) -> None:
    """A text-to-speech run's spoken samples: per sampling step (newest first, ``steps_shown`` of them), a player
    for each sentence with its length, and what went wrong (a clip that talked to the cap)."""
    steps = sorted({s.step for s in samples}, reverse=True)
    for step in steps[:steps_shown]:
        row = sorted((s for s in samples if s.step == step), key=lambda s: s.index)
        st.markdown(f"**Step {step}**" + (" (the base model: before the first step)" if step == 0 else ""))
        for column, sample in zip(st.columns(len(row)), row):
            column.caption(safe(prompt_label(sample.index, sample.prompt)))
            found = audio_file(sample)
            if found is None:
                column.caption("The clip is no longer in the run's folder.")
            else:
                stat = found.stat()
                column.audio(_clip_bytes(str(found), stat.st_mtime_ns, stat.st_size), format="audio/wav")
            flags = "; ".join(str(v) for v in sample.flags.values())
            column.caption(safe(sample.text) + (f" · ⚠️ {safe(flags)}" if flags else ""))
    st.caption(f"Spoken with a fixed seed at each evaluation and at the end; the newest {min(len(steps), steps_shown)} "
               f"of {len(steps)} sampling step(s)" + (" (Run details plays more)." if steps_shown < AUDIO_STEPS else "."))


def image_files(samples: Sequence[SampleRecord]) -> dict[int, Path]:
    """A vision run's sample prompts shown with an image: {prompt index: the thumbnail its worker saved in the run's
    samples/images folder}; only files inside that folder (a link out of it is not shown)."""
    if not samples:
        return {}
    try:
        folder = paths.run_dir(samples[0].run_id) / "samples" / "images"
    except paths.UnsafePathError:
        return {}
    found = {}
    for index in sorted({s.index for s in samples}):
        try:
            path = paths.resolve_inside(folder / f"{index}.png", [folder])
        except paths.UnsafePathError:
            continue
        if path.is_file():
            found[index] = path
    return found


def render_sample_images(samples: Sequence[SampleRecord]) -> None:
    """The images a vision run's sample prompts show, above the answers, each under its prompt's label."""
    shown = image_files(samples)
    if not shown:
        return
    prompts = {s.index: s.prompt for s in samples}
    for column, (index, path) in zip(st.columns(max(len(shown), 4)), shown.items()):
        column.image(str(path), width=96)
        column.caption(safe(prompt_label(index, prompts[index])))  # user text: escaped, under its image


def render_samples(samples: Sequence[SampleRecord], expected: bool, audio_steps: int = AUDIO_STEPS) -> None:
    """The step x prompt table of one run; ``expected``: the run samples (says so while none arrived yet). A
    text-to-speech run's samples are clips: players instead of the table."""
    if not samples:
        if expected:
            st.caption("No samples yet: the first greedy answers come at the first sampling step.")
        return
    if any(s.audio for s in samples):
        render_audio_samples(samples, audio_steps)
        return
    render_sample_images(samples)
    table, prompts = samples_table(samples)
    config = {"step": st.column_config.NumberColumn("step", width="small")}
    for label, prompt in prompts.items():
        config[label] = st.column_config.TextColumn(label, help=safe(prompt, 500), width="large")
    st.dataframe(table, hide_index=True, column_config=config)
    flagged = sum(1 for s in samples if s.flags)
    st.caption(f"Greedy answers with a fixed seed, newest step first; {len(table)} sampling step(s)"
               + (f", {flagged} degenerate answer(s) marked ⚠️." if flagged else "."))
    if any(s.turns for s in samples):
        render_trajectories(samples)


def render_prompt_compare(runs: Sequence[RunRecord], labels: dict[str, str], prompts: Sequence[str],
                          samples_of) -> None:
    """Pick a sample prompt; one row per run with its latest answer. ``samples_of(prompt)`` reads them."""
    if not prompts:
        return
    st.subheader("Samples during training")
    prompt = st.selectbox("Sample prompt", list(prompts), key="compare_sample_prompt",
                          format_func=lambda p: prompt_label(list(prompts).index(p), p))
    st.caption(safe(prompt, 500))
    st.dataframe(prompt_table(runs, labels, samples_of(prompt)), hide_index=True,
                 column_config={"answer": st.column_config.TextColumn("latest answer", width="large")})


def sampling_configured(config: dict) -> bool:
    """Whether a run's (public) config asks for samples (a text-to-speech run always speaks some)."""
    grpo = config.get("grpo") if isinstance(config.get("grpo"), dict) else {}
    return bool(config.get("sample_prompts") or str(config.get("sample_prompt_set") or "").strip()
                or config.get("method") == "tts" or (config.get("method") == "grpo" and grpo.get("sample_every", 10)))
