"""New run for text-to-speech (issue 22): a CSM model folder is told from its config (no weights) and said to be a
text-to-speech model; with method tts the clips play with their text and duration, the duration histogram's rule is
tts.max_clip_s, and the clips past it are counted with the fix. The data check finds the speaker column, and names a
speaker id CSM cannot take. AppTest with the model facts faked (tests/support/apptest.py's fakes)."""
from __future__ import annotations

import json

import pytest

from tests.speech.test_stt_data import tone, write_jsonl
from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES, build_tiny_csm, spoken_rows
from tests.support.apptest import fakes, open_new_run, texts  # noqa: F401 - fakes is a fixture
from trainer_core.methods.tts import TtsSettings
from trainer_core.config import TrainConfig
from trainer_core.data import loading
from trainer_core.planning.modality import TTS, detect_modality
from trainer_core.data.preview import build_preview
from ui import form


def fake_csm(folder):
    """The JSON a CSM folder holds that the dashboard reads (no weights: nothing here loads them)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "csm", "architectures": ["CsmForConditionalGeneration"], "num_codebooks": 32,
        "codec_config": {"model_type": "mimi", "sampling_rate": 24000}}))
    return folder


def tts_config(tmp_path, rows, **fields) -> TrainConfig:
    train = write_jsonl(tmp_path / "clips" / "train.jsonl", rows)
    return TrainConfig(model_name=str(fake_csm(tmp_path / "csm")), method="tts", adapter="full",
                       local_datasets=[str(train)], **fields)


def test_a_csm_folder_is_a_text_to_speech_model_and_the_form_says_what_it_speaks(fakes, tmp_path):
    info = detect_modality(str(fake_csm(tmp_path / "csm")))
    assert (info.kind, info.sampling_rate, info.codec, info.codebooks) == (TTS, 24000, "mimi", 32)
    for i, seconds in enumerate((1.0, 2.0, 3.0)):
        tone(tmp_path / "clips" / f"c{i}.wav", seconds)
    rows = [{"audio": f"c{i}.wav", "text": f"sentence {i}", "speaker": i % 2} for i in range(3)]
    at = open_new_run(**form.config_to_state(tts_config(tmp_path, rows, method_settings=TtsSettings(max_clip_s=2.5))))
    assert not at.exception, at.exception
    assert any(m.startswith("Text-to-speech model (CsmForConditionalGeneration): speaks 24000 Hz audio through its "
                            "mimi codec, 32 codebooks") for m in texts(at, "info")), texts(at, "info")
    assert len(at.get("audio")) == 3
    warnings = texts(at, "warning")
    assert any(w.startswith("1 clip(s) are longer than 2.5 s (the longest clip trained on)") for w in warnings), warnings
    [chart] = [c for c in at.get("vega_lite_chart") if "clip duration" in json.dumps(c.proto.spec)]
    assert json.loads(chart.proto.spec)["layer"][1]["encoding"]["x"]["field"] == "window"


def test_the_speaker_column_is_found_and_a_speaker_csm_cannot_take_is_counted(home, tmp_path):
    for i in range(4):
        tone(tmp_path / "clips" / f"c{i}.wav", 1.0)
    tone(tmp_path / "clips" / "c4.wav", 1.0)
    rows = [{"audio": "c0.wav", "text": "one", "speaker": 1}, {"audio": "c1.wav", "text": "two", "speaker": "3"},
            {"audio": "c2.wav", "text": "three", "speaker": "alice"}, {"audio": "c3.wav", "text": "four"},
            {"audio": "c4.wav", "text": "five", "speaker": "²"}]  # a digit to str.isdigit, not a number to int()
    cfg = tts_config(tmp_path, rows, method_settings=TtsSettings(speaker=7))
    data = loading.load_for_training(cfg).train
    assert [r["speaker"] for r in data.rows] == [1, 3, 7]  # an empty cell takes tts.speaker
    assert data.dropped == {"a speaker in 'speaker' that is not a whole number from 0 to 99 (CSM's voices are "
                            "numbered: map names to numbers)": 2}
    assert "speakers in 'speaker' (3 voices)" in data.reason


def test_a_mapped_speaker_column_that_no_row_has_is_named(home, tmp_path):
    tone(tmp_path / "clips" / "c.wav", 1.0)
    cfg = tts_config(tmp_path, [{"audio": "c.wav", "text": "hi"}], method_settings=TtsSettings(columns={"speaker": "voice"}))
    errors = loading.check_data(cfg)
    assert [(e.field, e.message) for e in errors] == [
        ("tts.columns", "train.jsonl: maps speaker to 'voice', which no row has: name the column that holds the speaker ids, or "
                        "leave speaker out")]


def test_a_text_model_with_method_tts_is_refused_naming_the_model(home, tmp_path):
    tone(tmp_path / "clips" / "c.wav", 1.0)
    train = write_jsonl(tmp_path / "clips" / "train.jsonl", [{"audio": "c.wav", "text": "hi"}])
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    cfg = TrainConfig(model_name=str(llama), method="tts", adapter="full", local_datasets=[str(train)])
    errors = loading.check_data(cfg)
    assert any(e.field == "model_name" and "is not a text-to-speech model (LlamaForCausalLM)" in e.message
               for e in errors), errors


@pytest.mark.subprocess
@pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK)
def test_the_preview_shows_each_row_as_its_prompt_and_its_codec_frames(home, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{build_tiny_csm().parent}")
    rows = spoken_rows(tmp_path / "clips", phrases=PHRASES[:2], variants=((175, 50), (120, 40)))
    rows[1]["speaker"] = 3
    train = write_jsonl(tmp_path / "clips" / "train.jsonl", rows)
    cfg = TrainConfig(model_name=str(build_tiny_csm()), method="tts", adapter="full", local_datasets=[str(train)])
    preview = build_preview(cfg, rows_shown=2)
    assert (preview.format, preview.total_rows) == ("speech", 4)
    first, second = preview.rows
    assert first.text == f"[0]{PHRASES[0]}" and second.text == f"[3]{PHRASES[0]}"  # tts.speaker 0, the row's 3
    assert first.label.endswith("speaker 0") and second.label.endswith("speaker 3")
    # the slower recording (120 words a minute) is longer, so more frames: 12.5 a second (Mimi)
    frames = [int(r.segments[1][0].split()[1]) for r in (first, second)]
    seconds = [float(r.label.split()[0]) for r in (first, second)]
    assert frames[1] > frames[0] and all(abs(f - s * 12.5) <= 2 for f, s in zip(frames, seconds)), (frames, seconds)
    assert 0 < preview.trained_tokens < preview.total_tokens == sum(preview.lengths)  # the frames are trained on


def test_a_text_too_long_to_speak_in_one_clip_is_left_out_and_counted(home, tmp_path):
    for i in range(2):
        tone(tmp_path / "clips" / f"c{i}.wav", 1.0)
    rows = [{"audio": "c0.wav", "text": "word " * 300}, {"audio": "c1.wav", "text": "a <b>short</b> one\x00"}]
    data = loading.load_for_training(tts_config(tmp_path, rows)).train
    assert [r["text"] for r in data.rows] == ["a <b>short</b> one\x00"]
    assert data.dropped == {"a text longer than 1,000 characters (a clip speaks a sentence or a few: split it with "
                            "its audio)": 1}
