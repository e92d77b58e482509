"""Samples on the pages through AppTest: New run names their problems, Live and Run details show step x prompt
(newest step first), Compare shows one prompt across runs; answers holding markdown or HTML are plain text in
the tables."""
from __future__ import annotations

import json
import time

import pandas as pd
import pytest

from db.entities import RunRecord, SampleRecord
from db.store import Store
from tests.support.apptest import open_page, submit
from trainer_core.protocol.status import RunStatus
from ui import samples as ui_samples
from ui.text import safe

@pytest.fixture
def pages_store(app_home):
    store = Store()
    yield store
    store.engine.dispose()


PROMPTS = ["What is the capital of France?", "Say <b>hi</b> and **bold**"]


def sampled_run(store: Store, run_id: str, name: str, answers: dict[int, list[str]],
                status: RunStatus = RunStatus.COMPLETED) -> None:
    store.create_run(RunRecord(id=run_id, name=name, status=RunStatus.RUNNING.value, created_at=time.time(),
                               started_at=time.time(), config_json=json.dumps({"sample_prompts": PROMPTS})))
    store.append_metrics(run_id, [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}])
    store.append_samples(run_id, [
        {"step": step, "index": i, "prompt": PROMPTS[i], "text": text, "new_tokens": 3, "ts": 1.0,
         "flags": {"empty": "the answer is empty"} if not text else {}}
        for step, texts in answers.items() for i, text in enumerate(texts)])
    if status.is_terminal():
        store.finish_run(run_id, status)


def samples_frame(at) -> pd.DataFrame:
    [frame] = [d.value for d in at.dataframe if "step" in d.value.columns and any(
        str(c).startswith("#1") for c in d.value.columns)]
    return frame


EXPECTED_COLUMNS = ["step", "#1 What is the capital of France?", "#2 Say <b>hi</b> and **bold**"]


def test_live_shows_the_samples_table_newest_step_first(pages_store):
    sampled_run(pages_store, "20260101-000000-llllll", "live samples",
                {2: ["Paris.", "<b>hi</b> **bold**"], 4: ["Paris!", ""]})
    at = open_page("pages/live.py", live_run_id="20260101-000000-llllll")
    assert "Samples during training" in [s.value for s in at.subheader]
    frame = samples_frame(at)
    assert list(frame.columns) == EXPECTED_COLUMNS
    assert frame.values.tolist() == [[4, "Paris!", "⚠️ empty sample answer | (empty)"],
                                     [2, "Paris.", "<b>hi</b> **bold**"]]  # as typed: a text cell, not markdown


def test_live_of_a_run_without_sample_prompts_shows_no_samples_section(pages_store):
    pages_store.create_run(RunRecord(id="20260101-000000-nnnnnn", name="plain", status=RunStatus.RUNNING.value,
                                     created_at=time.time()))
    pages_store.finish_run("20260101-000000-nnnnnn", RunStatus.COMPLETED)
    at = open_page("pages/live.py", live_run_id="20260101-000000-nnnnnn")
    assert "Samples during training" not in [s.value for s in at.subheader]


def test_run_details_show_the_samples_table(pages_store):
    sampled_run(pages_store, "20260101-000000-rrrrrr", "detail samples", {3: ["Paris.", "hi"], 6: ["Lyon?", "hi!"]})
    at = open_page("pages/run.py", detail_run_id="20260101-000000-rrrrrr")
    assert "Samples" in [t.label for t in at.tabs]
    frame = samples_frame(at)
    assert list(frame.columns) == EXPECTED_COLUMNS
    assert frame.values.tolist() == [[6, "Lyon?", "hi!"], [3, "Paris.", "hi"]]


def test_run_details_of_a_finished_run_that_recorded_none_says_so(pages_store):
    sampled_run(pages_store, "20260101-000000-eeeeee", "no samples", {})
    at = open_page("pages/run.py", detail_run_id="20260101-000000-eeeeee")
    assert "This run recorded no samples." in [c.value for c in at.caption]


def test_compare_shows_one_prompt_across_runs_with_each_runs_latest_answer(pages_store):
    sampled_run(pages_store, "20260101-000000-aaaaaa", "run a", {2: ["Paris.", "hi"], 4: ["Paris!", "hey"]})
    sampled_run(pages_store, "20260101-000001-bbbbbb", "run b", {2: ["Rome?", ""]})
    at = open_page("pages/compare.py", compare_ids=["20260101-000000-aaaaaa", "20260101-000001-bbbbbb"])
    assert "Samples during training" in [s.value for s in at.subheader]
    [table] = [d.value for d in at.dataframe if list(d.value.columns) == ["run", "step", "answer"]]
    assert table[["step", "answer"]].values.tolist() == [[4, "Paris!"], [2, "Rome?"]]
    at.selectbox(key="compare_sample_prompt").set_value(PROMPTS[1]).run()
    [table] = [d.value for d in at.dataframe if list(d.value.columns) == ["run", "step", "answer"]]
    assert table[["step", "answer"]].values.tolist() == [[4, "hey"], [2, "⚠️ empty sample answer | (empty)"]]
    assert safe(PROMPTS[1], 500) in [c.value for c in at.caption]  # the prompt above the table, escaped


def test_answers_are_cut_for_a_cell_and_labels_stay_unique():
    long = SampleRecord("r", 1, 0, "p", "x" * 5000)
    assert len(ui_samples.answer_cell(long)) == ui_samples.CELL_CHARS
    same = [SampleRecord("r", 1, 0, "Same prompt", "a"), SampleRecord("r", 1, 1, "Same prompt", "b")]
    table, prompts = ui_samples.samples_table(same)
    assert list(table.columns) == ["step", "#1 Same prompt", "#2 Same prompt"] and len(prompts) == 2


def test_new_run_form_names_sample_problems_and_starts_nothing(pages_store):
    at = open_page("pages/new_run.py")
    at.text_area(key="nr_sample_prompts").input("What is 2+2?\nSay <b>hi</b>")
    at.selectbox(key="nr_sample_prompt_set").set_value("quick-check")
    at.number_input(key="nr_sample_max_new_tokens").set_value(0)
    submit(at)
    errors = [e.value for e in at.error]
    assert errors == ["The run was not started: 2 problem(s) to fix.",
                      "**sample_max_new_tokens**: let each answer have at least 1 new token (64 is a good start) (got 0)",
                      "**sample_prompt_set**: choose either inline sample_prompts or a prompt set, not both (clear one)"]
    assert pages_store.list_runs() == []


def spoken_run(store: Store, run_id: str, steps: dict[int, str]) -> None:
    """A text-to-speech run's spoken samples: one WAV per step in its run folder (samples/step-...wav)."""
    import io
    import wave

    from trainer_core.protocol import paths

    store.create_run(RunRecord(id=run_id, name="spoken", status=RunStatus.RUNNING.value, created_at=time.time(),
                               started_at=time.time(), config_json=json.dumps({"method": "tts"})))
    folder = paths.run_dir(run_id) / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for step, audio in steps.items():
        if audio.startswith("samples/"):
            buffer = io.BytesIO()
            with wave.open(buffer, "wb") as clip:
                clip.setnchannels(1), clip.setsampwidth(2), clip.setframerate(24000)
                clip.writeframes(b"\x00\x01" * 2400)
            (paths.run_dir(run_id) / audio).write_bytes(buffer.getvalue())
        rows.append({"step": step, "index": 0, "prompt": "open the <b>door</b>", "text": "0.10 s of speech",
                     "ts": 1.0, "audio": audio,
                     "flags": {"no_end": "spoke until the 4 s cap without ending"} if step == 0 else {}})
    store.append_samples(run_id, rows)


def test_live_plays_a_text_to_speech_runs_spoken_samples_newest_first(pages_store):
    spoken_run(pages_store, "20260101-000000-ssssss", {0: "samples/step-000000-0.wav",
                                                        40: "samples/step-000040-0.wav"})
    at = open_page("pages/live.py", live_run_id="20260101-000000-ssssss")
    assert "Samples during training" in [s.value for s in at.subheader]
    assert len(at.get("audio")) == 1  # Live (redrawn every second) plays the newest step; Run details more
    steps = [m.value for m in at.markdown if m.value.startswith("**Step")]
    assert steps == ["**Step 40**"]
    at = open_page("pages/run.py", detail_run_id="20260101-000000-ssssss")
    assert len(at.get("audio")) == 2
    steps = [m.value for m in at.markdown if m.value.startswith("**Step")]
    assert steps == ["**Step 40**", "**Step 0** (the base model: before the first step)"]
    captions = [c.value for c in at.caption]
    assert safe("#1 open the <b>door</b>") in captions  # the sentence, escaped
    assert f"{safe('0.10 s of speech')} · ⚠️ {safe('spoke until the 4 s cap without ending')}" in captions


def test_a_spoken_sample_whose_file_is_gone_or_leads_out_of_the_run_is_not_played(pages_store):
    spoken_run(pages_store, "20260101-000000-tttttt", {0: "samples/step-000000-0.wav"})
    (ui_samples.paths.run_dir("20260101-000000-tttttt") / "samples" / "step-000000-0.wav").unlink()
    # a path written straight into the database (the pump only stores samples/step-N-i.wav names)
    pages_store.append_samples("20260101-000000-tttttt", [{"step": 5, "index": 0, "prompt": "p", "text": "t",
                                                            "audio": "../../../etc/passwd"}])
    at = open_page("pages/run.py", detail_run_id="20260101-000000-tttttt")
    assert not at.get("audio")
    assert [c.value for c in at.caption].count("The clip is no longer in the run's folder.") == 2


def test_live_and_run_details_show_a_grpo_runs_trajectories_with_their_rewards(pages_store):
    """Issue 32: a rollout with tool calls shows its calls, results and final answer as code (user text stays text)."""
    run_id = "20260101-000000-gggggg"
    pages_store.create_run(RunRecord(id=run_id, name="agent", status=RunStatus.RUNNING.value, created_at=time.time(),
                                     started_at=time.time(), config_json=json.dumps({"method": "grpo", "grpo": {}})))
    turns = [{"role": "assistant", "content": "", "calls": [{"name": "add", "arguments": '{"a": 2, "b": 3}'}]},
             {"role": "tool", "name": "add", "content": "**5**"},
             {"role": "assistant", "content": "The sum is 5.", "calls": []}]
    pages_store.append_samples(run_id, [{"step": 2, "index": 0, "prompt": "Add 2 and 3.", "text": "The sum is 5.",
                                         "ts": 1.0, "flags": {"reward:got_five": "1"}, "turns": turns}])
    for page, key in (("pages/live.py", "live_run_id"), ("pages/run.py", "detail_run_id")):
        at = open_page(page, **{key: run_id})
        assert [e.label for e in at.expander if e.label.startswith("Step")] == [
            safe("Step 2 · #1 · 1 call(s) · reward got_five 1")], page
        codes = [c.value for c in at.code]
        assert codes[codes.index('{"a": 2, "b": 3}'):] == ['{"a": 2, "b": 3}', "**5**", "The sum is 5."], page
        assert {"call add", "result of add"} <= {c.value for c in at.caption}, page
