"""New run with speech data (issue 22): players for the first clips with their transcript and duration, a histogram
of every clip's duration against the model's window, and the clips past it counted with the fix. AppTest, with the
model facts faked (tests/support/apptest.py's fakes) and a Whisper config folder read for its window."""
from __future__ import annotations

import io
import json

import soundfile
from streamlit.runtime.media_file_manager import MediaFileManager

from tests.speech.test_stt_data import fake_whisper, tone, write_jsonl
from tests.support.apptest import fakes, open_new_run, texts  # noqa: F401 - fakes is a fixture
from trainer_core.config import TrainConfig
from ui import form
from ui.text import safe


def speech_state(tmp_path, rows, **fields) -> dict:
    model = fake_whisper(tmp_path / "whisper", window=4)
    train = write_jsonl(tmp_path / "clips" / "train.jsonl", rows)
    cfg = TrainConfig(model_name=str(model), method="stt", adapter="full", local_datasets=[str(train)], **fields)
    return form.config_to_state(cfg)


def test_the_first_clips_play_and_their_durations_are_charted_against_the_window(fakes, tmp_path):
    for i, seconds in enumerate((1.0, 1.5, 2.0, 6.0)):
        tone(tmp_path / "clips" / f"c{i}.wav", seconds)
    rows = [{"audio": f"c{i}.wav", "text": f"<b>phrase</b> {i}"} for i in range(4)]
    at = open_new_run(**speech_state(tmp_path, rows))
    assert not at.exception, at.exception
    assert len(at.get("audio")) == 3  # players for the first three clips
    captions = texts(at, "caption")
    assert f"1.0 s · {safe('<b>phrase</b> 0')}" in captions, [c for c in captions if " s · " in c]  # escaped
    assert any(m.startswith("**Clips** (4 in the first file: 10.5 s of speech)") for m in texts(at, "markdown"))
    warnings = texts(at, "warning")
    assert any(w.startswith("1 clip(s) are longer than 4 s (the longest clip trained on) and will be left out")
               for w in warnings)
    [chart] = [c for c in at.get("vega_lite_chart") if "clip duration" in json.dumps(c.proto.spec)]
    spec = json.loads(chart.proto.spec)
    rule = spec["layer"][1]
    assert rule["mark"]["type"] == "rule" and rule["encoding"]["x"]["field"] == "window"  # the model's window


def test_a_clip_outside_the_allowed_folders_is_named_and_not_played(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path / "clips") + ":" + str(tmp_path / "whisper"))
    secret = tone(tmp_path / "outside" / "secret.wav", 1.0)
    (tmp_path / "clips").mkdir(parents=True, exist_ok=True)
    tone(tmp_path / "clips" / "ok.wav", 1.0)
    rows = [{"audio": "ok.wav", "text": "fine"}, {"audio": str(secret), "text": "leak"}]
    at = open_new_run(**speech_state(tmp_path, rows))
    assert not at.get("audio")
    assert any(w.startswith("**local_datasets**: row 1: ") and "allowed" in w for w in texts(at, "warning"))


def test_a_text_run_shows_no_clip_panel(fakes, tmp_path):
    tone(tmp_path / "clips" / "c.wav", 1.0)
    state = speech_state(tmp_path, [{"audio": "c.wav", "text": "hi"}])
    state[form.K + "method"] = "sft"
    at = open_new_run(**state)
    assert not at.get("audio")


def served_media(monkeypatch) -> list:
    """What the page hands Streamlit's media manager (which /media/<hash> serves): bytes, or a path it reads."""
    served, add = [], MediaFileManager.add

    def spy(self, path_or_data, mimetype, *args, **kwargs):
        served.append((path_or_data, mimetype))
        return add(self, path_or_data, mimetype, *args, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add", spy)
    return served


def test_a_player_gets_the_decoded_clip_and_a_clip_that_does_not_decode_gets_none(fakes, tmp_path, monkeypatch):
    """Before, every one of the first clips got a player for its path, even rows the panel called unreadable, and
    /media served the file's bytes as they were: here a text file named like a clip, and a WAV with a secret after
    its audio. Now a player takes the samples soundfile decoded, written again as WAV; a clip that does not
    decode gets none."""
    served = served_media(monkeypatch)
    ok = tone(tmp_path / "clips" / "ok.wav", 1.0)
    with open(ok, "ab") as fh:
        fh.write(b"SECRET=hunter2\n")  # past the RIFF chunk: soundfile reads the audio, the bytes carry the secret
    (tmp_path / "clips" / "notes.wav").write_text("SECRET=hunter2\n")
    rows = [{"audio": "notes.wav", "text": "not a clip"}, {"audio": "ok.wav", "text": "fine"}]
    at = open_new_run(**speech_state(tmp_path, rows))
    assert not at.exception, at.exception
    assert len(at.get("audio")) == 1
    clips = [data for data, mimetype in served if mimetype.startswith("audio/")]  # one per run of the page
    assert clips and all(isinstance(data, bytes) for data in clips), clips
    [clip] = set(clips)
    assert b"SECRET" not in clip and soundfile.info(io.BytesIO(clip)).frames == soundfile.info(ok).frames  # all of it
    assert any(w.startswith("1 clip(s) cannot be read") and "row 0" in w for w in texts(at, "warning"))
