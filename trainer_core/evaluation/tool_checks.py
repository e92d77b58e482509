"""The eval spec's checks for metric ``tool_calls``: a model that writes answers, metrics that read the rows as it
does (each conversation up to its first reply), and test rows that list tools."""
from __future__ import annotations

from typing import TYPE_CHECKING

from trainer_core.config import FieldError
from trainer_core.evaluation.tool_scoring import METRIC
from trainer_core.specs import model_source

if TYPE_CHECKING:
    from trainer_core.evaluation.samples import Sample
    from trainer_core.evaluation.spec import EvalSpec

# Metrics that read the rows another way than tool_calls (its questions end at the first assistant reply)
NOT_WITH_TOOLS = ("perplexity", "preference_accuracy", "reward", "retrieval", "wer", "cer")


def metric_errors(spec: "EvalSpec") -> list[FieldError]:
    clash = [m for m in spec.metrics if m in NOT_WITH_TOOLS]
    if clash:
        return [FieldError("metrics", f"tool_calls scores each conversation's first reply, and {', '.join(clash)} "
                                      f"read the rows another way: drop {', '.join(clash)} (or run them as a second "
                                      "eval), or drop 'tool_calls'")]
    try:
        resolved = model_source.resolve(spec.source)
    except model_source.SourceError:
        return []  # JobSpec.validate names the missing source
    if METRIC not in resolved.kind.eval_metrics:
        return [FieldError("metrics", f"tool_calls needs a language model that writes answers with tool calls; "
                                      f"{resolved.label} is a {resolved.kind.label.lower()} model: drop 'tool_calls', "
                                      "or evaluate a text model")]
    return []


def data_errors(spec: "EvalSpec", samples: "list[Sample]") -> list[FieldError]:
    if METRIC not in spec.metrics or any(sample.tools for sample in samples):
        return []
    return [FieldError("data", f"tool_calls scores calls against each row's tools, and none of the {len(samples):,} "
                               "test rows lists any: give conversations with a 'tools' list per row (the OpenAI "
                               "format: tools, assistant tool_calls, role tool results; ShareGPT "
                               "function_call/observation turns; or xLAM query/tools/answers), or drop 'tool_calls' "
                               "from metrics")]
