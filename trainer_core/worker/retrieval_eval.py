"""The ``retrieval`` metric of an eval job, worker half: the model loaded with sentence-transformers (a run's saved
folder or checkpoint, or the base model as the embedding method loads it) and sentence-transformers' own
InformationRetrievalEvaluator on the retrieval set (``trainer_core.evaluation.retrieval``), with the query and
document prompts the run trained with. The evaluator's ranked hits per query (its predictions file) give each
query's row: where the first relevant passage ranked and the top hits. Imports torch and sentence-transformers
at its top: only the eval worker imports this module, and only for this metric.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sentence_transformers import SentenceTransformer
from sentence_transformers.evaluation import InformationRetrievalEvaluator

from trainer_core.config import TrainConfig
from trainer_core.data.embedding_pairs import IRSet
from trainer_core.evaluation import retrieval
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.specs.model_source import ResolvedSource
from trainer_core.worker import model_files
from trainer_core.worker.methods import embedding as method

HITS_KEPT = 3  # top hits written per query in predictions.jsonl
TEXT_CAP = 2_000  # characters of a hit's text kept there


@dataclass
class QueryRow:
    index: int
    query_id: str
    query: str
    relevant: str  # the text of the first relevant passage (by id)
    top: str  # the text of the best hit
    rank: int | None  # of the first relevant passage, 1 = the top hit; None: not in the top TOP_K
    hits: list[dict]


def load_model(resolved: ResolvedSource, max_seq_length: int, warn, log) -> SentenceTransformer:
    """The source as a SentenceTransformer: a run's folder (a sentence-transformers folder; with LoRA the adapter
    and its modules) as saved, a base model as an embedding run loads it (a plain encoder gets mean pooling).
    Texts are cut at ``max_seq_length`` tokens (0: the model's own maximum)."""
    cfg = resolved.config or TrainConfig(model_name=resolved.base_model, method="embedding", adapter="full")
    cfg = dataclasses.replace(cfg, max_seq_length=max_seq_length)
    ref = str(resolved.weights_dir) if resolved.weights_dir is not None else model_files.resolve_model(cfg, log=log)
    model, _ = method.load_model(cfg, ref, os.environ.get("HF_TOKEN") or None, warn=warn)
    model.eval()
    log(f"Loaded {resolved.label} with sentence-transformers on {model.device} (texts cut at "
        f"{model.max_seq_length} tokens, similarity {model.similarity_fn_name})")
    return model


def evaluate(model: SentenceTransformer, ir: IRSet, spec: EvalSpec, work_dir: Path) -> tuple[dict, list[QueryRow]]:
    """(the eval result's metrics, one row per query in query order)."""
    evaluator = InformationRetrievalEvaluator(
        ir.queries, ir.corpus, ir.relevant, name="", batch_size=spec.batch_size, mrr_at_k=[10], ndcg_at_k=[10],
        accuracy_at_k=[1, 10], precision_recall_at_k=[1, 10], map_at_k=[retrieval.TOP_K], write_csv=False,
        write_predictions=True, query_prompt=spec.query_prompt or None, corpus_prompt=spec.document_prompt or None)
    # its predictions file goes to a folder of ours, removed after: the ranked hits are read into our own rows
    with tempfile.TemporaryDirectory(dir=work_dir, prefix=".retrieval-") as folder:
        scores = evaluator(model, output_path=folder)
        function = model.similarity_fn_name
        ranked = Path(folder) / evaluator.predictions_file.replace(".jsonl", f"_{function}.jsonl")
        lines = [json.loads(line) for line in ranked.read_text(encoding="utf-8").splitlines() if line.strip()]
    metrics: dict = {key: scores[f"{function}_{key}"] for key in retrieval.RESULT_KEYS}
    metrics.update(samples=len(lines), corpus=len(ir.corpus), similarity=function)
    return metrics, [_row(index, line, ir) for index, line in enumerate(lines)]


def _row(index: int, line: dict, ir: IRSet) -> QueryRow:
    query_id = line["query_id"]
    relevant = ir.relevant[query_id]
    results = line["results"]  # best first (the evaluator sorts them by score, then id)
    rank = retrieval.first_rank([hit["corpus_id"] for hit in results], relevant)
    hits = [{"id": hit["corpus_id"], "score": hit["score"], "relevant": hit["corpus_id"] in relevant,
             "text": ir.corpus[hit["corpus_id"]][:TEXT_CAP]} for hit in results[:HITS_KEPT]]
    top = ir.corpus[results[0]["corpus_id"]] if results else ""
    return QueryRow(index, query_id, line["query"], ir.corpus[min(relevant)], top, rank, hits)
