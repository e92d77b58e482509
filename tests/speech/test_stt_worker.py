"""The stt worker half's parts on their own (in child processes: they import torch): decoding and resampling to the
feature extractor's rate, the collator's labels (prefix tokens, pad masked with -100, the decoder start left to the
model), the error rates, and the data preview of a speech run."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import soundfile

from tests.support.speech import build_tiny_whisper
from tests.support import run_in_child
from trainer_core.methods.stt import SttSettings
from trainer_core.config import TrainConfig
from trainer_core.data.preview import build_preview

pytestmark = pytest.mark.subprocess


def test_collator_decodes_resamples_and_masks_padding(tmp_path):
    model = build_tiny_whisper()
    rate = 22050
    t = np.arange(rate) / rate  # one second at 22.05 kHz, stereo
    clip = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)], axis=1).astype(np.float32) * 0.3
    soundfile.write(tmp_path / "stereo.wav", clip, rate)
    print(run_in_child(collator_checks, str(model), str(tmp_path / "stereo.wav")))


def collator_checks(model: str, wav: str) -> None:
    import torch

    from trainer_core.methods.stt import SttSettings
    from trainer_core.worker.methods.stt import SpeechCollator, decode, error_rates
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    samples = decode(wav, 16000)
    assert samples.dtype == np.float32 and samples.ndim == 1 and len(samples) == 16000  # mono, resampled
    with open(wav, "rb") as handle:  # bytes decode the same as the path
        assert np.allclose(decode(handle.read(), 16000), samples)
    assert len(decode({"array": np.zeros(8000), "sampling_rate": 8000}, 16000)) == 16000

    processor = AutoProcessor.from_pretrained(model)
    whisper = AutoModelForSpeechSeq2Seq.from_pretrained(model)
    from trainer_core.worker.methods.stt import set_language

    set_language(whisper, processor, SttSettings(language="en", task="transcribe"))
    start = whisper.config.decoder_start_token_id
    batch = SpeechCollator(processor, start)([{"audio": wav, "text": "open the door"},
                                              {"audio": wav, "text": "play some music and turn on the light"}])
    assert tuple(batch["input_features"].shape) == (2, 80, 400)  # the tiny model's 4 s window: 400 frames
    labels = batch["labels"]
    tokenizer = processor.tokenizer
    prefix = tokenizer.convert_tokens_to_ids(["<|en|>", "<|transcribe|>", "<|notimestamps|>"])
    assert labels[:, :3].tolist() == [prefix, prefix]  # the start token is the model's to add
    short = labels[0].tolist()
    assert short.count(-100) > 0 and short[-1] == -100  # padding masked
    kept = [i for i in short if i != -100]
    assert kept[-1] == tokenizer.eos_token_id  # the end of text stays: the model learns to stop
    assert tokenizer.decode(kept, skip_special_tokens=True) == "open the door"
    assert -100 not in labels[1].tolist()
    # a LoRA base held in bf16 (on a GPU) takes bf16 features, also when generating outside autocast
    half = SpeechCollator(processor, start, torch.bfloat16)([{"audio": wav, "text": "x"}])["input_features"]
    assert half.dtype == torch.bfloat16
    import copy

    assert copy.deepcopy(whisper).to(torch.bfloat16).generate(input_features=half, max_new_tokens=2).shape[0] == 1

    # an English-only model (whisper-*.en): no language or task token, and generate takes none
    notes = []
    whisper.generation_config.is_multilingual = False
    set_language(whisper, processor, SttSettings(language="de", task="translate"), warn=notes.append)
    assert notes and "English-only" in notes[0]
    labels = SpeechCollator(processor, start)([{"audio": wav, "text": "open the door"}])["labels"]
    assert labels[0, 0].item() == tokenizer.convert_tokens_to_ids("<|notimestamps|>")
    features = SpeechCollator(processor, start)([{"audio": wav, "text": "x"}])["input_features"]
    assert whisper.generate(input_features=features, max_new_tokens=3).shape[0] == 1

    assert error_rates(["Open the door."], ["open the door"]) == {"wer": 0.0, "cer": 0.0}
    rates = error_rates(["open the door", "close the window"], ["open a door", ""])
    assert rates["wer"] == pytest.approx(4 / 6) and 0 < rates["cer"] < 1
    assert error_rates(["..."], ["anything"]) == {}  # no words to score
    print("collator ok")


def test_an_empty_language_is_detected_from_the_training_clips_and_trained_with(tmp_path):
    model = build_tiny_whisper()
    t = np.arange(16000) / 16000
    soundfile.write(tmp_path / "tone.wav", (np.sin(2 * np.pi * 440 * t) * 0.3).astype(np.float32), 16000)
    print(run_in_child(language_checks, str(model), str(tmp_path / "tone.wav")))


def language_checks(model: str, wav: str) -> None:
    from datasets import Dataset
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    from trainer_core.methods.stt import SttSettings
    from trainer_core.worker.methods.stt import SpeechCollator, detect_language, set_language

    processor = AutoProcessor.from_pretrained(model)
    whisper = AutoModelForSpeechSeq2Seq.from_pretrained(model)
    notes: list[str] = []
    set_language(whisper, processor, SttSettings(language=""), warn=notes.append)
    rows = Dataset.from_list([{"audio": wav, "text": "open the door"}] * 3)
    chosen = detect_language(whisper, processor, rows, SttSettings(language=""), warn=notes.append)
    assert chosen.language == "en" and whisper.generation_config.language == "en"
    assert notes == ["stt.language is empty: the clips' language was detected as 'en' (3 of the first 3 training "
                     "clips), and training writes its token, as evaluation and the endpoint will detect it. Set "
                     "stt.language to choose it yourself."]
    labels = SpeechCollator(processor, whisper.config.decoder_start_token_id)([rows[0]])["labels"][0].tolist()
    assert labels[:3] == processor.tokenizer.convert_tokens_to_ids(["<|en|>", "<|transcribe|>", "<|notimestamps|>"])
    assert detect_language(whisper, processor, rows, SttSettings(language="de")).language == "de"  # a choice stays


def test_the_preview_lists_transcripts_with_prefix_tokens_and_durations(home, tmp_path, monkeypatch):
    model = build_tiny_whisper()
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{model.parent}")
    rate = 16000
    rows = []
    for i, seconds in enumerate((1.0, 2.5)):
        soundfile.write(tmp_path / f"c{i}.wav", np.zeros(int(seconds * rate), dtype=np.float32), rate)
        rows.append({"audio": f"c{i}.wav", "text": ["open the door", "play some music"][i]})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TrainConfig(model_name=str(model), method="stt", adapter="full",
                      local_datasets=[str(tmp_path / "train.jsonl")], method_settings=SttSettings(language="en"), batch_size=2)
    preview = build_preview(cfg, rows_shown=2)
    assert preview.format == "speech" and preview.total_rows == 2 and preview.steps_per_epoch == 1
    assert [r.label for r in preview.rows] == ["1.0 s", "2.5 s"]
    assert preview.rows[0].text == ("<|startoftranscript|><|en|><|transcribe|><|notimestamps|>open the door"
                                    "<|endoftext|>")
    assert preview.lengths[0] == preview.rows[0].num_tokens > 5
    assert "2 clips, 3.5 s of speech" in preview.format_reason


def test_a_hub_split_with_the_audio_feature_keeps_its_clips_undecoded_for_the_collator(home, tmp_path):
    soundfile.write(tmp_path / "hub.wav", np.zeros(24000, dtype=np.float32), 48000)
    (tmp_path / "whisper").mkdir()
    (tmp_path / "whisper" / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    print(run_in_child(hub_checks, str(tmp_path)))


def hub_checks(tmp: str) -> None:
    """``datasets.load_dataset`` stands in for the hub (offline): a split whose ``audio`` column is the Audio
    feature, as Common Voice's is. The loader casts it to {bytes, path} (no decoding libraries needed) and the
    collator's decode reads it."""
    import datasets

    from trainer_core.data import loading
    from trainer_core.worker.methods.stt import decode

    wav = f"{tmp}/hub.wav"
    split = datasets.Dataset.from_dict({"audio": [wav], "sentence": ["hello from the hub"], "age": ["twenties"]})
    split = split.cast_column("audio", datasets.Audio(sampling_rate=16000))
    datasets.load_dataset = lambda *args, **kwargs: split
    cfg = TrainConfig(model_name=f"{tmp}/whisper", method="stt", adapter="full", hf_dataset="someone/speech")
    data = loading.load_hub(cfg, "train")
    assert data.format == "speech" and data.reason.endswith("1 clip, 0.5 s of speech"), data.reason
    [row] = data.rows
    # the Audio feature without bytes names a file: it is checked under the allowed roots, and kept as its path
    assert row["text"] == "hello from the hub" and row["audio"] == os.path.realpath(wav)
    assert len(decode(row["audio"], 16000)) == 8000  # 0.5 s at 48 kHz, resampled
    print("hub ok")
