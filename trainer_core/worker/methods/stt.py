"""Speech-to-text (worker half): a Whisper-style model tuned with transformers' Seq2SeqTrainer.

The model is loaded here (the method's ``loads_own_model``): AutoModelForSpeechSeq2Seq + AutoProcessor, with the
run's language and task set on the tokenizer's prefix tokens (what training writes before each transcript) and
on the generation config (what evaluation generates after). Clips are decoded (soundfile) and resampled to the
feature extractor's rate (scipy's polyphase resampler) in the collator, batch by batch, so a dataset is never held
as log-mel features in memory; label padding is masked with -100. With an eval split, transcripts are generated
before the first step (the base model's WER) and at every eval step; ``eval_wer`` / ``eval_cer`` (jiwer, on
lower-cased text without punctuation) reach the generic progress callback as eval metrics.
"""
from __future__ import annotations

import io
import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import jiwer
import numpy as np
import soundfile
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from scipy.signal import resample_poly
from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor, Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.models.whisper.english_normalizer import BasicTextNormalizer

from trainer_core.config import TrainConfig
from trainer_core.methods.stt import SttSettings
from trainer_core.worker import model_resolver


def load_model(cfg: TrainConfig, model_ref: str, token: str | None, warn=print):
    """(model, processor). A model that is not speech-to-text is refused naming model_name."""
    resolved = model_resolver.resolve(model_ref, cfg, token)
    if resolved.kind != model_resolver.SPEECH:
        raise ValueError(f"model_name: {cfg.model_label} is not a speech-to-text model ({resolved.model_type}): "
                         "choose a Whisper model, e.g. openai/whisper-tiny")
    s = cfg.method_settings
    processor = AutoProcessor.from_pretrained(model_ref, token=token, trust_remote_code=cfg.trust_remote_code)
    # Full fine-tuning keeps fp32 master weights; a frozen base under LoRA may sit in the compute dtype.
    dtype = torch.float32
    if cfg.effective_use_lora and torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    model = AutoModelForSpeechSeq2Seq.from_pretrained(model_ref, token=token, dtype=dtype,
                                                      trust_remote_code=cfg.trust_remote_code)
    set_language(model, processor, s, warn)
    return model, processor


def set_language(model, processor, s: SttSettings, warn=print) -> None:
    """The language and task as training writes them (the tokenizer's prefix tokens) and as generation starts
    (the generation config; forced_decoder_ids is the old way, cleared so the two never disagree). An English-only
    model (whisper-*.en) has neither token: its transcripts start with <|startoftranscript|><|notimestamps|>, and
    its generate refuses a language or task."""
    config = model.generation_config
    config.forced_decoder_ids = None
    model.config.forced_decoder_ids = None
    tokenizer = processor.tokenizer
    multilingual = bool(getattr(config, "is_multilingual", True))
    if not multilingual:
        if s.language not in ("", "en", "english") or s.task == "translate":
            warn(f"This model is English-only: stt.language {s.language!r} and stt.task {s.task!r} are ignored; it "
                 "transcribes English. Choose a multilingual Whisper (without .en) for other languages.")
        language, task = None, None
    else:
        language, task = s.language or None, s.task
        if not getattr(config, "lang_to_id", None) or not getattr(config, "task_to_id", None):
            raise ValueError("model_name: the model's generation_config.json has no lang_to_id/task_to_id (a Whisper "
                             "generation config from before transformers 4.38): take the model's current files from "
                             "the hub, or copy generation_config.json from the openai/whisper checkpoint of its size")
    if hasattr(tokenizer, "set_prefix_tokens"):
        tokenizer.language, tokenizer.task = language, task  # set_prefix_tokens reads None as "keep the old one"
        tokenizer.set_prefix_tokens(language=language, task=task, predict_timestamps=False)
    config.language, config.task = language, task


def detect_language(model, processor, train_ds: Dataset | None, s: SttSettings, warn=print,
                    clips: int = 8) -> SttSettings:
    """stt.language empty on a multilingual Whisper: the clips' language, detected once from the first training clips
    and trained with. Evaluation, samples, the Playground and the endpoint let the model detect a language and write
    its token; a run trained without one decoded its held-out clips as garbage (issue 31 #22). Trained with the
    detected token, the model detects it again wherever it transcribes, so every path frames transcripts as training
    did. The settings are returned with the language; the model's generation config and the tokenizer carry it."""
    config = model.generation_config
    if s.language or not getattr(config, "is_multilingual", True) or not getattr(config, "lang_to_id", None) \
            or train_ds is None or not len(train_ds):
        return s
    rate = processor.feature_extractor.sampling_rate
    audio = [decode(train_ds[i]["audio"], rate) for i in range(min(clips, len(train_ds)))]
    features = processor.feature_extractor(audio, sampling_rate=rate, return_tensors="pt").input_features
    with torch.no_grad():
        found = model.detect_language(input_features=features.to(model.device, model.dtype)).view(-1).tolist()
    names = {token_id: token.strip("<|>") for token, token_id in config.lang_to_id.items()}
    votes = Counter(names[t] for t in found if t in names)
    if not votes:
        return s
    language, count = votes.most_common(1)[0]
    warn(f"stt.language is empty: the clips' language was detected as {language!r} ({count} of the first "
         f"{len(audio)} training clips), and training writes its token, as evaluation and the endpoint will detect "
         "it. Set stt.language to choose it yourself.")
    chosen = replace(s, language=language)
    set_language(model, processor, chosen, warn)
    return chosen


def shape_rows(rows: list[dict], cfg: TrainConfig) -> tuple[list[dict], dict[str, int]]:
    """Rows are already canonical {audio, text} (trainer_core.data.audio)."""
    return list(rows), {}


# ---------------------------------------------------------------------- audio
def decode(ref: Any, rate: int) -> np.ndarray:
    """A mono float32 clip at ``rate`` Hz from a path, bytes or a decoded {array, sampling_rate}."""
    if isinstance(ref, dict) and ref.get("array") is not None:
        samples, source_rate = np.asarray(ref["array"], dtype=np.float32), int(ref["sampling_rate"])
    else:
        if isinstance(ref, dict):  # the Audio feature undecoded (a hub split): {bytes, path}
            ref = ref.get("bytes") or ref.get("path")
        source = io.BytesIO(ref) if isinstance(ref, (bytes, bytearray)) else ref
        samples, source_rate = soundfile.read(source, dtype="float32", always_2d=True)
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    if source_rate != rate:
        common = math.gcd(source_rate, rate)
        samples = resample_poly(samples, rate // common, source_rate // common).astype(np.float32)
    return samples


@dataclass
class SpeechCollator:
    """Clips -> log-mel input_features; transcripts -> labels (the tokenizer's prefix tokens, the text, end of
    text), padded with -100 so padding never counts in the loss. The decoder start token is left to the model,
    which puts it before the labels itself. Features come in the model's dtype: a LoRA base held in bf16 meets
    them outside autocast too (Seq2SeqTrainer generates at evaluation without it)."""

    processor: Any
    decoder_start_token_id: int
    dtype: torch.dtype = torch.float32

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        extractor = self.processor.feature_extractor
        clips = [decode(f["audio"], extractor.sampling_rate) for f in features]
        batch = extractor(clips, sampling_rate=extractor.sampling_rate, return_tensors="pt")
        tokenizer = self.processor.tokenizer
        labels = tokenizer([f["text"] for f in features], padding=True, return_tensors="pt")
        ids = labels["input_ids"].masked_fill(labels["attention_mask"].ne(1), -100)
        if bool((ids[:, 0] == self.decoder_start_token_id).all()):
            ids = ids[:, 1:]
        return {"input_features": batch["input_features"].to(self.dtype), "labels": ids}


def error_rates(references: list[str], hypotheses: list[str]) -> dict[str, float]:
    """WER and CER (jiwer) on lower-cased text without punctuation (Whisper's basic normaliser); pairs whose
    reference normalises to nothing are left out (an error rate over no words is undefined)."""
    normalize = BasicTextNormalizer()
    pairs = [(normalize(r).strip(), normalize(h).strip()) for r, h in zip(references, hypotheses)]
    pairs = [(r, h) for r, h in pairs if r]
    if not pairs:
        return {}
    refs, hyps = [r for r, _ in pairs], [h for _, h in pairs]
    return {"wer": float(jiwer.wer(refs, hyps)), "cer": float(jiwer.cer(refs, hyps))}


def transcribe(model, processor, clips: list, max_new_tokens: int) -> list[str]:
    """The model's greedy transcripts of a batch of clips (paths, bytes or decoded arrays), each decoded and
    resampled to the processor's rate; the generation config carries the run's language and task."""
    rate = processor.feature_extractor.sampling_rate
    features = processor.feature_extractor([decode(clip, rate) for clip in clips], sampling_rate=rate,
                                           return_tensors="pt").input_features
    # The decoder holds max_target_positions tokens, the forced prefix included (start, language, task and
    # no-timestamps: at most 4): generate refuses a max_new_tokens that overflows it (448 for Whisper).
    room = getattr(model.config, "max_target_positions", 0) - 4
    with torch.no_grad():
        ids = model.generate(input_features=features.to(model.device, model.dtype),
                             max_new_tokens=min(max_new_tokens, room) if room > 0 else max_new_tokens,
                             do_sample=False, num_beams=1)
    return [text.strip() for text in processor.tokenizer.batch_decode(ids, skip_special_tokens=True)]


def alignment(reference: str, hypothesis: str) -> str:
    """jiwer's word alignment of a transcript with its reference (normalised as error_rates normalises), as text:
    REF / HYP lines with S, D and I under the substituted, deleted and inserted words."""
    normalize = BasicTextNormalizer()
    reference, hypothesis = normalize(reference).strip(), normalize(hypothesis).strip()
    if not reference:
        return ""
    if reference == hypothesis:  # jiwer draws nothing for a sentence without an error
        return f"REF: {reference}\nHYP: {hypothesis}"
    text = jiwer.visualize_alignment(jiwer.process_words(reference, hypothesis), show_measures=False)
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("==="))


def make_compute_metrics(tokenizer):
    def compute_metrics(prediction) -> dict[str, float]:
        predictions, label_ids = prediction.predictions, prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        pad = tokenizer.pad_token_id
        predictions = np.where(predictions < 0, pad, predictions)
        label_ids = np.where(label_ids < 0, pad, label_ids)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = tokenizer.batch_decode(label_ids, skip_special_tokens=True)
        return error_rates(references, hypotheses)
    return compute_metrics


def build_trainer(cfg: TrainConfig, model, processor, train_ds: Dataset, eval_ds: Dataset | None,
                  args: dict[str, Any], callbacks: list, peft_config) -> Seq2SeqTrainer:
    s = cfg.method_settings
    detect_language(model, processor, train_ds, s)  # before the collator writes any prefix, and before LoRA
    dtype = model.dtype  # the base's (before LoRA adds fp32 adapters)
    if cfg.effective_use_lora:  # Whisper's own attention names; the engine's causal-LM LoRA config does not fit
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                                 lora_dropout=cfg.lora_dropout, use_rslora=cfg.use_rslora,
                                                 target_modules=list(s.lora_target_modules), bias="none"))
    shared = dict(args)
    if shared.get("gradient_checkpointing"):
        # non-reentrant: the frozen conv front end under LoRA gives inputs that need no grad
        shared["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
        model.config.use_cache = False
    has_eval = eval_ds is not None and len(eval_ds) > 0
    config = Seq2SeqTrainingArguments(
        **shared, predict_with_generate=True, generation_max_length=s.generation_max_length,
        generation_num_beams=s.num_beams, remove_unused_columns=False,  # the collator reads audio and text
        label_names=["labels"], eval_on_start=bool(s.eval_on_start and has_eval))
    start = model.config.decoder_start_token_id
    return Seq2SeqTrainer(model=model, args=config, train_dataset=train_ds, eval_dataset=eval_ds if has_eval else None,
                          data_collator=SpeechCollator(processor, start, dtype), processing_class=processor,
                          compute_metrics=make_compute_metrics(processor.tokenizer) if has_eval else None,
                          callbacks=callbacks)


# ---------------------------------------------------------------------- preview (the New run form's)
def preview(cfg: TrainConfig, data, tokenizer, rows_shown: int, tokenizer_label: str):
    """The data preview of a speech run: each transcript as the decoder is trained on it (prefix tokens for the
    language and task, the text, end of text), with the clip's duration; token counts of every transcript."""
    from trainer_core.host import parallel
    from trainer_core.data import audio
    from trainer_core.data.preview import Preview, RenderedRow

    s = cfg.method_settings
    if hasattr(tokenizer, "set_prefix_tokens"):
        tokenizer.set_prefix_tokens(language=s.language or None, task=s.task, predict_timestamps=False)
    rows, eval_rows = data.rows, data.eval_rows
    shown, lengths, tokens = [], [], 0
    for index, row in enumerate(rows):
        ids = tokenizer(row["text"])["input_ids"]
        lengths.append(len(ids))
        tokens += len(ids)
        if index < rows_shown:
            text = tokenizer.decode(ids, skip_special_tokens=False)
            shown.append(RenderedRow(index=index, text=text, segments=((text, True),), num_tokens=len(ids),
                                     truncated=False, label=f"{audio.duration_s(row['audio']):.1f} s"))
    processes = parallel.process_count(cfg)
    return Preview(
        format=data.train.format, format_reason=data.train.reason, tokenizer=tokenizer_label, rows=tuple(shown),
        lengths=tuple(lengths), max_seq_length=s.generation_max_length, truncated=0, dropped=dict(data.train.dropped),
        total_rows=len(rows), total_tokens=tokens, trained_tokens=tokens,
        steps_per_epoch=parallel.steps_per_epoch(len(rows), cfg.batch_size, cfg.gradient_accumulation_steps,
                                                 processes),
        eval_rows=len(eval_rows), processes=processes, global_batch=parallel.global_batch(cfg, processes))
