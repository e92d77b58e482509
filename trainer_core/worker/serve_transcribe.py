"""transformers serve's transcription route with the clip decoded here, from the bytes the request carried.

transformers serve (5.24) base64-encodes the uploaded clip and hands the string to ``load_audio``, which opens it as
a path when such a file exists: bytes whose base64 reads ``//tmp/x/y`` (they start with an MP3 frame sync, so they
pass for audio) made the server transcribe a file outside every allowed root, and answer 500 for a missing one (an
existence oracle; issue 31 #3). Here the clip is decoded in memory (soundfile, as training decodes it, and resampled
the way training resamples: worker/methods/stt.py), and the processor gets the array: nothing is ever opened by name.
A clip that does not decode is a 400 in OpenAI's error shape naming why, whatever its bytes spell.
"""
from __future__ import annotations

import io
import math

import numpy as np
import soundfile
from fastapi.responses import JSONResponse
from transformers.cli.serving.transcription import TranscriptionHandler

from trainer_core.worker.methods.stt import decode

FIX = "send a WAV, FLAC, OGG or MP3 clip"
MARGIN_S = 1.0  # read past the model's window, so resampling near its end sees the samples that follow


class ClipRefused(ValueError):
    """The uploaded clip does not decode; the message says why and what to send."""


def clip_samples(data: bytes, rate: int, max_seconds: float | None = None) -> np.ndarray:
    """The clip's samples: mono float32 at ``rate`` Hz, at most ``max_seconds`` (plus a margin) of them read;
    ClipRefused when the bytes are not audio soundfile decodes."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as clip:
            source_rate = clip.samplerate
            frames = math.ceil((max_seconds + MARGIN_S) * source_rate) if max_seconds else -1
            samples = clip.read(frames, dtype="float32", always_2d=True)
    except soundfile.LibsndfileError as exc:
        raise ClipRefused(f"the 'file' does not decode as audio ({_reason(exc.error_string)}): {FIX}") from None
    except (RuntimeError, TypeError, ValueError, EOFError) as exc:  # soundfile's own checks on a broken header
        raise ClipRefused(f"the 'file' does not decode as audio ({type(exc).__name__}: {str(exc)[:200]}): "
                          f"{FIX}") from None
    if not len(samples) or source_rate <= 0:
        raise ClipRefused(f"the 'file' does not decode as audio (it holds no samples): {FIX}")
    if not np.isfinite(samples).all():
        raise ClipRefused(f"the 'file' does not decode as audio (some samples are not finite numbers): {FIX}")
    return decode({"array": samples, "sampling_rate": source_rate}, rate)


def _reason(error: str) -> str:
    """libsndfile's reason, except its words about a file that does not exist (it says so of a stream in memory that
    ends early): the clip was never looked up by name, and a reply must not read like it was."""
    if "exist" in error.lower() or "regular file" in error.lower():
        return "no audio stream could be read from its bytes"
    return error.strip().rstrip(".")[:200]


class ClipTranscriptionHandler(TranscriptionHandler):
    """POST /v1/audio/transcriptions as transformers serve answers it, but with the clip decoded from its bytes."""

    async def handle_request(self, request):
        try:
            return await super().handle_request(request)
        except ClipRefused as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error", "param": "file",
                                           "code": 400}}, status_code=400)

    @staticmethod
    def _prepare_audio_inputs(file_bytes, audio_processor, audio_model) -> dict:
        extractor = audio_processor.feature_extractor
        rate = extractor.sampling_rate
        # the extractor keeps its window (Whisper: chunk_length seconds) and drops the rest: reading only that much
        # bounds the memory a long clip of 25 MB (hours of low-rate MP3) would take, with the same features
        samples = clip_samples(file_bytes, rate, getattr(extractor, "chunk_length", None))
        inputs = audio_processor(samples, sampling_rate=rate, return_tensors="pt").to(audio_model.device)
        inputs["input_features"] = inputs["input_features"].to(audio_model.dtype)
        return inputs
