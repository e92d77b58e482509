"""Embedding-model data (pure Python, no ML imports): the four shapes sentence-transformers trains on, their
columns found by name (or mapped by the user), the loss each shape implies, and the retrieval sets the
evaluator scores: a BEIR-like corpus.jsonl + queries.jsonl + qrels (tsv or jsonl), or one carved from pairs.

Rows come out with canonical column names in the order sentence-transformers reads them (it passes columns
by position; a column named ``score`` or ``label`` is the label):
``anchor_positive`` {anchor, positive}; ``triplet`` {anchor, positive, negative};
``scored_pair`` {sentence1, sentence2, score}; ``labelled`` {sentence, label}.
"""
from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_core.methods.embedding_shapes import LOSS_SHAPES, SHAPES
from trainer_core.protocol.errors import FieldError

COLUMNS = {"anchor_positive": ("anchor", "positive"), "triplet": ("anchor", "positive", "negative"),
           "scored_pair": ("sentence1", "sentence2", "score"), "labelled": ("sentence", "label")}
# Source names each canonical column is found under (first match wins), lower-cased.
ALIASES = {
    "anchor": ("anchor", "query", "question", "queries", "q", "text1"),
    "positive": ("positive", "pos", "passage", "document", "doc", "answer", "context", "text2", "positive_passage"),
    "negative": ("negative", "neg", "hard_negative", "negative_passage"),
    "sentence1": ("sentence1", "sentence_1", "text_a", "s1", "premise"),
    "sentence2": ("sentence2", "sentence_2", "text_b", "s2", "hypothesis"),
    "score": ("score", "similarity", "similarity_score", "relatedness", "label"),
    "sentence": ("sentence", "text", "content"),
    "label": ("label", "class", "category", "labels"),
}
DEFAULT_LOSS = {"anchor_positive": "mnrl", "triplet": "mnrl", "scored_pair": "cosent", "labelled": "batch_all_triplet"}
LOSS_LABELS = {
    "mnrl": "MultipleNegativesRankingLoss", "cached_mnrl": "CachedMultipleNegativesRankingLoss",
    "triplet": "TripletLoss", "cosent": "CoSENTLoss", "angle": "AnglELoss", "contrastive": "ContrastiveLoss",
    "batch_all_triplet": "BatchAllTripletLoss",
}
IN_BATCH_NEGATIVES = ("mnrl", "cached_mnrl")  # losses whose negatives are the batch's other rows
WHY_LOSS = {
    "anchor_positive": "pairs without negatives: every other positive in the batch is a negative "
                       "(in-batch negatives; larger batches give more)",
    "triplet": "pairs with a hard negative: in-batch negatives plus the row's own hard negative",
    "scored_pair": "pairs with a similarity score: CoSENT learns the scores' order",
    "labelled": "sentences with labels: every same-label / other-label triplet in the batch",
}


@dataclass
class Detection:
    shape: str
    columns: dict[str, str]  # canonical column -> source column
    loss: str  # the loss "auto" picks for the shape
    reason: str  # what was chosen and why, for the form and the run log


def _pick(available: dict[str, str], canonical: str, mapping: dict, used: set[str]) -> str | None:
    if canonical in mapping:
        return mapping[canonical] if mapping[canonical] in available.values() else None
    for alias in ALIASES[canonical]:
        source = available.get(alias)
        if source is not None and source not in used:
            return source
    return None


def detect(rows: list[dict], mapping: dict | None = None) -> Detection:
    """The shape of ``rows`` from their column names (``mapping``: canonical -> source column, for other
    names). Raises ValueError naming the columns found and the fix when no shape fits."""
    mapping = dict(mapping or {})
    seen: list[str] = []
    for row in rows[:50]:
        for key in row:
            if key not in seen:
                seen.append(key)
    available = {key.lower(): key for key in seen}
    for shape in ("triplet", "anchor_positive", "scored_pair", "labelled"):
        used: set[str] = set()
        columns = {}
        for canonical in COLUMNS[shape]:
            source = _pick(available, canonical, mapping, used)
            if source is None:
                break
            used.add(source)
            columns[canonical] = source
        else:
            if shape == "scored_pair" and not all(_number(r.get(columns["score"])) is not None for r in rows[:50]):
                continue  # a text "label" column is not a score
            loss = DEFAULT_LOSS[shape]
            names = ", ".join(f"{c}={s!r}" for c, s in columns.items())
            return Detection(shape, columns, loss, f"{SHAPES[shape]} ({names}); loss {LOSS_LABELS[loss]}: "
                                                   f"{WHY_LOSS[shape]}")
    raise ValueError(f"no embedding data shape fits the columns {', '.join(seen) or '(none)'}: use anchor/positive "
                     "(optional negative), sentence1/sentence2/score or sentence/label columns, or map yours with "
                     "embedding.columns, e.g. {anchor: question, positive: answer}")


def canonical_shape(rows: list[dict]) -> str | None:
    """The shape whose canonical columns, in order, every row has exactly (rows ``normalize`` made), or None."""
    if not rows:
        return None
    keys = tuple(rows[0])
    shape = next((name for name, columns in COLUMNS.items() if keys == columns), None)
    if shape is None or any(tuple(row) != keys for row in rows[:50]):
        return None
    return shape


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def normalize(rows: list[dict], detection: Detection) -> tuple[list[dict], Counter]:
    """Rows with canonical columns in training order, and the dropped ones counted by reason."""
    out, dropped = [], Counter()
    for row in rows:
        shaped: dict[str, Any] = {}
        for canonical, source in detection.columns.items():
            value = row.get(source)
            if canonical == "score":
                value = _number(value)
                if value is None:
                    dropped[f"'{source}' is not a number"] += 1
                    break
            elif canonical == "label":
                if value is None or value == "":
                    dropped[f"'{source}' is empty"] += 1
                    break
            else:
                value = _text(value)
                if value is None:
                    dropped[f"'{source}' is empty or not text"] += 1
                    break
            shaped[canonical] = value
        else:
            out.append(shaped)
    return out, dropped


def loss_problems(loss: str, shape: str, rows: list[dict]) -> list[FieldError]:
    """Whether ``loss`` trains on ``shape`` (and, for contrastive, 0/1 labels)."""
    if loss == "auto":
        return []
    if shape not in LOSS_SHAPES[loss]:
        fits = [name for name, shapes in LOSS_SHAPES.items() if shape in shapes]
        return [FieldError("embedding.loss", f"{LOSS_LABELS[loss]} needs {' or '.join(SHAPES[s] for s in LOSS_SHAPES[loss])}"
                                             f"; the data is {SHAPES[shape]}: choose {', '.join(['auto', *fits])}")]
    if loss == "contrastive" and any(r["score"] not in (0.0, 1.0) for r in rows):
        return [FieldError("embedding.loss", "ContrastiveLoss needs 0/1 labels in the score column; for graded "
                                             "scores choose cosent or angle")]
    return []


def chosen_loss(loss: str, shape: str) -> str:
    return DEFAULT_LOSS[shape] if loss == "auto" else loss


# ---------------------------------------------------------------------- retrieval sets
@dataclass
class IRSet:
    """What InformationRetrievalEvaluator scores: query id -> text, document id -> text, query id -> ids."""

    queries: dict[str, str] = field(default_factory=dict)
    corpus: dict[str, str] = field(default_factory=dict)
    relevant: dict[str, set[str]] = field(default_factory=dict)


def _jsonl(path: Path, what: str) -> list[dict]:
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{what}: {path.name} line {number} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{what}: {path.name} line {number} is not an object")
            out.append(row)
    return out


def read_beir(corpus: str, queries: str, qrels: str) -> IRSet:
    """A BEIR-like evaluation set: corpus.jsonl ({_id, title?, text}), queries.jsonl ({_id, text}), qrels as
    tsv (query-id, corpus-id, score; a header line is skipped) or jsonl. Judgements with score <= 0, or naming
    an unknown query or document, are left out; ValueError names the file, line and fix otherwise."""
    ir = IRSet()
    for row in _jsonl(Path(corpus), "embedding.eval_corpus"):
        doc_id, text = str(row.get("_id", row.get("id", ""))), row.get("text")
        if not doc_id or not isinstance(text, str):
            raise ValueError("embedding.eval_corpus: every line needs _id and text")
        title = row.get("title")
        ir.corpus[doc_id] = f"{title} {text}".strip() if isinstance(title, str) and title else text
    for row in _jsonl(Path(queries), "embedding.eval_queries"):
        query_id, text = str(row.get("_id", row.get("id", ""))), row.get("text")
        if not query_id or not isinstance(text, str):
            raise ValueError("embedding.eval_queries: every line needs _id and text")
        ir.queries[query_id] = text
    path = Path(qrels)
    if path.suffix == ".jsonl":
        judgements = [(str(r.get("query-id", r.get("query_id", ""))), str(r.get("corpus-id", r.get("corpus_id", ""))),
                       r.get("score", 1)) for r in _jsonl(path, "embedding.eval_qrels")]
    else:
        reader = csv.reader(io.StringIO(path.read_text(encoding="utf-8")), delimiter="\t")
        judgements = [tuple(r[:3]) if len(r) >= 3 else (*r[:2], 1) for r in reader if len(r) >= 2]
        if judgements and _number(judgements[0][2]) is None:
            judgements = judgements[1:]  # the header line
    for query_id, doc_id, score in judgements:
        if (_number(score) or 0) > 0 and query_id in ir.queries and doc_id in ir.corpus:
            ir.relevant.setdefault(query_id, set()).add(doc_id)
    ir.queries = {q: text for q, text in ir.queries.items() if q in ir.relevant}
    if not ir.relevant:
        raise ValueError("embedding.eval_qrels: no judgement names a query and a document of the given files "
                         "(query-id and corpus-id must match their _id)")
    return ir


def ir_from_pairs(eval_rows: list[dict], distractors: list[dict] = ()) -> IRSet:
    """Held-out (anchor, positive[, negative]) rows as a retrieval set: each anchor a query, its positive the
    relevant document; the corpus also holds every other positive and negative (``distractors``: the training
    rows' texts), so a query must find its passage among all of them."""
    ir = IRSet()
    ids: dict[str, str] = {}

    def doc(text: str) -> str:
        if text not in ids:
            ids[text] = f"d{len(ids)}"
            ir.corpus[ids[text]] = text
        return ids[text]

    for number, row in enumerate(eval_rows):
        query_id = f"q{number}"
        ir.queries[query_id] = row["anchor"]
        ir.relevant.setdefault(query_id, set()).add(doc(row["positive"]))
        if row.get("negative"):
            doc(row["negative"])
    for row in distractors:
        for column in ("positive", "negative"):
            if row.get(column):
                doc(row[column])
    return ir


def carve_eval(rows: list[dict], fraction: float, seed: int, minimum: int = 1) -> tuple[list[dict], list[dict]]:
    """(train, held-out): a fixed-seed share of the rows held out as the evaluator's queries. Their passages stay
    in training (several queries usually share a passage, and leaving them out starves training); what must stay
    unseen is the query text, so only another row asking a held-out query again leaves training too."""
    if len(rows) < 2:
        return list(rows), []
    count = min(max(minimum, round(len(rows) * fraction)), len(rows) - 1)
    held_idx = set(random.Random(seed).sample(range(len(rows)), count))
    held = [row for i, row in enumerate(rows) if i in held_idx]
    query = _columns_of(held[0])[0]
    asked = {row.get(query) for row in held}
    train = [row for i, row in enumerate(rows) if i not in held_idx and row.get(query) not in asked]
    return train, held


def holdout_note(rows: list[dict], train: list[dict], held: list[dict], fraction: float) -> str:
    """What carve_eval held out, in the words New run's preview and the worker log use."""
    again = len(rows) - len(train) - len(held)
    left_out = f", and {again} more pairs that ask a held-out query again are left out," if again else ","
    return (f"no eval set: {len(held)} of the {len(rows)} pairs are held out as the evaluator's queries "
            f"(embedding.ir_holdout {fraction}); their passages stay in training{left_out} so {len(train)} pairs "
            "train")


def _columns_of(row: dict) -> tuple[str, ...]:
    for columns in COLUMNS.values():
        if tuple(row)[:len(columns)] == columns:
            return columns
    return tuple(row)


# ---------------------------------------------------------------------- preview
def preview_rows(rows: list[dict], query_prompt: str = "", document_prompt: str = "", limit: int = 20) -> list[dict]:
    """Rows as the model sees them: the query prompt before anchors/sentence1/sentence, the document prompt
    before positives/negatives/sentence2."""
    out = []
    for row in rows[:limit]:
        seen = {}
        for column, value in row.items():
            if column in ("anchor", "sentence1", "sentence"):
                value = f"{query_prompt}{value}"
            elif column in ("positive", "negative", "sentence2"):
                value = f"{document_prompt}{value}"
            seen[column] = value
        out.append(seen)
    return out


def batch_duplicates(rows: list[dict], batch_size: int) -> int:
    """Texts repeated within a batch, batches taken in order (the default sampler's view): with an
    in-batch-negative loss each is a false negative; the no_duplicates sampler avoids them."""
    repeats = 0
    for start in range(0, len(rows), max(1, batch_size)):
        counts = Counter(value for row in rows[start:start + batch_size] for column, value in row.items()
                         if isinstance(value, str) and column != "label")
        repeats += sum(n - 1 for n in counts.values() if n > 1)
    return repeats
