"""The Playground's speech mode end to end (issue 22): a tiny Whisper trained through the orchestrator on phrases
espeak-ng speaks; on the Playground page (AppTest) the user switches to Speech to text, keeps the default columns
(the run's base model and its final model), loads them (a real serve job: transformers serve's
/v1/audio/transcriptions behind the key gate), records a clip it never heard, and presses Transcribe. The tuned
model writes the phrase; the base model does not. The same server refuses a request without its key."""
from __future__ import annotations

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from tests.speech.test_stt_train import speech_config
from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES, speak
from tests.support import ROOT, wait_until
from trainer_core.protocol.status import RunStatus
from ui import playground as pg
from ui.state import get_orchestrator

pytestmark = [pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK), pytest.mark.train, pytest.mark.subprocess]


def test_a_recorded_clip_is_transcribed_by_the_base_and_the_tuned_model_side_by_side(app_home, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    orch = get_orchestrator()
    run_id = orch.start(speech_config(tmp_path, run_name="spoken commands"))
    snap = orch.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{orch.log_tail(run_id, 80)}"

    at = AppTest.from_file(str(ROOT / "streamlit_app.py"), default_timeout=60)
    at.run()
    at.switch_page("pages/playground.py").run()
    at.button_group(key="pg_mode").set_value("Speech to text").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="pgs_run_0").value == run_id
    assert [at.selectbox(key=f"pgs_version_{i}").value for i in (0, 1)] == ["base", None]  # base | final model
    next(b for b in at.button if b.label == "Load models").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    server = at.session_state["pgs_server"]
    wait_until(lambda: pg.server_state(orch, server["job"]).phase in (pg.READY, pg.FAILED), timeout=300,
               what="the speech server to load")
    state = pg.server_state(orch, server["job"])
    assert state.ready, f"{state.message}\n{state.log_tail}"

    phrase = PHRASES[1]
    clip = speak(phrase, tmp_path / "recorded.wav", speed=170, pitch=52).read_bytes()  # 22.05 kHz: resampled
    at.run()
    at.audio_input(key="pgs_record").set_value(("recorded.wav", clip, "audio/wav")).run()
    next(b for b in at.button if b.label == "Transcribe").click().run(timeout=300)
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    labels = [m.value for m in at.markdown if m.value.startswith("**")]
    transcripts = [t.value for t in at.text]
    print("transcripts:", dict(zip(labels, transcripts)))
    assert len(transcripts) == 2 and labels[1].startswith("**spoken commands · final")
    base, tuned = transcripts
    assert tuned == phrase
    assert base != phrase  # the untrained base writes noise

    refused = httpx.post(f"{state.url}/audio/transcriptions", data={"model": "x"},
                         files={"file": ("c.wav", clip, "audio/wav")}, timeout=30)
    assert refused.status_code == 401
    orch.stop(server["job"])
    orch.wait(server["job"], timeout=60)
