"""Text-to-speech (worker half): Sesame CSM tuned with a transformers.Trainer on codec frames cached on disk.

The model is loaded here (the method's ``loads_own_model``): CsmForConditionalGeneration + its processor, the Mimi
codec frozen inside it. Before training every clip is decoded (soundfile), resampled to the codec's rate and encoded
to frames of codebook ids once; the frames are cached under ``<data_root>/cache/codec/<codec fingerprint>/`` by the
clip's content, so a second run on the same clips (or a resume) never runs the encoder again, and a training step
never does (transformers' CSM forward would encode every clip at every step).

A row becomes the model's own prompt (the processor's chat template: ``[speaker]text`` then one audio placeholder
per frame and the audio end), its frames placed at the placeholders. The loss is transformers' CSM loss: the
backbone predicts each frame's first codebook (and the all-zero end frame), the depth decoder the others, on
``tts.depth_decoder_ratio`` of the frames. Samples at each evaluation and at the end are spoken WAV clips written to
``<run>/samples/`` and reported as SampleEvents with their path.

Kept whole: a method's worker half is one module by the method contract (trainer_core/worker/methods/__init__.py):
loading, the codec cache, the collator and trainer, speaking and the spoken samples, and the preview all work on the
same frames.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import soundfile
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoProcessor, CsmForConditionalGeneration, Trainer, TrainingArguments

from trainer_core.config import TrainConfig
from trainer_core.methods.tts import TtsSettings
from trainer_core.protocol import control, events as ev, paths
from trainer_core.worker.methods.stt import decode

CACHE_FORMAT = 1  # bump when encode_clip changes what it stores
FRAMES_PER_S = 12.5  # Mimi: 24 kHz audio, 1920 samples a frame
SEED = 1234  # samples are drawn with this seed (CSM samples its frames), the training RNG restored after


def load_model(cfg: TrainConfig, model_ref: str, token: str | None, warn=print):
    """(model, processor). A model that is not CSM is refused naming model_name."""
    config = AutoConfig.from_pretrained(model_ref, token=token, trust_remote_code=cfg.trust_remote_code)
    if getattr(config, "model_type", "") != "csm":
        raise ValueError(f"model_name: {cfg.model_label} is not a text-to-speech model "
                         f"({getattr(config, 'model_type', 'unknown')}): method tts trains Sesame CSM models, e.g. "
                         "sesame/csm-1b")
    processor = AutoProcessor.from_pretrained(model_ref, token=token, trust_remote_code=cfg.trust_remote_code)
    dtype = torch.float32  # full fine-tuning keeps fp32 master weights; a frozen base under LoRA may sit lower
    if cfg.effective_use_lora and torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    model = CsmForConditionalGeneration.from_pretrained(model_ref, token=token, dtype=dtype,
                                                        trust_remote_code=cfg.trust_remote_code)
    model.codec_model.requires_grad_(False)  # the codec turns audio into frames and back: never trained
    model.codec_model.eval()
    return model, processor


def shape_rows(rows: list[dict], cfg: TrainConfig) -> tuple[list[dict], dict[str, int]]:
    """Rows are already canonical {audio, text, speaker} (trainer_core.data.audio)."""
    return list(rows), {}


# ---------------------------------------------------------------------- codec frames, cached
def codec_rate(processor) -> int:
    return int(processor.feature_extractor.sampling_rate)


def codec_fingerprint(model) -> str:
    """A hash of the codec's config and weights: frames cached under another codec are never reused."""
    digest = hashlib.sha256(json.dumps(model.codec_model.config.to_dict(), sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.codec_model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:24]


def clip_key(ref: Any) -> str:
    """A hash of a clip's content: the file's bytes, the bytes given, or a decoded array and its rate."""
    digest = hashlib.sha256(f"format {CACHE_FORMAT}".encode())
    if isinstance(ref, dict) and ref.get("array") is not None:
        digest.update(np.asarray(ref["array"], dtype=np.float32).tobytes())
        digest.update(str(ref.get("sampling_rate")).encode())
    else:
        if isinstance(ref, dict):
            ref = ref.get("bytes") or ref.get("path")
        if isinstance(ref, (bytes, bytearray)):
            digest.update(bytes(ref))
        else:
            with open(ref, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:32]


def cache_folder(fingerprint: str) -> Path:
    folder = paths.data_root() / "cache" / "codec" / fingerprint
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def encode_clip(model, samples: np.ndarray) -> np.ndarray:
    """A clip (mono float32 at the codec's rate) -> frames x codebooks of codebook ids."""
    codec = model.codec_model
    values = torch.from_numpy(samples).to(codec.device, codec.dtype)[None, None]
    with torch.no_grad():
        codes = codec.encode(values).audio_codes  # (1, codebooks, frames)
    return codes[0].transpose(0, 1).to(torch.int32).cpu().numpy()


def frames_of(rows, model, processor, log=print) -> list[np.ndarray]:
    """Every row's frames, from the cache or encoded now (and cached: written beside and renamed)."""
    folder = cache_folder(codec_fingerprint(model))
    rate, hits, started, out = codec_rate(processor), 0, time.monotonic(), []
    config = _csm(model).config
    for row in rows:
        path = folder / f"{clip_key(row['audio'])}.npy"
        try:
            frames = np.load(path, allow_pickle=False)
            if not _valid_frames(frames, config.num_codebooks, config.codec_config.codebook_size):
                raise ValueError("not frames of this codec")  # a damaged or replaced entry: encoded again
            hits += 1
        except (OSError, ValueError):
            frames = encode_clip(model, decode(row["audio"], rate))
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npy")
            np.save(tmp, frames, allow_pickle=False)
            os.replace(tmp, path)
        out.append(frames)
    log(f"Codec frames: {len(out)} clips, {hits} from the cache, {len(out) - hits} encoded in "
        f"{time.monotonic() - started:.1f} s ({folder})")
    return out


def _valid_frames(frames: np.ndarray, codebooks: int, codebook_size: int) -> bool:
    return (frames.ndim == 2 and frames.shape[1] == codebooks and np.issubdtype(frames.dtype, np.integer)
            and (frames.size == 0 or (int(frames.min()) >= 0 and int(frames.max()) < codebook_size)))


def encode_dataset(ds: Dataset, model, processor, s: TtsSettings, log=print) -> Dataset:
    """Rows {text, speaker, frames}; a row longer than the model's context (its prompt, frames and ends) is left
    out and counted, and none left is an error naming the fix."""
    rows = list(ds)
    frames = frames_of(rows, model, processor, log)
    limit = int(getattr(_csm(model).config, "max_position_embeddings", 0) or 0)
    kept = {"text": [], "speaker": [], "frames": []}
    for row, codes in zip(rows, frames):
        speaker = int(row.get("speaker") if row.get("speaker") is not None else s.speaker)
        length = len(processor.tokenizer(prompt_text(processor, row["text"], speaker, False),
                                         add_special_tokens=False)["input_ids"]) + len(codes) + 2
        if limit and length > limit:
            continue
        kept["text"].append(row["text"])
        kept["speaker"].append(speaker)
        kept["frames"].append(codes.tolist())
    left_out = len(rows) - len(kept["text"])
    if left_out:
        log(f"warning: {left_out} of {len(rows)} rows are longer than the model's {limit} positions (text and "
            "frames) and are left out: lower tts.max_clip_s or split long clips and their texts")
    if rows and not kept["text"]:
        raise ValueError(f"tts.max_clip_s: every row is longer than the model's {limit} positions (text and codec "
                         "frames, 12.5 a second): use shorter clips, each with its own text")
    return Dataset.from_dict(kept)


# ---------------------------------------------------------------------- prompts
def prompt_text(processor, text: str, speaker: int, with_audio: bool) -> str:
    """The model's own prompt for one utterance (its processor's chat template): with the audio placeholder (and
    the audio end) for training, without it for speaking."""
    content = [{"type": "text", "text": text}, *([{"type": "audio"}] if with_audio else [])]
    return processor.apply_chat_template([{"role": str(speaker), "content": content}], tokenize=False)


@dataclass
class FramesCollator:
    """Rows {text, speaker, frames} -> input_ids (one audio placeholder per frame), the frame ids at the placeholders
    and at the audio end (``frames`` + ``audio_mask``), and 3-D labels (frames x codebooks; -100 elsewhere), right
    padded. A frame left out of the depth decoder's share keeps only its first codebook as a label."""

    processor: Any
    num_codebooks: int
    eos_code: int
    depth_ratio: float = 1.0

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        tokenizer = self.processor.tokenizer
        audio_token, audio_id = self.processor.audio_token, self.processor.audio_token_id
        eos_id = self.processor.audio_eos_token_id
        sequences = []
        for f in features:
            frames = torch.tensor(f["frames"], dtype=torch.long).reshape(-1, self.num_codebooks)
            before, after = prompt_text(self.processor, f["text"], f["speaker"], True).split(audio_token, 1)
            head = tokenizer(before, add_special_tokens=False)["input_ids"]
            tail = tokenizer(after, add_special_tokens=False)["input_ids"]
            ids = torch.tensor(head + [audio_id] * len(frames) + tail, dtype=torch.long)
            placed = torch.zeros(len(ids), self.num_codebooks, dtype=torch.long)
            placed[len(head):len(head) + len(frames)] = frames
            ends = ids == eos_id
            placed[ends] = self.eos_code
            labels = torch.full_like(placed, -100)
            audio = (ids == audio_id) | ends
            labels[audio] = placed[audio]
            if self.depth_ratio < 1.0 and len(frames):
                skip = torch.randperm(len(frames))[:int(len(frames) * (1 - self.depth_ratio))] + len(head)
                labels[skip, 1:] = -100
            sequences.append((ids, placed, labels, audio))
        width = max(len(ids) for ids, *_ in sequences)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        batch = {"input_ids": torch.full((len(sequences), width), pad, dtype=torch.long),
                 "attention_mask": torch.zeros(len(sequences), width, dtype=torch.long),
                 "frames": torch.zeros(len(sequences), width, self.num_codebooks, dtype=torch.long),
                 "labels": torch.full((len(sequences), width, self.num_codebooks), -100, dtype=torch.long),
                 "audio_mask": torch.zeros(len(sequences), width, dtype=torch.bool)}
        for i, (ids, placed, labels, audio) in enumerate(sequences):
            n = len(ids)
            batch["input_ids"][i, :n], batch["attention_mask"][i, :n] = ids, 1
            batch["frames"][i, :n], batch["labels"][i, :n], batch["audio_mask"][i, :n] = placed, labels, audio
        return batch


def _csm(model):
    """The CsmForConditionalGeneration under DDP and PEFT wrappers."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class FramesTrainer(Trainer):
    """A transformers.Trainer whose inputs are cached frames: the embeddings are put together here (text tokens
    from the text table, each frame as the sum of its codebooks' embeddings, as CSM does) and the model computes
    its own loss from the 3-D labels."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        csm = _csm(model)
        text = csm.embed_text_tokens(inputs["input_ids"])
        frames = csm.backbone_model.embed_tokens(inputs["frames"])
        embeds = torch.where(inputs["audio_mask"].unsqueeze(-1), frames.to(text.dtype), text)
        outputs = model(inputs_embeds=embeds, attention_mask=inputs["attention_mask"], labels=inputs["labels"],
                        use_cache=False)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


def lora_targets(model, names: list[str]) -> list[str]:
    """The full names of the backbone's and depth decoder's linear layers whose last part is in ``names`` (the
    codec's attention layers share the names and stay out)."""
    wanted = set(names)
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in wanted
            and not name.startswith("codec_model")]


def build_trainer(cfg: TrainConfig, model, processor, train_ds: Dataset, eval_ds: Dataset | None,
                  args: dict[str, Any], callbacks: list, peft_config) -> Trainer:
    s = cfg.method_settings
    log = print
    train_ds = encode_dataset(train_ds, model, processor, s, log)
    has_eval = eval_ds is not None and len(eval_ds) > 0
    eval_ds = encode_dataset(eval_ds, model, processor, s, log) if has_eval else None
    if cfg.effective_use_lora:
        targets = lora_targets(model, list(s.lora_target_modules))
        if not targets:
            raise ValueError(f"tts.lora_target_modules: none of {list(s.lora_target_modules)} names a linear layer "
                             "of the backbone or the depth decoder (e.g. q_proj, v_proj)")
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                                 use_rslora=cfg.use_rslora, target_modules=targets, bias="none"))
    shared = dict(args)
    if shared.get("gradient_checkpointing"):
        shared["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    config = TrainingArguments(**shared, remove_unused_columns=False, label_names=["labels"],
                               prediction_loss_only=True, eval_on_start=bool(s.eval_on_start and has_eval))
    csm = _csm(model)
    collator = FramesCollator(processor, csm.config.num_codebooks, int(csm.config.codebook_eos_token_id),
                              s.depth_decoder_ratio)
    trainer = FramesTrainer(model=model, args=config, train_dataset=train_ds, eval_dataset=eval_ds,
                            data_collator=collator, processing_class=processor, callbacks=callbacks)
    trainer.model_accepts_loss_kwargs = False  # the loss is CSM's mean over its own labels; accumulation divides
    return trainer


# ---------------------------------------------------------------------- speaking
def speak(model, processor, text: str, speaker: int, max_seconds: float, seed: int = SEED) -> tuple[np.ndarray, bool]:
    """(the spoken clip as float32 samples at the codec's rate, whether it ended on its own before the cap). CSM
    samples its frames as its generation config says; the seed makes a clip repeatable, and the caller's RNG
    state is restored after."""
    csm = _csm(model)
    device = next(csm.parameters()).device
    inputs = processor.tokenizer(prompt_text(processor, text, speaker, False), add_special_tokens=False,
                                 return_tensors="pt").to(device)
    cap = max(1, int(max_seconds * FRAMES_PER_S))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            codes = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                   max_new_tokens=cap)
    finally:
        if was_training:
            model.train()
    frames = codes[0] if codes.dim() == 3 else codes  # (frames, codebooks)
    eos = int(csm.config.codebook_eos_token_id)
    ended = bool(len(frames)) and bool((frames[-1] == eos).all())
    spoken = frames[:-1] if ended else frames
    if not len(spoken):
        return np.zeros(0, dtype=np.float32), ended
    with torch.no_grad():
        audio = csm.codec_model.decode(spoken.transpose(0, 1).unsqueeze(0).to(device)).audio_values
    return audio[0, 0].float().cpu().numpy(), ended and len(frames) <= cap


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


class SpeechSampler:
    """Speaks the run's sample sentences at the steps SampleCallback picks, into ``<run>/samples/``."""

    def __init__(self, texts: list[str], speaker: int, max_seconds: float, processor, run_dir: Path,
                 emit: Callable[[ev.Event], None], warn: Callable[[str], None], log: Callable[[str], None]):
        self.texts, self.speaker, self.max_seconds = texts, speaker, max_seconds
        self.processor, self.run_dir = processor, run_dir
        self.emit, self.warn, self.log = emit, warn, log
        self.last_step: int | None = None
        self.broken = False

    def take(self, model, step: int) -> None:
        if self.broken or step == self.last_step:
            return
        self.last_step = step
        started = time.monotonic()
        folder = self.run_dir / "samples"
        folder.mkdir(exist_ok=True)
        rate = codec_rate(self.processor)
        try:
            for index, text in enumerate(self.texts):
                clip, ended = speak(model, self.processor, text, self.speaker, self.max_seconds)
                name = f"step-{step:06d}-{index}.wav"
                (folder / name).write_bytes(wav_bytes(clip, rate))
                seconds = len(clip) / rate
                flags = {} if ended else {"no_end": f"spoke until the {self.max_seconds:g} s cap without ending "
                                                    "(raise tts.max_sample_s, or train longer)"}
                self.emit(ev.SampleEvent(step=step, index=index, prompt=text, text=f"{seconds:.2f} s of speech",
                                         new_tokens=int(round(seconds * FRAMES_PER_S)), flags=flags,
                                         audio=f"samples/{name}"))
        except Exception as exc:  # noqa: BLE001 - an optional extra: training goes on without it
            self.broken = True
            self.warn(f"Spoken samples at step {step} failed ({type(exc).__name__}: {str(exc)[:300]}); training goes "
                      "on without samples.")
            return
        self.log(f"spoken samples at step {step}: {len(self.texts)} clips in {time.monotonic() - started:.1f} s")


def sample_texts(cfg: TrainConfig, train_rows: list[dict], eval_rows: list[dict]) -> list[str]:
    s = cfg.method_settings
    if s.sample_texts:
        return [t.strip() for t in s.sample_texts]
    source = eval_rows[:2] if eval_rows else train_rows[:1]
    return [r["text"] for r in source]


def make_sampler(cfg: TrainConfig, processor, train_rows: list[dict], eval_rows: list[dict], worker):
    """The spoken-samples callback of this run (rank 0 only), or None."""
    from trainer_core.worker.samples import SampleCallback

    texts = sample_texts(cfg, train_rows, eval_rows)
    if not texts or worker.rank != 0:
        return None
    s = cfg.method_settings
    sampler = SpeechSampler(texts, s.speaker, s.max_sample_s, processor, worker.run_dir, worker.events.emit,
                            worker.warn, worker.log)

    def cancelled() -> bool:
        action = worker.agreed_action if worker.distributed else worker.requested()
        return action is control.Action.CANCEL

    return SampleCallback(sampler, cfg.sample_every_steps, bool(eval_rows), cancelled)


# ---------------------------------------------------------------------- preview (the New run form's)
def frame_count(seconds: float, rate: int = 24000) -> int:
    """Codec frames a clip becomes: Mimi's own length rule (the processor's), from the clip's duration."""
    from transformers import CsmProcessor

    return int(CsmProcessor._get_encoded_length(int(round(seconds * rate)),
                                                **CsmProcessor.audio_kwargs["encoded_length_kwargs"]))


def preview(cfg: TrainConfig, data, tokenizer, rows_shown: int, tokenizer_label: str):
    """The data preview of a text-to-speech run: each row as the model is trained on it (its prompt with the
    speaker, then the clip's frames), with the clip's duration; every row's length in tokens (text + frames)."""
    from trainer_core.host import parallel
    from trainer_core.data import audio
    from trainer_core.data.preview import Preview, RenderedRow

    s = cfg.method_settings
    rows, eval_rows = data.rows, data.eval_rows
    shown, lengths, tokens, trained = [], [], 0, 0
    for index, row in enumerate(rows):
        seconds = audio.duration_s(row["audio"])
        speaker = row.get("speaker", s.speaker)
        prompt = f"[{speaker}]{row['text']}"
        text_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        frames = frame_count(seconds)
        length = len(text_ids) + frames + 2  # the text, the frames, the text end and the audio end
        lengths.append(length)
        tokens += length
        trained += frames + 1
        if index < rows_shown:
            shown.append(RenderedRow(index=index, text=prompt, num_tokens=length, truncated=False,
                                     segments=((prompt, False), (f" ▶ {frames} audio frames ({seconds:.1f} s) + end", True)),
                                     label=f"{seconds:.1f} s · speaker {speaker}"))
    processes = parallel.process_count(cfg)
    return Preview(
        format=data.train.format, format_reason=data.train.reason, tokenizer=tokenizer_label, rows=tuple(shown),
        lengths=tuple(lengths), max_seq_length=frame_count(s.max_clip_s) + 16, truncated=0, dropped=dict(data.train.dropped),
        total_rows=len(rows), total_tokens=tokens, trained_tokens=trained,
        steps_per_epoch=parallel.steps_per_epoch(len(rows), cfg.batch_size, cfg.gradient_accumulation_steps,
                                                 processes),
        eval_rows=len(eval_rows), processes=processes, global_batch=parallel.global_batch(cfg, processes))
