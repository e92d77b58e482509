"""The data fingerprint Resume checks (issue 31 #15): the bytes of the files a run reads and of every image and clip
their rows name, so a recoloured picture or a replaced clip under the same name is other data; and the fingerprint
the worker takes of what it loaded is the one the dashboard takes of the same files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile
from PIL import Image

from trainer_core.config import TrainConfig
from trainer_core.data.fingerprint import (Fingerprint, change_warning, data_fingerprint, load_with_fingerprint,
                                         read_checked, take, write_checked)

BASE = Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tone(path: Path, hz: float) -> Path:
    t = np.arange(8000) / 16000
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 16000, format="WAV")
    return path


def whisper_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper", "d_model": 64,
                                                    "architectures": ["WhisperForConditionalGeneration"]}))
    extractor = {"feature_extractor_type": "WhisperFeatureExtractor", "chunk_length": 30, "sampling_rate": 16000}
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "WhisperProcessor",
                                                              "feature_extractor": extractor}))
    return folder


def test_a_recoloured_image_under_the_same_name_is_other_data(home, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    Image.new("RGB", (8, 8), "red").save(folder / "a.png")
    train = write_jsonl(folder / "train.jsonl", [{"image": "a.png", "question": "colour?", "answer": "red"}] * 4)
    cfg = TrainConfig(model_name=str(BASE), local_datasets=[str(train)], eval_fraction=0.0)
    before = data_fingerprint(cfg)
    assert data_fingerprint(cfg) == before
    Image.new("RGB", (8, 8), "blue").save(folder / "a.png")
    assert data_fingerprint(cfg) != before


def test_a_replaced_clip_under_the_same_name_is_other_data(home, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    tone(folder / "a.wav", 440)
    train = write_jsonl(folder / "train.jsonl", [{"audio": "a.wav", "text": "a tone"}] * 4)
    cfg = TrainConfig(model_name=str(whisper_folder(tmp_path / "whisper")), method="stt", adapter="full",
                      local_datasets=[str(train)], eval_fraction=0.0)
    before = data_fingerprint(cfg)
    tone(folder / "a.wav", 880)
    assert data_fingerprint(cfg) != before


def test_what_the_worker_loads_carries_the_fingerprint_the_dashboard_takes(home, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(300)]
    train = write_jsonl(tmp_path / "data" / "chat.jsonl", rows)
    cfg = TrainConfig(model_name=str(BASE), local_datasets=[str(train)], eval_fraction=0.0)
    checked = take(cfg)
    assert checked.rows == 300
    data, loaded = load_with_fingerprint(cfg)
    assert loaded == checked and len(data.rows) == 300
    write_jsonl(train, rows[:3])  # cut at a line boundary: still valid, 3 rows of 300
    data, truncated = load_with_fingerprint(cfg)
    assert (truncated.rows, len(data.rows)) == (3, 3)
    assert truncated.digest != checked.digest and truncated == take(cfg)


def test_the_fingerprint_checked_at_submit_is_kept_in_the_run_folder(tmp_path):
    assert read_checked(tmp_path) is None
    write_checked(tmp_path, take(TrainConfig(hf_dataset="org/set")))
    assert read_checked(tmp_path) == take(TrainConfig(hf_dataset="org/set"))


def test_data_changed_since_the_check_is_a_warning_with_both_row_counts():
    checked = Fingerprint("a" * 32, 300)
    assert change_warning(checked, checked) is None
    assert change_warning(None, checked) is None  # a run from before the check was kept
    assert change_warning(checked, Fingerprint("b" * 32, 3)) == (
        "The training data changed after it was checked when the run was queued or started (300 rows then, 3 now): "
        "this run trains on the data as loaded now, and Resume checks the files against that.")
