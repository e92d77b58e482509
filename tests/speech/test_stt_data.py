"""Speech data on the dashboard side (no ML imports): audio + transcript rows detected in their layouts, paths
resolved and kept under the allowed roots, long clips left out with counts and the fix, the model and the method
checked before start, and the stt settings validated."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile

from trainer_core.methods.stt import SttSettings
from trainer_core.planning import modality
from trainer_core.config import ConfigError, TrainConfig
from trainer_core.data import DatasetError, audio, loading
from trainer_core.protocol.errors import FieldError

RATE = 22050


def tone(path: Path, seconds: float, rate: int = RATE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate)
    return path


def fake_whisper(folder: Path, window: int = 4) -> Path:
    """The JSON files the dashboard reads to tell a speech model (no weights: nothing here loads them)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper", "d_model": 64,
                                                    "architectures": ["WhisperForConditionalGeneration"]}))
    extractor = {"feature_extractor_type": "WhisperFeatureExtractor", "chunk_length": window, "sampling_rate": 16000}
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "WhisperProcessor",
                                                              "feature_extractor": extractor}))
    return folder


def fake_llama(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def stt_config(model: Path, data: list[str], **fields) -> TrainConfig:
    return TrainConfig(**{"model_name": str(model), "method": "stt", "adapter": "full", "local_datasets": data,
                          **fields})


def test_a_whisper_config_is_a_speech_model_with_its_window_and_rate(home, tmp_path):
    found = modality.detect_modality(str(fake_whisper(tmp_path / "whisper", window=4)))
    assert (found.kind, found.architecture, found.audio_window_s, found.sampling_rate) == (
        modality.SPEECH, "WhisperForConditionalGeneration", 4.0, 16000)
    assert "Speech-to-text model" in found.summary() and "up to 4 s per clip" in found.summary()
    # an old flat preprocessor_config.json (transformers 4) reads the same; 30 s when it says nothing
    assert modality.from_configs({"model_type": "whisper"}, {"chunk_length": 30}).audio_window_s == 30.0
    assert modality.from_configs({"architectures": ["WhisperForConditionalGeneration"]}).kind == modality.SPEECH
    assert modality.from_configs({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}).kind == modality.TEXT


def test_rows_with_paths_and_an_audio_folder_normalise_to_one_shape(home, tmp_path):
    model = fake_whisper(tmp_path / "whisper")
    train = write_jsonl(tmp_path / "data" / "train.jsonl", [
        {"path": "clips/a.wav", "transcript": "open the door", "speaker": 3},
        {"path": "clips/b.wav", "transcript": "close the window"}])
    tone(tmp_path / "data" / "clips" / "a.wav", 1.0)
    tone(tmp_path / "data" / "clips" / "b.wav", 0.5)
    folder = tmp_path / "evalfolder"  # the audiofolder convention: file_name + transcription
    tone(folder / "c.wav", 0.75)
    write_jsonl(folder / "metadata.jsonl", [{"file_name": "c.wav", "transcription": "turn on the light"}])
    cfg = stt_config(model, [str(train)], local_eval_datasets=[str(folder)])
    assert cfg.validate() == [] and loading.check_data(cfg) == []
    data = loading.load_for_training(cfg)
    assert data.train.format == "speech"
    assert data.rows == [{"audio": str(tmp_path / "data" / "clips" / "a.wav"), "text": "open the door"},
                         {"audio": str(tmp_path / "data" / "clips" / "b.wav"), "text": "close the window"}]
    assert data.eval_rows == [{"audio": str(folder / "c.wav"), "text": "turn on the light"}]
    assert data.train.reason == "audio in 'path', transcripts in 'transcript'; 2 clips, 1.5 s of speech"


def test_mapped_columns_and_bytes_in_parquet(home, tmp_path):
    """The datasets Audio feature as Parquet stores it ({bytes, path}) under the user's own column names."""
    model = fake_whisper(tmp_path / "whisper")
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros(8000, dtype=np.float32), 16000, format="WAV")
    path = tmp_path / "data" / "clips.parquet"
    path.parent.mkdir(parents=True)
    pd.DataFrame({"clip": [{"bytes": buffer.getvalue(), "path": "x.wav"}], "words": ["hello there"]}).to_parquet(path)
    cfg = stt_config(model, [str(path)], method_settings=SttSettings(columns={"audio": "clip", "text": "words"}))
    assert cfg.validate() == [] and loading.check_data(cfg) == []
    rows = loading.load_for_training(cfg).rows
    assert rows == [{"audio": buffer.getvalue(), "text": "hello there"}]
    assert audio.duration_s(rows[0]["audio"]) == 0.5


def test_clips_longer_than_the_window_are_left_out_with_counts_and_the_fix(home, tmp_path):
    model = fake_whisper(tmp_path / "whisper", window=4)
    tone(tmp_path / "data" / "short.wav", 2.0)
    tone(tmp_path / "data" / "long.wav", 5.0)
    (tmp_path / "data" / "broken.wav").write_bytes(b"not audio at all")
    train = write_jsonl(tmp_path / "data" / "train.jsonl", [
        {"audio": "short.wav", "text": "fits"}, {"audio": "long.wav", "text": "too long"},
        {"audio": "broken.wav", "text": "unreadable"}, {"audio": "short.wav", "text": "  "}])
    data = loading.load_for_training(stt_config(model, [str(train)]))
    assert [r["text"] for r in data.rows] == ["fits"]
    assert data.train.dropped == {
        "longer than the model's 4 s window (cut the clips into pieces of at most 4 s, each with its own "
        "transcript)": 1,
        "audio that cannot be read (not a WAV/FLAC/OGG/MP3 file soundfile decodes)": 1,
        "no transcript in 'text'": 1}
    assert data.train.drop_warning().startswith("Dropped 3 of 4 training rows: ")


def test_a_path_or_symlink_leading_out_of_the_allowed_roots_is_a_field_error_naming_the_row(home, tmp_path,
                                                                                          monkeypatch):
    model = fake_whisper(tmp_path / "data" / "whisper")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path / "data"))
    secret = tone(tmp_path / "outside" / "secret.wav", 0.5)
    tone(tmp_path / "data" / "ok.wav", 0.5)
    (tmp_path / "data" / "link.wav").symlink_to(secret)
    for ref in ("../outside/secret.wav", "link.wav", str(secret)):
        train = write_jsonl(tmp_path / "data" / "train.jsonl", [{"audio": "ok.wav", "text": "fine"},
                                                                {"audio": ref, "text": "leak"}])
        problems = loading.check_data(stt_config(model, [str(train)]))
        assert len(problems) == 1 and problems[0].field == "local_datasets", problems
        assert problems[0].message.startswith("row 1: ") and "allowed" in problems[0].message, problems[0].message
        assert "Keep audio files" in problems[0].message
    train = write_jsonl(tmp_path / "data" / "train.jsonl", [{"audio": "missing.wav", "text": "gone"}])
    [problem] = loading.check_data(stt_config(model, [str(train)]))
    assert problem.message.startswith("row 0: audio 'missing.wav' does not exist")


def test_the_model_and_the_method_are_checked_against_speech_data(home, tmp_path):
    tone(tmp_path / "data" / "a.wav", 0.5)
    train = write_jsonl(tmp_path / "data" / "train.jsonl", [{"audio": "a.wav", "text": "hello"}])
    llama = fake_llama(tmp_path / "llama")
    assert loading.check_data(stt_config(llama, [str(train)])) == [FieldError(
        "model_name", f"{llama} is not a speech-to-text model (LlamaForCausalLM), but local_datasets holds speech: "
                      "choose a Whisper model (e.g. openai/whisper-tiny, openai/whisper-small)")]
    # audio given to a text method: the fix is method stt
    [problem] = loading.check_data(TrainConfig(model_name=str(llama), local_datasets=[str(train)]))
    assert problem.field == "local_datasets" and "set method: stt" in problem.message
    # text given to stt: the fix names the columns
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": "hello"}]}])
    [problem] = loading.check_data(stt_config(fake_whisper(tmp_path / "whisper"), [str(chat)]))
    assert problem.field == "local_datasets" and "speech-to-text needs an audio column" in problem.message


def test_stt_settings_are_checked_with_field_and_fix(home, tmp_path):
    model = fake_whisper(tmp_path / "whisper")
    with pytest.raises(ConfigError) as info:  # a setting the object cannot hold: refused where the config is read
        TrainConfig.from_dict({"method": "stt", "stt": {"langauge": "en"}})
    assert [e.field for e in info.value.errors] == ["stt.langauge"]
    assert "did you mean 'language'" in info.value.errors[0].message
    cfg = stt_config(model, [], adapter="qlora", packing=True,
                     method_settings=SttSettings(task="summarize", columns={"clip": "audio"}))
    problems = [p for p in cfg.validate() if p.field.startswith("stt") or p.field in ("adapter", "packing")]
    fields = sorted({p.field for p in problems})
    assert fields == ["adapter", "packing", "stt.columns", "stt.task"], problems
    assert FieldError("adapter", "stt trains with lora, full: choose one of them") in problems
    assert TrainConfig(method="stt", is_dataset_audio=True).validate() == TrainConfig(method="stt").validate()


def test_duration_of_a_decoded_clip_needs_its_rate():
    assert audio.duration_s({"array": [0.0] * 16000, "sampling_rate": 16000}) == 1.0
    with pytest.raises(ValueError):
        audio.duration_s({"array": [0.0] * 10})
    with pytest.raises(DatasetError):
        audio.normalize([{"words": "x"}], None, "local_datasets")
