"""The embedding search's child process (trainer_core/tryout/search.py): ``python -m trainer_core.worker.search_child``
reads {sources, labels, query, passages, top_k, query_prompt, document_prompt, max_seq_length} on stdin and writes
{"rankings": [{label, hits: [{index, score}], similarity, error}]} as one JSON line. Each source is loaded as an
embedding eval loads it (worker/retrieval_eval.py), one after the other, so one model is in memory at a time."""
from __future__ import annotations

import json
import sys
import traceback

from trainer_core.specs import model_source


def rank(request: dict) -> list[dict]:
    import torch

    from trainer_core.worker import retrieval_eval

    out = []
    labels = request.get("labels") or []
    for i, key in enumerate(request["sources"]):
        label = labels[i] if i < len(labels) else key
        try:
            resolved = model_source.resolve(model_source.ModelSource.from_key(key))
            model = retrieval_eval.load_model(resolved, int(request["max_seq_length"]), warn=lambda m: None,
                                              log=lambda m: None)
            with torch.no_grad():
                query = model.encode([request["query_prompt"] + request["query"]], convert_to_tensor=True)
                passages = model.encode([request["document_prompt"] + p for p in request["passages"]],
                                        convert_to_tensor=True, batch_size=32)
                scores = model.similarity(query, passages)[0]
            top = torch.topk(scores, k=min(int(request["top_k"]), len(request["passages"])))
            out.append({"label": label, "similarity": model.similarity_fn_name,
                        "hits": [{"index": int(j), "score": float(s)} for s, j in zip(top.values, top.indices)]})
            del model
        except (model_source.SourceError, OSError, ValueError) as exc:
            out.append({"label": label, "error": f"{type(exc).__name__}: {exc}"[:500]})
    return out


def main() -> int:
    try:
        print(json.dumps({"rankings": rank(json.loads(sys.stdin.read()))}))
        return 0
    except Exception:  # noqa: BLE001 - process boundary: the parent shows the tail
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
