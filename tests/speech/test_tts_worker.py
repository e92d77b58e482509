"""The tts worker half's parts on their own (in a child process: they import torch): the codec cache (a second
encoding of the same clips reads every frame from it; an entry damaged or replaced by a hostile hand is encoded
again, never trained on), the collator (one placeholder per frame, the frames at the placeholders and the end frame
after them, labels only there, right padding), and a row too long for the model's context left out."""
from __future__ import annotations

import pytest

from tests.support.speech import ESPEAK, NO_ESPEAK, PHRASES, build_tiny_csm, speak
from tests.support import run_in_child

pytestmark = [pytest.mark.subprocess, pytest.mark.skipif(ESPEAK is None, reason=NO_ESPEAK)]


def test_codec_cache_collator_and_context_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "home"))
    clips = [speak(p, tmp_path / f"{i}.wav") for i, p in enumerate(PHRASES[:2])]
    print(run_in_child(worker_checks, str(build_tiny_csm()), *map(str, clips)))


def worker_checks(model_dir: str, first: str, second: str) -> None:
    import numpy as np
    import torch
    from datasets import Dataset

    from trainer_core.methods.tts import TtsSettings
    from trainer_core.worker.methods import tts

    model, processor = tts.load_model(_cfg(model_dir), model_dir, None)
    rows = [{"audio": first, "text": "open the door", "speaker": 1}, {"audio": second, "text": "close the window"}]
    logs = []
    encoded = tts.encode_dataset(Dataset.from_list(rows), model, processor, TtsSettings(speaker=0), logs.append)
    assert "2 clips, 0 from the cache, 2 encoded" in logs[-1]
    assert encoded["speaker"] == [1, 0]  # the row's own, else tts.speaker
    again = tts.encode_dataset(Dataset.from_list(rows), model, processor, TtsSettings(), logs.append)
    assert "2 clips, 2 from the cache, 0 encoded" in logs[-1] and again["frames"] == encoded["frames"]

    folder = tts.cache_folder(tts.codec_fingerprint(model))
    damaged, replaced = sorted(folder.glob("*.npy"))
    damaged.write_bytes(damaged.read_bytes()[:40])  # cut short
    np.save(replaced, np.full((3, 4), 999, dtype=np.int32))  # codes this codec does not have
    third = tts.encode_dataset(Dataset.from_list(rows), model, processor, TtsSettings(), logs.append)
    assert "2 clips, 0 from the cache, 2 encoded" in logs[-1] and third["frames"] == encoded["frames"]

    config = model.config
    collator = tts.FramesCollator(processor, config.num_codebooks, config.codebook_eos_token_id)
    batch = collator([encoded[0], encoded[1]])
    frames = [np.array(f) for f in encoded["frames"]]
    for i, codes in enumerate(frames):
        ids = batch["input_ids"][i]
        audio = (ids == processor.audio_token_id).nonzero().flatten()
        assert len(audio) == len(codes)  # one placeholder per frame, in a row
        assert torch.equal(batch["frames"][i, audio], torch.tensor(codes, dtype=torch.long))
        end = (ids == processor.audio_eos_token_id).nonzero().flatten()
        assert end.tolist() == [audio[-1].item() + 1] and bool((batch["frames"][i, end] == 0).all())
        trained = (batch["labels"][i] != -100).any(dim=-1).nonzero().flatten()
        assert trained.tolist() == [*audio.tolist(), end.item()]  # labels only on the frames and the end
    shorter = int(batch["attention_mask"].sum(dim=1).argmin())
    assert batch["attention_mask"][shorter, -1] == 0 and (batch["labels"][shorter, -1] == -100).all()  # right pad
    loss = tts.FramesTrainer.compute_loss(None, model, batch)
    assert torch.isfinite(loss) and loss.item() > 0

    speakers = encoded["speaker"]
    lengths = [len(processor.tokenizer(tts.prompt_text(processor, r["text"], spk, False),
                                       add_special_tokens=False)["input_ids"]) + len(f) + 2
               for r, spk, f in zip(rows, speakers, frames)]
    assert lengths[0] != lengths[1], lengths
    config.max_position_embeddings = min(lengths)  # the shorter row just fits; the longer does not
    kept = tts.encode_dataset(Dataset.from_list(rows), model, processor, TtsSettings(), logs.append)
    assert kept["text"] == [rows[lengths.index(min(lengths))]["text"]]
    assert logs[-1].startswith(f"warning: 1 of 2 rows are longer than the model's {min(lengths)} positions")
    config.max_position_embeddings = min(lengths) - 1
    try:
        tts.encode_dataset(Dataset.from_list(rows), model, processor, TtsSettings(), logs.append)
        raise AssertionError("no row fits, yet training data came back")
    except ValueError as exc:
        assert str(exc).startswith("tts.max_clip_s: every row is longer than the model's"), exc
    print("ok")


def _cfg(model_dir: str):
    from trainer_core.config import TrainConfig

    return TrainConfig(model_name=model_dir, method="tts", adapter="full")
