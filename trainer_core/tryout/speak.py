"""Speaking with text-to-speech models (the Playground's "Text to speech" mode, issue 22), dashboard side: the text,
speaker and length cap are checked here, each model source is resolved here (a CSM base model, a tts run's final
model, one of its checkpoints), and the speaking itself happens in a child process
(``python -m trainer_core.worker.speak_child``), as the embedding search does: the dashboard never imports torch.

Each model speaks the same text with the same seed, one after the other; its clip comes back as WAV bytes with its
duration and whether the model ended it on its own (a tuned model should; an untrained one talks to the cap). A model
that cannot be resolved or loaded gets its error in its own result: the others still speak."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from trainer_core import kinds
from trainer_core.auth import access
from trainer_core.kinds.base import SPEAK
from trainer_core.specs import model_source
from trainer_core.methods import tts
from trainer_core.protocol.errors import FieldError
from trainer_core.protocol import files, sandbox

ROOT = Path(__file__).resolve().parents[2]
TEXT_MAX = 500  # characters one request speaks (as tts.sample_texts)
SECONDS_MAX = 60.0  # the longest clip a model may speak (tts.max_sample_s's own limit)
SECONDS_MIN = 0.5
MODELS_MAX = 3
SEED = 1234  # every model draws its frames with this seed (CSM samples): the same request speaks the same clips
SPEAK_TIMEOUT_S = 600.0
WAV_BYTES_MAX = 16 << 20  # 60 s of 24 kHz 16-bit mono is 2.9 MB; anything far bigger is not our child's


_BUSY = threading.Lock()


class SpeakError(ValueError):
    """Why nothing could be spoken; ``errors`` names each field and its fix."""

    def __init__(self, errors: list[FieldError] | str):
        self.errors = errors if isinstance(errors, list) else [FieldError("speak", errors)]
        super().__init__("; ".join(str(e) for e in self.errors))


@dataclass(frozen=True)
class Request:
    sources: tuple[model_source.ModelSource, ...]
    text: str
    speaker: int = 0
    max_seconds: float = 10.0
    labels: tuple[str, ...] = field(default=())  # shown above each model's clip (default: the source's label)


@dataclass(frozen=True)
class Spoken:
    """One model's clip (``wav``: a 16-bit mono WAV file's bytes), or ``error`` saying why it has none."""

    label: str
    wav: bytes = b""
    seconds: float = 0.0
    ended: bool = False  # the model ended the clip itself before the cap
    rate: int = 0
    error: str = ""


@dataclass(frozen=True)
class RunVoice:
    """What a tts run speaks with by default: its speaker id and its sample length cap (tts.speaker,
    tts.max_sample_s)."""

    speaker: int
    max_seconds: float


def run_voice(run_id: str) -> RunVoice:
    """The run's default speaker and cap (SourceError when the run is gone or is not a tts run)."""
    cfg = model_source.run_config(run_id)
    if kinds.of_output(cfg.method_spec.output).playground != SPEAK:
        raise model_source.SourceError(f"run {run_id} was trained with {cfg.method_label}, not text-to-speech: pick "
                                       "a tts run", "run")
    settings: tts.TtsSettings = cfg.method_settings
    return RunVoice(int(settings.speaker), min(float(settings.max_sample_s), SECONDS_MAX))


def problems(request: Request) -> list[FieldError]:
    """Every problem of the request at once, each naming its field and the fix."""
    found = []
    text = request.text if isinstance(request.text, str) else ""
    if not text.strip():
        found.append(FieldError("text", "type the sentence to speak"))
    elif len(text) > TEXT_MAX:
        found.append(FieldError("text", f"{len(text):,} characters is more than the {TEXT_MAX} one request speaks: "
                                        "shorten it or speak it in parts"))
    if "\x00" in text:
        found.append(FieldError("text", "contains a NUL character: remove it"))
    speaker = request.speaker
    if isinstance(speaker, bool) or not isinstance(speaker, int) or not 0 <= speaker <= tts.MAX_SPEAKER:
        found.append(FieldError("speaker", f"a whole number from 0 to {tts.MAX_SPEAKER} (CSM's speaker id), not "
                                           f"{speaker!r}"))
    seconds = request.max_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or not SECONDS_MIN <= seconds <= SECONDS_MAX:
        found.append(FieldError("max_seconds", f"from {SECONDS_MIN:g} to {SECONDS_MAX:g} seconds (the run's "
                                               f"tts.max_sample_s), not {seconds!r}"))
    if not request.sources:
        found.append(FieldError("models", "pick at least one model to speak"))
    elif len(request.sources) > MODELS_MAX:
        found.append(FieldError("models", f"{len(request.sources)} models: pick at most {MODELS_MAX}"))
    return found


def _resolved(source: model_source.ModelSource) -> tuple[model_source.ResolvedSource | None, str, str]:
    """(the source on disk, its label, "") or (None, a label, why it cannot speak): a missing run or weights folder,
    a folder that leads out of its run, a base model outside the allowed folders or one that is not a
    text-to-speech model."""
    try:
        resolved = model_source.resolve(source)
    except model_source.SourceError as exc:
        return None, source.key, str(exc)
    problem = resolved.output_problem
    if problem:
        return None, resolved.label, problem
    if resolved.kind.playground != SPEAK:
        return None, resolved.label, (f"it does not speak (a {resolved.output} model): pick a CSM text-to-speech "
                                      "model or a tts run")
    return resolved, resolved.label, ""


def _env() -> dict[str, str]:
    """The child's environment: no secret (a run's model may carry code it trusts, which would read them; a base
    model from the hub is in the local cache since its run trained on it), offline, and on the CPU: a GPU is a
    device the queue reserves for jobs, which the Playground's speaking is not."""
    return {**access.child_env(os.environ), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "FINETUNE_STUDIO_FORCE_CPU": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def speak(request: Request, timeout_s: float = SPEAK_TIMEOUT_S) -> list[Spoken]:
    """Each source's clip of ``request.text``, in the sources' order (SpeakError when the request is wrong or the
    child cannot run at all; a model's own failure is its Spoken.error)."""
    wrong = problems(request)
    if wrong:
        raise SpeakError(wrong)
    if not _BUSY.acquire(blocking=False):  # one speaking child per server: each loads up to three models
        raise SpeakError([FieldError("speak", "another Speak is running on this server: try again when it ends")])
    try:
        return _speak(request, timeout_s)
    finally:
        _BUSY.release()


def _speak(request: Request, timeout_s: float) -> list[Spoken]:
    wrong = problems(request)
    if wrong:
        raise SpeakError(wrong)
    labels = [request.labels[i] if i < len(request.labels) else "" for i in range(len(request.sources))]
    results: list[Spoken | None] = []
    ready: list[tuple[int, model_source.ResolvedSource]] = []
    for i, source in enumerate(request.sources):
        resolved, label, problem = _resolved(source)
        labels[i] = labels[i] or label
        if resolved is None:
            results.append(Spoken(labels[i], error=problem))
            continue
        results.append(None)
        ready.append((i, resolved))
    if ready:
        for i, spoken in zip([i for i, _ in ready], _run_child(request, [r for _, r in ready],
                                                               [labels[i] for i, _ in ready], timeout_s)):
            results[i] = spoken
    return [r for r in results if r is not None]


def _run_child(request: Request, resolved: list[model_source.ResolvedSource], labels: list[str],
               timeout_s: float) -> list[Spoken]:
    with tempfile.TemporaryDirectory(prefix="finetune-speak-") as folder:
        body = json.dumps({"sources": [r.source.key for r in resolved], "text": request.text,
                           "speaker": request.speaker, "max_seconds": float(request.max_seconds), "seed": SEED,
                           "out_dir": folder})
        try:
            env = _env()
            command = sandbox.child_command([sys.executable, "-m", "trainer_core.worker.speak_child"],
                                            json.loads(body), env, writable=[Path(folder)])
            done = subprocess.run(command, input=body, text=True, capture_output=True, env=env, timeout=timeout_s,
                                  check=False, cwd=os.getcwd())
        except sandbox.SandboxError as exc:
            raise SpeakError(str(exc)) from None
        except subprocess.TimeoutExpired:
            raise SpeakError(f"speaking took longer than {timeout_s:.0f} s: speak shorter text, lower the cap, or "
                             "pick fewer models") from None
        reply = files.last_json_line(done.stdout)
        clips = reply.get("clips") if isinstance(reply, dict) else None
        if not isinstance(clips, list) or len(clips) != len(resolved):
            raise SpeakError(f"the speaking process failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
        # each clip is read from the file this process named (<index>.wav in its own folder), never from a path the
        # child reports
        return [_clip(labels[i], clip, Path(folder) / f"{i}.wav") for i, clip in enumerate(clips)]


def _clip(label: str, clip: object, path: Path) -> Spoken:
    if not isinstance(clip, dict) or clip.get("error"):
        return Spoken(label, error=str(clip.get("error") if isinstance(clip, dict) else "no answer")[:800])
    try:
        if path.stat().st_size > WAV_BYTES_MAX:
            return Spoken(label, error=f"the clip is larger than {WAV_BYTES_MAX >> 20} MB")
        wav = path.read_bytes()
        return Spoken(label, wav=wav, seconds=float(clip["seconds"]), ended=bool(clip["ended"]),
                      rate=int(clip["rate"]))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        return Spoken(label, error=f"its clip cannot be read ({type(exc).__name__}: {exc})"[:800])


def wav_name(label: str, text: str) -> str:
    """A download's file name: the model's label and the text's first words, slugged."""
    return f"{model_source.slug(label) or 'model'}-{model_source.slug(text)[:40].strip('-') or 'speech'}.wav"
