"""Speech datasets (dashboard side: no ML imports): audio + transcript rows detected, audio file paths resolved and
checked under the allowed roots, and every layout normalised to the one row shape the stt worker half takes::

    {"audio": "/abs/clip.wav" | b"RIFF..." | {"array": [...], "sampling_rate": 16000}, "text": "the transcript"}

plus ``"speaker": int`` for text-to-speech rows (method tts: a ``speaker`` / ``speaker_id`` column, or
``tts.speaker`` for rows without one).

Layouts read: an audio column (``audio``, ``path``, ``file``, ``file_name``, ``audio_path``, ``audio_filepath``:
a file path, raw bytes, or the ``datasets`` Audio feature as stored, ``{"bytes", "path"}`` or decoded
``{"array", "sampling_rate"}``) beside a text column (``text``, ``transcript``, ``transcription``, ``sentence``,
``normalized_text``), or the columns ``stt.columns`` names; and an audio folder with ``metadata.jsonl`` /
``metadata.csv`` (the Hugging Face audiofolder convention: ``file_name`` + ``transcription``). Durations are read
from the file headers (soundfile): clips longer than the model's window cannot be transcribed whole and are
left out, counted, with the fix.
"""
from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from trainer_core import kinds
from trainer_core.data import DatasetError
from trainer_core.data.formats import MAX_DROP_EXAMPLES, NormalizedData, no_usable_rows
from trainer_core.protocol import paths

FORMAT = "speech"
AUDIO_COLUMNS = ("audio", "path", "file", "file_name", "audio_path", "audio_filepath")  # first found wins
TEXT_COLUMNS = ("text", "transcript", "transcription", "sentence", "normalized_text")
SPEAKER_COLUMNS = ("speaker", "speaker_id")
TTS_TEXT_MAX = 1_000  # characters of one text-to-speech row's text  # text-to-speech only: whole numbers, CSM's "[0]" voices
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".w64")
WHISPER_WINDOW_S = 30.0  # Whisper's feature extractor pads or cuts every clip to 30 s
_SAMPLE = 50  # rows looked at to decide whether a dataset holds audio


def _is_audio_value(column: str, value: Any) -> bool:
    """Whether one value looks like a clip: the Audio feature ({bytes, path} or {array, sampling_rate}), bytes in an
    ``audio`` column, or one line naming a file with an audio suffix (prose that ends in ".mp3" is not a clip)."""
    if isinstance(value, dict):
        return bool(value.get("bytes") or value.get("array") is not None
                    or _looks_like_file(value.get("path")))
    if isinstance(value, (bytes, bytearray)):
        return column == "audio"
    return _looks_like_file(value)


def _looks_like_file(value: Any) -> bool:
    if not isinstance(value, str) or len(value) > 4096 or "\n" in value or "\x00" in value:
        return False
    return value.strip().lower().endswith(AUDIO_EXTENSIONS)


def audio_column(rows: list[dict], mapping: dict[str, str] | None = None) -> str | None:
    """The column that holds the clips: ``mapping['audio']`` when given, else the first known name whose values
    look like audio (a file name with an audio suffix, bytes, the Audio feature), else any other column of Audio
    feature values. A column of strings under another name is a clip column only when ``stt.columns`` maps it:
    file names are too easily prose."""
    if mapping and mapping.get("audio"):
        return mapping["audio"]
    sample = [r for r in rows[:_SAMPLE] if isinstance(r, dict)]
    for column in AUDIO_COLUMNS:
        if any(_is_audio_value(column, r.get(column)) for r in sample):
            return column
    others = dict.fromkeys(c for r in sample for c in r if c not in AUDIO_COLUMNS)
    return next((c for c in others if any(isinstance(r.get(c), dict) and _is_audio_value(c, r.get(c))
                                          for r in sample)), None)


def text_column(rows: list[dict], mapping: dict[str, str] | None = None) -> str | None:
    if mapping and mapping.get("text"):
        return mapping["text"]
    for column in TEXT_COLUMNS:
        if any(isinstance(r, dict) and isinstance(r.get(column), str) for r in rows[:_SAMPLE]):
            return column
    return None


def has_audio(rows: list[dict]) -> bool:
    return audio_column(rows) is not None


# ---------------------------------------------------------------------- audio references
def resolve_rows(rows: list[dict], folder: Path | None, field_name: str,
                 mapping: dict[str, str] | None = None) -> list[dict]:
    """The rows with every clip given as a file path made absolute and checked. ``folder``: the dataset file's folder,
    which relative paths are taken from; None for a hub split, whose paths must be absolute and lie under the allowed
    roots or the ``datasets`` cache. A URL, a path or symlink that leads outside the roots, or a missing file is a
    DatasetError naming the row. ``mapping``: ``stt.columns`` (a mapped audio column is resolved like a known one).
    Rows without audio are returned as they are."""
    column = audio_column(rows, mapping)
    if column is None:
        return rows
    roots = paths.data_ref_roots(folder)
    out = []
    for index, row in enumerate(rows):
        if isinstance(row, dict) and row.get(column) not in (None, ""):
            row = {**row, column: _resolve_ref(row[column], folder, roots, field_name, index)}
        out.append(row)
    return out


def _resolve_ref(ref: Any, folder: Path | None, roots: list[Path], field_name: str, index: int) -> Any:
    if isinstance(ref, dict) and ref.get("bytes"):  # the datasets Audio feature as stored in parquet
        return bytes(ref["bytes"])
    if isinstance(ref, dict) and ref.get("array") is not None:
        return ref  # decoded already: {"array", "sampling_rate"}
    if isinstance(ref, dict) and ref.get("path"):
        ref = ref["path"]
    if not isinstance(ref, str):
        return ref
    text = ref.strip()
    if text.lower().startswith(("http://", "https://", "ftp://", "data:")):
        raise DatasetError(field_name, f"row {index}: audio {text[:80]!r} is a URL; clips are not fetched: save them "
                                       "next to the dataset file and refer to them by relative path")
    problem = paths.path_problem(text)
    if problem:
        raise DatasetError(field_name, f"row {index}: {problem}")
    candidate = Path(text).expanduser()
    if not candidate.is_absolute():
        if folder is None:
            raise DatasetError(field_name, f"row {index}: audio {text[:80]!r} is a relative path in a hub split, which "
                                           "has no folder to take it from: use the datasets Audio feature (bytes)")
        candidate = folder / candidate
    try:
        resolved = paths.resolve_data_ref(candidate, roots)
    except paths.UnsafePathError as exc:
        raise DatasetError(field_name, f"row {index}: {exc}. Keep audio files (and what their links point to) "
                                       f"{paths.DATA_REF_PLACES}.") from None
    if not resolved.is_file():
        raise DatasetError(field_name, f"row {index}: audio {text[:80]!r} does not exist ({resolved}): check the "
                                       "path, which is taken from the dataset file's folder")
    return str(resolved)


def duration_s(ref: Any) -> float:
    """Seconds of audio in a clip (a resolved path, bytes or a decoded array), from the header where there is one.
    Raises ValueError when the clip cannot be read."""
    if isinstance(ref, dict) and ref.get("array") is not None:
        rate = ref.get("sampling_rate")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate >= 1 or rate != int(rate):
            raise ValueError("a decoded clip needs its sampling_rate: a whole number of samples per second, "
                             "at least 1")
        return len(ref["array"]) / float(rate)
    if isinstance(ref, dict):  # the Audio feature undecoded (a hub split): {bytes, path}
        ref = ref.get("bytes") or ref.get("path")
        if not ref:
            raise ValueError("an audio value without bytes or a path")
    try:
        info = soundfile.info(io.BytesIO(bytes(ref)) if isinstance(ref, (bytes, bytearray)) else ref)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, OSError) as exc:
        raise ValueError(str(exc).strip() or type(exc).__name__) from None
    return info.frames / float(info.samplerate)


PLAYER_MAX_S = 60.0  # seconds of a clip a player gets (the longest window any model here takes is 30 s)
PLAYER_MAX_SAMPLES = 4_000_000  # frames x channels decoded at most, whatever the sample rate claims (16 MB)


def playable_wav(ref: Any) -> bytes:
    """The first PLAYER_MAX_S seconds of a clip (a resolved path, bytes or a decoded array) decoded and written
    again as 16-bit WAV: what a player may send the browser, never the file's own bytes (which could carry anything
    after a valid header). Reads at most PLAYER_MAX_SAMPLES samples, never the whole file. ValueError when the
    clip does not decode."""
    if isinstance(ref, dict) and ref.get("array") is not None:
        seconds = duration_s(ref)  # checks the sampling rate
        rate = int(ref["sampling_rate"])
        kept = ref["array"][:min(int(min(seconds, PLAYER_MAX_S) * rate), PLAYER_MAX_SAMPLES)]
        samples = np.clip(np.asarray(kept, dtype=np.float32), -1.0, 1.0)
    else:
        source = io.BytesIO(bytes(ref)) if isinstance(ref, (bytes, bytearray)) else ref
        try:
            with soundfile.SoundFile(source) as clip:
                rate = clip.samplerate
                frames = min(clip.frames, int(PLAYER_MAX_S * rate), PLAYER_MAX_SAMPLES // max(clip.channels, 1))
                samples = clip.read(frames, dtype="int16")
        except (soundfile.LibsndfileError, RuntimeError, TypeError, OSError) as exc:
            raise ValueError(str(exc).strip() or type(exc).__name__) from None
    if not len(samples):
        raise ValueError("the clip holds no samples")
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


# ---------------------------------------------------------------------- normalisation
def too_long_reason(window_s: float) -> str:
    return (f"longer than the model's {window_s:g} s window (cut the clips into pieces of at most {window_s:g} s, "
            "each with its own transcript)")


def normalize(rows: list[dict], mapping: dict[str, str] | None, field_name: str, allow_empty: bool = False,
              window_s: float = WHISPER_WINDOW_S, method: str = "stt", speaker: int | None = None) -> NormalizedData:
    """Audio rows in the one speech shape (module docstring); unusable rows are dropped and counted: no clip, no
    transcript, a clip that cannot be read, or one longer than ``window_s``. ``speaker``: text-to-speech (method tts)
    rows get a speaker id, from their speaker column or this default."""
    mapping = {k: v for k, v in (mapping or {}).items() if isinstance(v, str) and v}
    audio, text = audio_column(rows, mapping), text_column(rows, mapping)
    what = "text-to-speech" if method == "tts" else "speech-to-text"
    if audio is None or text is None:
        missing = "an audio column" if audio is None else "a text column"
        where = f"{method}.columns" if mapping else field_name
        raise DatasetError(where, f"{what} needs {missing}: give an audio column (audio, path or file) and a "
                                  "text column (text, transcript, transcription or sentence), or map yours with "
                                  f"{method}.columns, e.g. {{audio: clip, text: sentence}}")
    voices = speaker_column(rows, mapping) if speaker is not None else None
    if mapping.get("speaker") and voices is None:
        raise DatasetError(f"{method}.columns", f"maps speaker to '{mapping['speaker']}', which no row has: name "
                                                "the column that holds the speaker ids, or leave speaker out")
    out: list[dict] = []
    dropped: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    seconds = 0.0
    for index, row in enumerate(rows):
        row = row if isinstance(row, dict) else {}
        clip, words = row.get(audio), row.get(text)
        problem = None
        if clip in (None, "", b""):
            problem = f"no audio in '{audio}'"
        elif not isinstance(words, str) or not words.strip():
            problem = f"no transcript in '{text}'"
        elif method == "tts" and len(words) > TTS_TEXT_MAX:
            problem = (f"a text longer than {TTS_TEXT_MAX:,} characters (a clip speaks a sentence or a few: split it "
                       "with its audio)")
        else:
            try:
                length = duration_s(clip)
            except ValueError:
                length, problem = 0.0, "audio that cannot be read (not a WAV/FLAC/OGG/MP3 file soundfile decodes)"
            if not problem and length > window_s:
                problem = too_long_reason(window_s) if method != "tts" else (
                    f"longer than tts.max_clip_s ({window_s:g} s): raise it, or cut the clips into sentences")
        voice = speaker
        if not problem and voices is not None:
            voice = _speaker_id(row.get(voices), speaker)
            if voice is None:
                problem = (f"a speaker in '{voices}' that is not a whole number from 0 to 99 (CSM's voices are "
                           "numbered: map names to numbers)")
        if problem:
            dropped[problem] += 1
            shown = examples.setdefault(problem, [])
            if len(shown) < MAX_DROP_EXAMPLES:
                shown.append(f"row {index}")
            continue
        seconds += length
        out.append({"audio": clip, "text": words.strip(), **({"speaker": voice} if voice is not None else {})})
    clips = f"{len(out)} clip" + ("" if len(out) == 1 else "s")
    reason = f"audio in '{audio}', {'texts' if method == 'tts' else 'transcripts'} in '{text}'"
    if voices is not None:
        reason += f", speakers in '{voices}' ({len({r['speaker'] for r in out})} voices)"
    reason += f"; {clips}, {seconds:.1f} s of speech"
    data = NormalizedData(format=FORMAT, reason=reason, rows=out, dropped=dict(dropped),
                          drop_examples={k: v for k, v in examples.items() if v})
    if not out and not allow_empty:
        raise no_usable_rows(field_name, len(rows), data.dropped)
    return data


def speaker_column(rows: list[dict], mapping: dict[str, str] | None = None) -> str | None:
    """The column of speaker ids (text-to-speech): ``mapping['speaker']`` when given and present, else the first
    known name present in the rows."""
    sample = [r for r in rows[:_SAMPLE] if isinstance(r, dict)]
    names = (mapping["speaker"],) if mapping and mapping.get("speaker") else SPEAKER_COLUMNS
    return next((c for c in names if any(c in r for r in sample)), None)


def _speaker_id(value: Any, default: int | None) -> int | None:
    """A row's speaker id: a whole number 0-99 (an int, or digits as text); an empty cell takes the default."""
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():  # "²" is a digit, not a number
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 0 <= value <= 99 else None


def model_problems(cfg: Any, field_name: str) -> list[DatasetError]:
    """What the model says about speech data before start: a model of the kind the method trains (a Whisper-style
    speech-to-text model for method stt, a CSM text-to-speech model for method tts)."""
    from trainer_core.planning import model_info, modality  # reads the model's config files: only when audio is in play

    try:
        found = modality.detect_modality(cfg.model_name)
    except model_info.ModelInfoError:
        return []  # the model field's own check says what is wrong with it
    wanted = kinds.of_run(getattr(cfg, "method", "stt"))  # the kind the method trains (its row: what to choose)
    if found.kind != wanted.name:
        return [DatasetError("model_name", f"{cfg.model_label} is not a {wanted.label.lower()} model "
                                           f"({found.architecture}), but {field_name} holds speech: "
                                           f"{wanted.method_fix}")]
    return []


def window_of(model_name: str) -> float:
    """The clip length the model's feature extractor takes (its chunk_length; 30 s for Whisper)."""
    from trainer_core.planning import model_info, modality

    try:
        found = modality.detect_modality(model_name)
    except model_info.ModelInfoError:
        return WHISPER_WINDOW_S
    return found.audio_window_s or WHISPER_WINDOW_S
