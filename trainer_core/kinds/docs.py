"""docs/model-kinds.md, generated from the capability table (a test compares the page with this output)."""
from __future__ import annotations

from trainer_core.kinds import KINDS
from trainer_core.kinds.base import EXPORT_TARGETS, NEEDS_WRITER, ModelKind

DOC_PATH = "docs/model-kinds.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "—"


def _export(kind: ModelKind, target: str) -> str:
    why = kind.export_refusal(target)
    if not why:
        extra = " (where llama.cpp's converter knows the architecture)" if target == "gguf" and \
            kind.gguf_needs_converter else ""
        extra += " (full fine-tunes only)" if target != "adapter" and kind.lora_merge_refusal else ""
        return "yes" + extra
    if why == NEEDS_WRITER:
        return "no: it writes no answers"
    return "no: " + why.split(": ", 1)[-1]


def markdown() -> str:
    kinds = list(KINDS.values())
    rows = [
        ("What it is", [k.summary for k in kinds]),
        ("Told from a model folder by", [k.detected_by for k in kinds]),
        ("Data it trains on", [", ".join(k.data_shapes) for k in kinds]),
        ("Methods that train it", [", ".join(k.methods) for k in kinds]),
        ("Adapters", [", ".join(k.adapters) for k in kinds]),
        ("Served on", [", ".join(f"`{r}`" for r in k.serve_routes) + f" by {k.serve_engine}" if k.served
                       else "not served" + (": " + k.not_served.split(": ", 1)[1] if ": " in k.not_served else "")
                       for k in kinds]),
        ("vLLM", ["yes" if not k.vllm else f"no: {k.vllm}" for k in kinds]),
        ("Eval metrics", [", ".join(k.eval_metrics) if k.eval_metrics
                          else f"none: it cannot be {k.not_evaluated}; {k.eval_instead}" for k in kinds]),
        *((f"Export: {t}", [_export(k, t) for k in kinds]) for t in EXPORT_TARGETS),
        ("Export form offers first", [", ".join(k.default_exports) for k in kinds]),
        ("Playground", [k.playground or "none" for k in kinds]),
        ("Samples during training", [k.samples for k in kinds]),
        ("Memory estimate reads", [", ".join(k.memory_inputs) for k in kinds]),
        ("Worker half", [f"`{k.worker}`" for k in kinds]),
    ]
    lines = ["# Model kinds", "",
             "What each kind of model can do in the studio. Generated from the capability table "
             "(`trainer_core/kinds/`) by `python -m trainer_core.kinds --write`; a test keeps this page and the "
             "table the same. Adding a kind: docs/extending.md.", "",
             "| | " + " | ".join(k.label for k in kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    lines += [f"| {name} | " + " | ".join(_cell(v) for v in values) + " |" for name, values in rows]
    uses = [f"- **{k.label}**: {k.uses}." for k in kinds if k.uses]
    return "\n".join(lines + ["", "## What a model that writes no answers is for", "", *uses, ""])
