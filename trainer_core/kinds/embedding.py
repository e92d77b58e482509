"""Embedding models (dashboard half): sentence-transformers models that turn text into vectors, trained with method
embedding on pairs, triplets or scored pairs; scored by retrieval, served on /v1/embeddings by infinity-emb,
exported as a sentence-transformers folder or ONNX."""
from __future__ import annotations

from trainer_core.kinds.base import SEARCH, Facts, ModelKind

MARKER = "modules.json"  # what makes a folder a sentence-transformers model


def detect(facts: Facts) -> bool:
    return MARKER in facts.files


KIND = ModelKind(
    name="embedding",
    label="Embedding",
    summary="A model that turns text into vectors for search, RAG and clustering.",
    detected_by="the folder is a sentence-transformers model (modules.json), or the bundled all-MiniLM-L6-v2",
    detect=detect,
    output="embedding",
    data_shapes=("pairs", "triplets", "scored pairs"),
    methods=("embedding",),
    adapters=("lora", "full"),
    method_fix="choose a sentence-transformers model (e.g. the bundled all-MiniLM-L6-v2)",
    serve_routes=("/v1/embeddings",),
    serve_engine="infinity-emb (its own venv, .venv-embed)",
    vllm="embedding models are served by infinity-emb (/v1/embeddings)",
    eval_metrics=("retrieval",),
    eval_defaults=("retrieval",),
    exports={"gguf": "gguf: an embedding model is exported as a sentence-transformers folder (merged), which "
                     "SentenceTransformer(path) loads, not as GGUF"},
    default_exports=("merged",),
    lora_merge_refusal="this embedding run trained a LoRA adapter, which the installed peft cannot merge into a "
                       "sentence-transformers folder: export the adapter",
    playground=SEARCH,
    samples="retrieval scores on the held-out pairs",
    memory_inputs=("parameters", "sequence length", "batch size", "adapter", "precision"),
    uses="it turns text into vectors and does not write answers: load its weights folder with "
         "sentence-transformers (SentenceTransformer(folder)) for search and RAG",
    worker="trainer_core.worker.methods.embedding",
)
