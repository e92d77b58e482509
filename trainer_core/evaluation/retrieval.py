"""The ``retrieval`` metric of an eval job (issue 21): an embedding model's retrieval on the user's data, scored by
sentence-transformers' InformationRetrievalEvaluator in the worker (``trainer_core.worker.retrieval_eval``).

This half is pure Python (the dashboard validates and keys evals with it): which sources it applies to, and the
retrieval set the evaluator scores, read with the embedding method's own readers (``data.embedding_pairs``):

- a BEIR-like folder: ``corpus.jsonl`` ({_id, title?, text}), ``queries.jsonl`` ({_id, text}) and the relevance
  judgements as ``qrels.tsv`` / ``qrels.jsonl``, or BEIR's own ``qrels/test.tsv`` (``read_beir``);
- a pairs file, read as an embedding run reads its data (anchor/positive columns, found by name or mapped):
  each anchor a query, its positive the relevant passage, every positive (and negative) the corpus
  (``ir_from_pairs``, as training carves a retrieval set from held-out pairs);
- ``eval_split:<run id>`` of an embedding run: the set that run's evaluator scored while it trained.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from trainer_core import config as config_module
from trainer_core.config import TrainConfig
from trainer_core.data import DatasetError, embedding_pairs, loading
from trainer_core.data.embedding_pairs import IRSet
from trainer_core.data.sources import resolve_source
from trainer_core.evaluation import samples as eval_samples
from trainer_core.methods import embedding
from trainer_core.protocol import paths
from trainer_core.protocol.errors import FieldError

if TYPE_CHECKING:
    from trainer_core.evaluation.spec import EvalSpec

METRIC = eval_samples.RETRIEVAL_METRIC
# The eval result's keys, as InformationRetrievalEvaluator names them (without its score function prefix).
RESULT_KEYS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "accuracy@1")
TOP_K = 100  # hits the evaluator keeps per query (its map@100): a relevant passage ranked lower has no rank here
CORPUS, QUERIES = "corpus.jsonl", "queries.jsonl"
QRELS = ("qrels.tsv", "qrels.jsonl", "qrels/test.tsv", "qrels/test.jsonl")  # first found wins
PAIR_SHAPES = ("anchor_positive", "triplet")
LM_ARCHITECTURES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def wanted(spec: "EvalSpec") -> bool:
    return isinstance(spec.metrics, list) and METRIC in spec.metrics


# ---------------------------------------------------------------------- which models
def is_embedding_model(model: str) -> bool | None:
    """Whether base model ``model`` is an embedding model: True for the bundled one and a sentence-transformers
    folder (modules.json), False for the bundled chat model and a model whose config names a language-model
    head; None when this cannot be told here (a hub id offline, a folder of a plain encoder, which the worker
    loads with mean pooling as training does)."""
    name = model.strip()
    if name == embedding.BUNDLED_MODEL:
        return True
    if name == config_module.BUNDLED_MODEL:
        return False
    if config_module.looks_like_path(name):
        folder = Path(name).expanduser()
        if (folder / "modules.json").is_file():
            return True
    from trainer_core.planning import model_info  # reads config files only: no ML stack

    try:
        architecture = model_info.inspect_model(name).architecture
    except (model_info.ModelInfoError, OSError, ValueError):
        return None
    return False if architecture.endswith(LM_ARCHITECTURES) else None


def source_errors(spec: "EvalSpec") -> list[FieldError]:
    """``retrieval`` only for an embedding model (a run trained with method embedding, or a sentence-transformers
    base model), alone; the text metrics and benchmarks never for one (it generates no text)."""
    from trainer_core.specs import model_source

    source = spec.source
    if source.is_base:
        is_embedding, what = is_embedding_model(source.model), f"{source.model}"
    else:
        try:
            cfg = model_source.run_config(source.run_id)
        except model_source.SourceError:
            return []  # JobSpec.validate names the missing run
        is_embedding, what = cfg.method == "embedding", f"run {source.run_id} (method {cfg.method})"
    others = [m for m in spec.metrics if m != METRIC]
    errors = []
    if wanted(spec) and is_embedding is False:
        errors.append(FieldError("metrics", f"retrieval scores an embedding model, and {what} is not one: evaluate "
                                            "a run trained with method embedding (or a sentence-transformers base "
                                            "model such as the bundled all-MiniLM-L6-v2), or drop 'retrieval'"))
    elif is_embedding and others:
        errors.append(FieldError("metrics", f"{what} is an embedding model: it generates no text, so "
                                            f"{', '.join(others)} cannot score it; choose metrics [retrieval]"))
    elif wanted(spec) and others:
        errors.append(FieldError("metrics", f"retrieval scores an embedding model, which {', '.join(others)} cannot "
                                            "(they score generated text): choose retrieval alone"))
    if is_embedding and spec.lm_eval_tasks:
        errors.append(FieldError("lm_eval_tasks", "benchmarks of lm-evaluation-harness score generated text, which "
                                                  "an embedding model has none of: clear lm_eval_tasks"))
    return errors


def run_settings(run_id: str) -> dict:
    """What an eval of embedding run ``run_id`` takes from it (unless the spec sets its own): the query and
    document prompts and the text length it trained with, and its column mapping (in custom_format_mapping)."""
    from trainer_core.specs import model_source

    cfg = model_source.run_config(run_id)
    if cfg.method != "embedding":
        return {}
    s: embedding.EmbeddingSettings = cfg.method_settings
    return {"query_prompt": s.query_prompt, "document_prompt": s.document_prompt,
            "max_seq_length": cfg.max_seq_length, "custom_format_mapping": dict(s.columns)}


# ---------------------------------------------------------------------- the retrieval set
def beir_files(folder: Path) -> tuple[Path, Path, Path]:
    """(corpus, queries, qrels) of a BEIR-like folder; DatasetError naming what is missing."""
    corpus, queries = folder / CORPUS, folder / QUERIES
    qrels = next((folder / name for name in QRELS if (folder / name).is_file()), None)
    missing = [name for name, path in ((CORPUS, corpus), (QUERIES, queries)) if not path.is_file()]
    if qrels is None:
        missing.append(" or ".join(QRELS))
    if missing:
        raise DatasetError("data", f"{folder} is not a BEIR-like retrieval set: it lacks {', '.join(missing)}. Give "
                                   "a folder with corpus.jsonl ({_id, title, text}), queries.jsonl ({_id, text}) and "
                                   "qrels (.tsv: query-id, corpus-id, score), or a file of anchor/positive pairs")
    try:  # a symlink inside an allowed folder must not lead out of it (as for a training data folder)
        return tuple(paths.resolve_inside(p, paths.allowed_data_roots()) for p in (corpus, queries, qrels))
    except paths.UnsafePathError as exc:
        raise DatasetError("data", f"{exc}. Remove the link or copy the file into the folder.") from None


def read_folder(folder: Path) -> IRSet:
    files = beir_files(folder)
    try:
        return embedding_pairs.read_beir(*map(str, files))
    except UnicodeDecodeError as exc:
        raise DatasetError("data", f"{folder}: a file is not UTF-8 text ({exc.reason}): save it as UTF-8") from None
    except (OSError, ValueError) as exc:
        # read_beir names training's fields (embedding.eval_corpus: ...): here they are files of ``data``
        field, _, message = str(exc).partition(": ")
        names = dict(zip(("embedding.eval_corpus", "embedding.eval_queries", "embedding.eval_qrels"),
                         (f.name for f in files)))
        if field not in names:
            message = str(exc)
        elif not message.startswith(names[field]):
            message = f"{names[field]}: {message}"
        raise DatasetError("data", f"{folder}: {message}") from None


def pairs_config(mapping: dict) -> TrainConfig:
    """The config an embedding run reads pairs with: its column mapping (``custom_format_mapping`` here)."""
    return TrainConfig(method="embedding", adapter="full", method_settings=embedding.EmbeddingSettings(
                           columns=dict(mapping)), local_datasets=[], local_eval_datasets=[], eval_fraction=0.0)


def read_pairs(path: Path, mapping: dict) -> IRSet:
    """A pairs file as an embedding run reads it; scored pairs and labelled sentences have no relevant passage."""
    cfg = pairs_config(mapping)
    try:
        data = loading.load_local([str(path)], cfg, field_name="data", apply_slice=False)
    except DatasetError as exc:
        field = "custom_format_mapping" if exc.field == "embedding.columns" else exc.field
        raise DatasetError(field, exc.message) from None
    if data.format not in PAIR_SHAPES:
        raise DatasetError("data", f"retrieval needs (anchor, positive) pairs, and {path.name} holds "
                                   f"{embedding_pairs.SHAPES.get(data.format, data.format)}: give query/passage "
                                   "pairs (map your columns with custom_format_mapping, e.g. {anchor: question, "
                                   "positive: answer}) or a BEIR-like folder")
    return embedding_pairs.ir_from_pairs(data.rows)


def read_run_split(run_id: str) -> IRSet:
    """What embedding run ``run_id``'s evaluator scored (worker/methods/embedding.py ``build_trainer``): its
    BEIR-like files, else its eval rows (the corpus also holding the training passages), else the pairs it held
    out (embedding.ir_holdout, the same seed)."""
    from trainer_core.specs import model_source

    try:
        cfg = model_source.run_config(run_id)
    except model_source.SourceError as exc:
        raise DatasetError("data", str(exc)) from None
    if cfg.method != "embedding":
        raise DatasetError("data", f"run {run_id} is not an embedding run: its eval split has no queries and "
                                   "passages; give a BEIR-like folder or a pairs file")
    s: embedding.EmbeddingSettings = cfg.method_settings
    if s.eval_corpus:
        try:  # checked again here: the run's config.yaml may have been edited since it was validated
            files = [paths.resolve_inside(f, paths.allowed_data_roots()) for f in (s.eval_corpus, s.eval_queries,
                                                                                   s.eval_qrels)]
        except paths.UnsafePathError as exc:
            raise DatasetError("data", f"run {run_id}'s retrieval files: {exc}") from None
        try:
            return embedding_pairs.read_beir(*map(str, files))
        except (OSError, ValueError) as exc:
            raise DatasetError("data", f"run {run_id}'s retrieval files: {exc}") from None
    if cfg.hf_dataset:
        raise DatasetError("data", f"run {run_id} read its data from the hub: give its test pairs as a file")
    data = loading.load_for_training(cfg)
    if data.train.format not in PAIR_SHAPES:
        raise DatasetError("data", f"run {run_id} trained on {embedding_pairs.SHAPES.get(data.train.format)}: "
                                   "retrieval needs (anchor, positive) pairs or a BEIR-like folder")
    train, held = data.rows, data.eval_rows
    if not held and s.ir_holdout > 0:
        train, held = embedding_pairs.carve_eval(train, s.ir_holdout, cfg.random_seed)
    if not held:
        raise DatasetError("data", f"run {run_id} held out no pairs (no eval files, ir_holdout 0): give test pairs "
                                   "or a BEIR-like folder")
    return embedding_pairs.ir_from_pairs(held, train)


def load_set(spec: "EvalSpec") -> IRSet:
    """The whole retrieval set of ``spec.data`` (max_samples applies later, in ``capped``); DatasetError names the
    field and the fix."""
    kind = eval_samples.data_kind(spec.data)
    if kind == "hub":
        raise DatasetError("data", "retrieval reads a local BEIR-like folder or pairs file (or an embedding run's "
                                   "eval split), not a hub dataset: download it first")
    if kind == "eval_split":
        return read_run_split(eval_samples.split_run(spec.data))
    path = resolve_source(spec.data.strip(), "data")
    ir = read_folder(path) if path.is_dir() else read_pairs(path, spec.custom_format_mapping)
    if not ir.queries:
        raise DatasetError("data", "no query has a relevant passage in the corpus: nothing to score")
    return ir


def capped(ir: IRSet, max_samples: int) -> IRSet:
    """The first ``max_samples`` queries (0: all) against the whole corpus."""
    if not max_samples or len(ir.queries) <= max_samples:
        return ir
    kept = dict(list(ir.queries.items())[:max_samples])
    return IRSet(queries=kept, corpus=ir.corpus, relevant={q: ir.relevant[q] for q in kept})


def fingerprint(spec: "EvalSpec") -> str:
    """A hash of the retrieval set itself (queries, corpus, judgements): the same data however it was given."""
    return set_fingerprint(load_set(spec))


def set_fingerprint(ir: IRSet) -> str:
    body = json.dumps([ir.queries, ir.corpus, {q: sorted(d) for q, d in ir.relevant.items()}], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def first_rank(hits: list[str], relevant: set[str]) -> int | None:
    """1-based rank of the first relevant passage among ``hits`` (best first), None when none is there."""
    return next((rank for rank, doc_id in enumerate(hits, 1) if doc_id in relevant), None)
