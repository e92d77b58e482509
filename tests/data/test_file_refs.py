"""File references inside dataset rows (clips, images) from a hostile review: prose that ends in ".mp3" is not a
clip, a clip column named by ``stt.columns`` is checked like a known one, and a hub split's paths are held to the
allowed roots (or the ``datasets`` cache) like a local file's. No ML imports: ``datasets`` is faked."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile
from PIL import Image

from trainer_core.methods.stt import SttSettings
from trainer_core.config import TrainConfig
from trainer_core.data import DatasetError, audio, images, loading
from trainer_core.protocol import paths

BASE = Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tone(path: Path, seconds: float = 0.5, rate: int = 16000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="WAV")
    return path


def fake_whisper(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper", "d_model": 64,
                                                    "architectures": ["WhisperForConditionalGeneration"]}))
    extractor = {"feature_extractor_type": "WhisperFeatureExtractor", "chunk_length": 30, "sampling_rate": 16000}
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "WhisperProcessor",
                                                              "feature_extractor": extractor}))
    return folder


# ---------------------------------------------------------------------- prose is not audio
def test_text_whose_words_end_in_an_audio_suffix_trains_as_text(home, tmp_path):
    """A chat dataset about music files, with a source URL column: before, the 'any column ending in .mp3' guess
    took the prompt (or the URL) for clips and refused the dataset ("holds audio clips" / "is a URL")."""
    rows = [{"instruction": f"Where do I find track{i}.mp3", "output": "In your Music folder.",
             "source": f"https://example.com/podcast/{i}.mp3"} for i in range(4)]
    train = write_jsonl(tmp_path / "chat.jsonl", rows)
    cfg = TrainConfig(local_datasets=[str(train)])
    assert loading.check_data(cfg) == []
    data = loading.load_local(cfg.local_datasets, cfg)
    assert len(data.rows) == 4 and data.format != "speech"


def test_a_multi_line_text_in_a_path_column_is_not_a_clip(home, tmp_path):
    rows = [{"text": "notes", "path": "first line\nthen the file song.mp3"} for _ in range(3)]
    cfg = TrainConfig(local_datasets=[str(write_jsonl(tmp_path / "t.jsonl", rows))])
    assert loading.check_data(cfg) == []


def test_audio_data_for_a_text_method_still_says_to_use_stt(home, tmp_path):
    tone(tmp_path / "a.wav")
    cfg = TrainConfig(local_datasets=[str(write_jsonl(tmp_path / "s.jsonl", [{"audio": "a.wav", "text": "hi"}]))])
    [problem] = loading.check_data(cfg)
    assert "set method: stt" in problem.message


# ---------------------------------------------------------------------- a mapped clip column
def test_a_clip_column_mapped_by_stt_columns_is_held_to_the_allowed_roots(home, tmp_path, monkeypatch):
    """Before, only a known column (audio, path, ...) was resolved: a column mapped with stt.columns reached the
    worker as written, and soundfile opened whatever it named (any file, outside the roots)."""
    data_dir = tmp_path / "data"
    model = fake_whisper(data_dir / "whisper")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(data_dir))
    tone(data_dir / "ok.wav")
    outside = tone(tmp_path / "outside" / "private.bin")  # no audio suffix: no guess would take it for a clip
    # an 'audio' column too (say the raw recordings beside the cleaned clips): the guess without the mapping
    # resolved that one and left the mapped column as written
    train = write_jsonl(data_dir / "train.jsonl", [{"audio": "ok.wav", "clip": "ok.wav", "words": "fine"},
                                                   {"audio": "ok.wav", "clip": str(outside), "words": "leak"}])
    cfg = TrainConfig(model_name=str(model), method="stt", adapter="full", local_datasets=[str(train)],
                      method_settings=SttSettings(columns={"audio": "clip", "text": "words"}))
    [problem] = loading.check_data(cfg)
    assert problem.field == "local_datasets" and problem.message.startswith("row 1: "), problem
    assert "Keep audio files" in problem.message


def test_a_mapped_clip_column_is_read_from_the_dataset_folder(home, tmp_path):
    model = fake_whisper(tmp_path / "whisper")
    tone(tmp_path / "clips" / "a.wav")
    train = write_jsonl(tmp_path / "train.jsonl", [{"clip": "clips/a.wav", "words": "hello"}])
    cfg = TrainConfig(model_name=str(model), method="stt", adapter="full", local_datasets=[str(train)],
                      method_settings=SttSettings(columns={"audio": "clip", "text": "words"}))
    data = loading.load_local(cfg.local_datasets, cfg)
    assert data.rows == [{"audio": str((tmp_path / "clips" / "a.wav").resolve()), "text": "hello"}]


# ---------------------------------------------------------------------- hub splits
class FakeHubDataset:
    features: dict = {}

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def to_list(self):
        return list(self.rows)


def fake_hub(monkeypatch, rows):
    module = types.ModuleType("datasets")
    module.load_dataset = lambda *args, **kwargs: FakeHubDataset(rows)
    module.Audio = type("Audio", (), {})
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_a_hub_split_naming_a_file_outside_the_roots_is_refused(home, tmp_path, monkeypatch):
    """A hub id may be a local folder (hub:/some/dir) whose rows name any file: the worker opened those paths."""
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path / "allowed"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    outside = tone(tmp_path / "elsewhere" / "x.wav")
    model = fake_whisper(tmp_path / "allowed" / "whisper")
    cfg = TrainConfig(model_name=str(model), method="stt", adapter="full", hf_dataset="org/speech",
                      local_datasets=[])
    for ref in ({"bytes": None, "path": str(outside)}, str(outside), "relative/x.wav"):
        fake_hub(monkeypatch, [{"audio": ref, "text": "hi"}])
        with pytest.raises(DatasetError) as info:
            loading.load_hub(cfg, "train")
        assert info.value.field == "hf_dataset" and info.value.message.startswith("row 0: "), info.value.message
    cached = tone(tmp_path / "hf-cache" / "downloads" / "extracted" / "c.wav")  # where datasets puts a split's files
    fake_hub(monkeypatch, [{"audio": {"bytes": None, "path": str(cached)}, "text": "hi"},
                           {"audio": {"bytes": cached.read_bytes(), "path": "c.wav"}, "text": "hi"}])
    rows = loading.load_hub(cfg, "train").rows
    assert rows[0]["audio"] == str(cached.resolve()) and isinstance(rows[1]["audio"], bytes)


def test_a_hub_image_path_outside_the_roots_is_refused(home, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path / "allowed"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    picture = tmp_path / "elsewhere" / "p.png"
    picture.parent.mkdir(parents=True)
    Image.new("RGB", (8, 8), "red").save(picture)
    cfg = TrainConfig(hf_dataset="org/pictures", local_datasets=[])
    fake_hub(monkeypatch, [{"image": {"bytes": None, "path": str(picture)}, "text": "a red square"}])
    with pytest.raises(DatasetError) as info:
        loading.load_hub(cfg, "train")
    assert info.value.field == "hf_dataset" and "allowed" in info.value.message
    stored = [{"image": {"bytes": picture.read_bytes(), "path": "p.png"}, "text": "a red square"}]  # parquet-style
    [row] = loading._resolve_files(stored, None, cfg, "hf_dataset")
    assert row["image"] == picture.read_bytes()


# ---------------------------------------------------------------------- references lead only where user data lives
def _not_data(home: Path, tmp_path: Path) -> dict[str, Path]:
    """Files under the allowed roots that are not user data: the database and its WAL, another run's secrets and
    clip, the dashboard's secrets and a git config beside the dataset, a hidden upload in progress."""
    made = {"database": home / "studio.db", "wal": home / "studio.db-wal", "shm": home / "studio.db-shm",
            "run secrets": home / "runs" / "r1" / ".secrets.json", "run clip": home / "runs" / "r1" / "c.wav",
            "streamlit secrets": tmp_path / ".streamlit" / "secrets.toml", "git config": tmp_path / ".git" / "config",
            "partial upload": home / "datasets" / ".rows.csv.1.ab.part"}
    for path in made.values():
        if path.suffix == ".wav":
            tone(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"SECRET=hunter2\n")
    return made


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_a_dataset_reference_to_the_database_a_run_or_a_secret_is_refused(home, tmp_path, kind):
    """Before, any regular file under the allowed roots was a valid clip or image: the dataset's folder here holds
    the data root, so a row could name studio.db, its WAL, another run's .secrets.json or .git/config, and New run
    played (and /media served) its bytes."""
    for label, target in _not_data(home, tmp_path).items():
        for ref in (str(target), str(target.relative_to(tmp_path))):  # absolute, and relative to the dataset
            rows = [{"image": ref, "text": "t"}] if kind == "image" else [{"audio": ref, "text": "t"}]
            with pytest.raises(DatasetError) as info:
                if kind == "image":
                    images.resolve_rows(rows, tmp_path, "local_datasets")
                else:
                    audio.resolve_rows(rows, tmp_path, "local_datasets", {"audio": "audio", "text": "text"})
            assert info.value.field == "local_datasets" and info.value.message.startswith("row 0: "), (label, ref)
            assert "not user data" in info.value.message, (label, info.value.message)


def test_a_reference_into_the_checkout_is_refused_even_when_the_checkout_is_an_allowed_root(home, tmp_path,
                                                                                          monkeypatch):
    """An admin who allows the checkout (to read its example files) still does not let a dataset's rows name the
    code, its .git or the dashboard's .streamlit folder."""
    checkout = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{checkout}")
    for ref in (str(checkout / "pyproject.toml"), str(checkout / "docs" / "live-view.png")):
        with pytest.raises(DatasetError) as info:
            images.resolve_rows([{"image": ref, "text": "t"}], tmp_path, "local_datasets")
        assert info.value.message.startswith("row 0: "), info.value.message


def test_references_under_the_dataset_folder_and_the_uploads_folder_still_resolve(home, tmp_path):
    picture = tmp_path / "data" / "pics" / "a.png"
    picture.parent.mkdir(parents=True)
    Image.new("RGB", (4, 4), "red").save(picture)
    uploaded = paths.datasets_dir() / "b.png"
    Image.new("RGB", (4, 4), "blue").save(uploaded)
    rows = images.resolve_rows([{"image": "pics/a.png", "text": "t"}, {"image": str(uploaded), "text": "t"}],
                               tmp_path / "data", "local_datasets")
    assert [r["image"] for r in rows] == [str(picture.resolve()), str(uploaded.resolve())]

