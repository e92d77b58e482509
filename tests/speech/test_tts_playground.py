"""The Playground's text-to-speech mode (issue 22): a tts run's base model and tuned model speak the same text side by
side (trainer_core/tryout/speak.py, its child process trainer_core/worker/speak_child.py, and ui/tts_playground.py).

Fast: a request is checked before any process starts (every problem named with its field and fix); a source that
cannot be resolved (an unknown run, a checkpoint that is a link out of its run folder, a model that does not speak)
gets its own error while the others still go to the child; the mode says what to do without a tts run and refuses
viewers. Slow: the tiny CSM trained through the orchestrator speaks a phrase it learned: two valid 24 kHz mono WAV
clips, the base talking to the cap, the tuned model ending on its own near the recordings' length; the same through
the page, with a player and a download per model."""
from __future__ import annotations

import io
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import soundfile
from streamlit.testing.v1 import AppTest

from db import users
from db.entities import RunRecord
from db.store import Store
from tests.speech.test_tts_train import tts_config
from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES
from tests.support import ROOT
from tests.support.apptest import open_page
from trainer_core.methods.tts import TtsSettings
from trainer_core.tryout import speak
from trainer_core.auth.access import Role
from trainer_core.config import TrainConfig
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.errors import FieldError
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from ui import auth, tts_playground
from ui.state import get_orchestrator
from ui.text import safe

RUN_ID = "20260101-120000-tts001"
CSM_CONFIG = {"model_type": "csm", "architectures": ["CsmForConditionalGeneration"], "num_codebooks": 4,
              "codec_config": {"model_type": "mimi", "sampling_rate": 24000}}


def request(**fields) -> speak.Request:
    base = dict(sources=(ModelSource(model="sesame/csm-1b"),), text="open the door", speaker=0, max_seconds=4.0)
    return speak.Request(**{**base, **fields})


# ====================================================================== the request
def test_a_good_request_has_no_problems():
    assert speak.problems(request()) == []
    assert speak.problems(request(text="<b>*open*</b> [the](door)", speaker=99, max_seconds=60)) == []  # just text


@pytest.mark.parametrize("fields, expected", [
    (dict(text="  \n"), [FieldError("text", "type the sentence to speak")]),
    (dict(text="a" * 501), [FieldError("text", "501 characters is more than the 500 one request speaks: shorten it "
                                               "or speak it in parts")]),
    (dict(text="open\x00the door"), [FieldError("text", "contains a NUL character: remove it")]),
    (dict(speaker=100), [FieldError("speaker", "a whole number from 0 to 99 (CSM's speaker id), not 100")]),
    (dict(speaker=-1), [FieldError("speaker", "a whole number from 0 to 99 (CSM's speaker id), not -1")]),
    (dict(speaker=True), [FieldError("speaker", "a whole number from 0 to 99 (CSM's speaker id), not True")]),
    (dict(max_seconds=61.0), [FieldError("max_seconds", "from 0.5 to 60 seconds (the run's tts.max_sample_s), "
                                                        "not 61.0")]),
    (dict(max_seconds=float("nan")), [FieldError("max_seconds", "from 0.5 to 60 seconds (the run's "
                                                                "tts.max_sample_s), not nan")]),
    (dict(sources=()), [FieldError("models", "pick at least one model to speak")]),
    (dict(sources=(ModelSource(model="a"),) * 4), [FieldError("models", "4 models: pick at most 3")]),
])
def test_each_bad_field_is_named_with_its_fix(fields, expected):
    assert speak.problems(request(**fields)) == expected


def test_every_problem_is_reported_at_once_before_any_process_starts(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no child for a bad request"))
    with pytest.raises(speak.SpeakError) as caught:
        speak.speak(request(text="", speaker=100, sources=()))
    assert [e.field for e in caught.value.errors] == ["text", "speaker", "models"]


# ====================================================================== sources
def fake_csm(folder: Path) -> Path:
    """A folder whose config files say CSM (enough to resolve and to be told a speaking model; never loaded)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CSM_CONFIG))
    return folder


def fake_tts_run(store: Store, base: Path, run_id: str = RUN_ID, name: str = "my voice") -> Path:
    """A finished full tts run as the store and the run folder hold it (weights files faked: nothing loads them)."""
    cfg = TrainConfig(run_name=name, model_name=str(base), method="tts", adapter="full",
                      method_settings=TtsSettings(speaker=3, max_sample_s=6.0))
    folder = paths.run_dir(run_id)
    folder.mkdir(parents=True)
    write_kind(folder, JobKind.TRAIN)
    (folder / "config.yaml").write_text(cfg.to_yaml())
    fake_csm(folder / "model")
    store.create_run(RunRecord(id=run_id, name=name, status=RunStatus.RUNNING, kind=JobKind.TRAIN, model=str(base),
                               created_at=time.time(), output_dir=str(folder),
                               config_json=json.dumps(cfg.to_public_dict())))
    store.finish_run(run_id, RunStatus.COMPLETED, steps_done=10)
    return folder


def test_sources_that_cannot_speak_get_their_own_error_and_start_no_child(home, tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("nothing here can speak: no child"))
    store = Store()
    run_dir = fake_tts_run(store, fake_csm(tmp_path / "csm"))
    outside = fake_csm(tmp_path / "elsewhere")  # full weights, but not the run's own
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "checkpoint-7").symlink_to(outside, target_is_directory=True)
    writer = tmp_path / "llama"
    writer.mkdir()
    (writer / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    results = speak.speak(request(sources=(ModelSource(run_id="20990101-000000-nosuch"),
                                           ModelSource(run_id=RUN_ID, checkpoint=7), ModelSource(model=str(writer)))))
    assert [(r.label, r.wav) for r in results] == [("run:20990101-000000-nosuch", b""), (f"run:{RUN_ID}@7", b""),
                                                   (f"Base · {writer}", b"")]
    climbing, = speak.speak(request(sources=(ModelSource(run_id="../../etc"),)))
    assert climbing.error == "run id '../../etc' has characters that are not allowed"
    errors = [r.error for r in results]
    assert "run 20990101-000000-nosuch: its folder" in errors[0] and "pick another run" in errors[0]
    # a checkpoint folder that is a link out of the run is no checkpoint of the run (specs/checkpoints: never through
    # a symlink), so nothing outside the run is ever loaded
    assert errors[1] == "run 'my voice' has no checkpoint at step 7: it has no checkpoints"
    assert errors[2] == "it does not speak (a text model): pick a CSM text-to-speech model or a tts run"
    store.engine.dispose()


def test_only_the_sources_that_resolve_go_to_the_child_and_the_results_keep_their_order(home, tmp_path, monkeypatch):
    store = Store()
    fake_tts_run(store, fake_csm(tmp_path / "csm"))
    sent = {}

    def child(argv, input, env, **kwargs):  # plays the child: one 24 kHz WAV per source it was given
        sent.update(json.loads(input), argv=argv, env=env)
        buffer = io.BytesIO()
        soundfile.write(buffer, [0.0] * 2400, 24000, format="WAV", subtype="PCM_16")
        for i, _ in enumerate(sent["sources"]):
            (Path(sent["out_dir"]) / f"{i}.wav").write_bytes(buffer.getvalue())
        clips = [{"seconds": 0.1, "ended": True, "rate": 24000}] * (len(sent["sources"]) - 1) + [{"error": "boom"}]
        return subprocess.CompletedProcess(argv, 0, json.dumps({"clips": clips}) + "\n", "")

    monkeypatch.setattr(subprocess, "run", child)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    results = speak.speak(request(sources=(ModelSource(model=str(tmp_path / "csm")), ModelSource(run_id="x-gone"),
                                           ModelSource(run_id=RUN_ID)), text="<i>hi</i>", speaker=3))
    assert sent["sources"] == [f"base:{tmp_path / 'csm'}", f"run:{RUN_ID}"] and sent["text"] == "<i>hi</i>"
    assert sent["speaker"] == 3 and sent["seed"] == speak.SEED and sent["max_seconds"] == 4.0
    # hostile review: no secret reaches the child (a trusted model's code would read it), and it speaks on the CPU
    assert "HF_TOKEN" not in sent["env"] and not any("hf_secret" in a for a in sent["argv"])
    assert sent["env"]["FINETUNE_STUDIO_FORCE_CPU"] == "1" and sent["env"]["HF_HUB_OFFLINE"] == "1"
    assert [r.label for r in results] == [f"Base · {tmp_path / 'csm'}", "run:x-gone", "my voice · final"]
    assert results[0].ended and results[0].seconds == 0.1 and soundfile.info(io.BytesIO(results[0].wav)).frames == 2400
    assert "its folder" in results[1].error and results[2].error == "boom" and not results[2].wav
    assert not Path(sent["out_dir"]).exists()  # the clips' folder is removed once they are read
    store.engine.dispose()


def test_the_run_voice_is_its_speaker_and_cap(home, tmp_path):
    store = Store()
    fake_tts_run(store, fake_csm(tmp_path / "csm"))
    assert speak.run_voice(RUN_ID) == speak.RunVoice(speaker=3, max_seconds=6.0)
    store.engine.dispose()


def test_captions_and_file_names():
    assert tts_playground.ending(speak.Spoken("a", seconds=0.876, ended=True), 4.0) == "0.88 s · ended on its own"
    assert tts_playground.ending(speak.Spoken("a", seconds=4.0), 4.0) == "4.00 s · talked to the 4 s cap"
    assert speak.wav_name("my voice · final", "Open the door, please!") == "my-voice-final-open-the-door-please.wav"
    assert speak.wav_name("", "***") == "model-speech.wav"


# ====================================================================== the page (no model loads)
def open_mode() -> AppTest:
    at = open_page("pages/playground.py")
    at.button_group(key="pg_mode").set_value("Text to speech").run()
    assert not at.exception, at.exception
    return at


def test_the_mode_says_how_to_get_a_tts_run_when_there_is_none(app_home):
    at = open_mode()
    assert any(i.value.startswith("No text-to-speech run yet: train a Sesame CSM model with method tts")
               for i in at.info)


def test_the_mode_offers_tts_runs_with_their_voice_and_names_a_bad_request(app_home, tmp_path, monkeypatch):
    store = get_orchestrator().store
    fake_tts_run(store, fake_csm(tmp_path / "csm"))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a bad request starts no child"))
    at = open_mode()
    assert at.selectbox(key="pgt_run").value == RUN_ID
    assert at.multiselect(key=f"pgt_versions_{RUN_ID}").value == ["base", None]
    assert at.number_input(key=f"pgt_speaker_{RUN_ID}").value == 3  # the run's tts.speaker
    assert any("at most 6 s" in c.value for c in at.caption)
    next(b for b in at.button if b.label == "Speak").click().run()
    assert [e.value for e in at.error] == ["**text**: type the sentence to speak"]


def test_a_viewer_cannot_make_models_speak(app_home, tmp_path, monkeypatch):
    store = get_orchestrator().store
    fake_tts_run(store, fake_csm(tmp_path / "csm"))
    users.ensure_user(store, "val", Role.VIEWER)
    monkeypatch.setenv(auth.SHARED_ENV, "1")
    monkeypatch.setattr(auth, "proxy_user", lambda: "val")
    monkeypatch.setattr(auth, "proxy_session", lambda: users.get_user(store, "val").session_generation)
    at = open_mode()
    assert any(i.value.startswith("Viewers cannot make models speak") for i in at.info)
    assert not [b for b in at.button if b.label == "Speak"]


# ====================================================================== end to end
@pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK)
@pytest.mark.train
@pytest.mark.subprocess
def test_the_tuned_csm_ends_the_phrase_on_its_own_where_its_base_talks_to_the_cap(app_home, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(ROOT / ".test-cache" / "models"))  # as the studio fixture
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    studio = get_orchestrator()
    cfg = tts_config(tmp_path, max_steps=60, eval_steps=60,
                     method_settings=TtsSettings(max_sample_s=4.0, sample_texts=[PHRASES[0]], eval_on_start=False))
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    run_dir = paths.run_dir(run_id)
    (run_dir / "checkpoints").mkdir(exist_ok=True)  # a checkpoint swapped for a link to weights outside the run
    (run_dir / "checkpoints" / "checkpoint-30").symlink_to(Path(cfg.model_name), target_is_directory=True)
    voice = speak.run_voice(run_id)
    assert voice == speak.RunVoice(speaker=0, max_seconds=4.0)
    started = time.monotonic()
    results = speak.speak(speak.Request(
        sources=(ModelSource(model=cfg.model_name), ModelSource(run_id=run_id), ModelSource(run_id=run_id, checkpoint=30)),
        text=PHRASES[0], speaker=voice.speaker, max_seconds=voice.max_seconds, labels=("base", "tuned", "linked")))
    print(f"\nspoke with 2 models in {time.monotonic() - started:.1f} s")
    base, tuned, linked = results
    assert not base.error and not tuned.error, (base.error, tuned.error)
    # a checkpoint that is a link out of the run is no checkpoint of it (specs/checkpoints): nothing outside is loaded
    assert linked.label == "linked" and not linked.wav
    assert linked.error == "run 'tiny csm' has no checkpoint at step 30: it has no checkpoints"
    for spoken in (base, tuned):
        info = soundfile.info(io.BytesIO(spoken.wav))
        assert (info.samplerate, info.channels, info.format) == (24000, 1, "WAV")
        assert abs(info.duration - spoken.seconds) < 1e-3 and spoken.rate == 24000
    recordings = [soundfile.info(str(p)).duration for p in (tmp_path / "tts" / "train").glob("clip-0-*.wav")]
    print(f"'{PHRASES[0]}': base {base.seconds:.2f} s (ended {base.ended}), tuned {tuned.seconds:.2f} s "
          f"(ended {tuned.ended}); recordings {min(recordings):.2f}-{max(recordings):.2f} s")
    assert not base.ended and abs(base.seconds - voice.max_seconds) < 0.2  # the base does not know when to stop
    assert tuned.ended and 0.5 * min(recordings) <= tuned.seconds <= 1.5 * max(recordings)
    os.unlink(run_dir / "checkpoints" / "checkpoint-30")

    # the same on the page, as a user does it: the run, its base and final model, the phrase typed
    at = open_mode()
    assert at.selectbox(key="pgt_run").value == run_id
    at.text_area(key="pgt_text").input(PHRASES[0]).run()
    next(b for b in at.button if b.label == "Speak").click().run(timeout=180)
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert [m.value for m in at.markdown if m.value.startswith("**")][-2:] == \
        [f"**Base · {safe(cfg.model_name)}**", "**tiny csm · final**"]
    players = at.get("audio")
    assert len(players) == 2
    captions = [c.value for c in at.caption if " s · " in c.value]
    assert captions == [f"{base.seconds:.2f} s · talked to the 4 s cap", f"{tuned.seconds:.2f} s · ended on its own"]
    downloads = at.get("download_button")
    assert len(downloads) == 2


def test_a_second_speak_while_one_runs_is_refused_naming_why(home, tmp_path, monkeypatch):
    """Each Speak loads up to three models in a child: one at a time per server (hostile review: concurrent clicks
    each loaded three CSM-1Bs)."""
    assert speak._BUSY.acquire(blocking=False)
    try:
        with pytest.raises(speak.SpeakError) as info:
            speak.speak(request(sources=(ModelSource(model=str(tmp_path / "csm")),), text="hi"))
        assert [(e.field, e.message) for e in info.value.errors] == [
            ("speak", "another Speak is running on this server: try again when it ends")]
    finally:
        speak._BUSY.release()
