"""A transcription endpoint decodes the clip it was sent, and only that (issue 31 #3): transformers serve hands the
uploaded bytes, base64-encoded, to ``load_audio``, which opens the string as a path when such a file exists. Bytes
whose base64 is ``//tmp/.../name`` start with an MP3 frame sync (0xFF 0xFB), so the gate takes them for audio: the
server transcribed a WAV outside every allowed root (200) and answered 500 for a missing one (an existence oracle).

Through the real app (transformers serve behind the key gate, a tiny Whisper) and the official ``openai`` client, in a
child process (the pytest process plays the dashboard, which never imports torch)."""
from __future__ import annotations

import io
import os
import secrets
from pathlib import Path

import pytest

from tests.support.speech import build_tiny_whisper
from tests.support import run_in_child

pytestmark = pytest.mark.subprocess

KEY = "speech-key-31"


def wav_bytes(seconds: float = 1.0, rate: int = 22050) -> bytes:
    import numpy as np
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype("float32"), rate, format="WAV")
    return buffer.getvalue()


def path_as_clip(path: str) -> bytes:
    """Bytes whose base64 is exactly ``path`` (base64 characters only, a multiple of 4 long)."""
    import base64

    data = base64.b64decode(path, validate=True)
    assert base64.b64encode(data).decode() == path
    return data


def served_clips_child(whisper: str, work: str) -> None:
    import base64

    import openai
    from starlette.testclient import TestClient

    from trainer_core.serving.gate import GateConfig, KeyGate, looks_like_audio
    from trainer_core.serving.spec import hash_key
    from trainer_core.worker.serve import build_transformers_app

    os.chdir(work)
    os.symlink(whisper, "whisper")  # as the serve worker links its models: a name relative to the cwd
    app, manager = build_transformers_app("cpu")
    manager.load_model_and_processor(manager.process_model_name("whisper"))
    config = GateConfig(key_hash=hash_key(KEY), models={"whisper": whisper}, speech_models=["whisper"])
    outside = Path("/tmp") / f"fsclip{secrets.token_hex(8)}"  # outside every allowed root
    outside.mkdir()
    try:
        existing = "/" + str(outside / "heardxy")  # //tmp/fsclip<16 hex>/heardxy: 36 base64 characters
        missing = existing[:-7] + "goneabc"
        Path(existing).write_bytes(wav_bytes())
        with TestClient(KeyGate(app, config), raise_server_exceptions=False) as http:
            client = openai.OpenAI(api_key=KEY, base_url="http://testserver/v1", http_client=http, max_retries=0)
            # an honest clip (22.05 kHz, resampled to the model's 16 kHz) is decoded and transcribed
            heard = client.audio.transcriptions.create(model="whisper", file=("clip.wav", wav_bytes()))
            assert isinstance(heard.text, str)
            refusals = []
            for path in (existing, missing):
                clip = path_as_clip(path)
                assert looks_like_audio(clip) and base64.b64encode(clip).decode().startswith("//")
                with pytest.raises(openai.BadRequestError) as info:
                    client.audio.transcriptions.create(model="whisper", file=("clip.mp3", clip))
                refusals.append(info.value.response.json())
            with pytest.raises(openai.BadRequestError, match="No 'data' chunk marker"):  # a header, no samples
                client.audio.transcriptions.create(model="whisper", file=("clip.wav", wav_bytes()[:40]))
        # the same 400 whether such a file exists or not: no existence oracle, and nothing was opened
        assert refusals[0] == refusals[1], refusals
        message = str(refusals[0])
        assert "does not decode as audio" in message and "send a WAV, FLAC, OGG or MP3 clip" in message, message
        assert str(outside) not in message and "exist" not in message
    finally:
        for child in outside.iterdir():
            child.unlink()
        outside.rmdir()


def test_a_clip_is_decoded_from_its_bytes_never_opened_as_a_path(tmp_path):
    whisper = build_tiny_whisper()
    run_in_child(served_clips_child, str(whisper), str(tmp_path))
