"""Scores of generated answers against reference answers, with maintained metric libraries only:
ROUGE-L from ``rouge-score`` (Google's reference implementation), BLEU from ``sacrebleu`` (sentence BLEU per
sample, corpus BLEU overall). Exact match compares the texts with whitespace runs collapsed. Loss and
perplexity come from the model (worker/evaluate.py); ``overall`` only aggregates them here.

``preference_accuracy``: the share of held-out pairs whose chosen answer the model prefers (``preferred`` 1 or 0
per pair), with the mean ``margin``; the worker computes both from sequence log-probabilities (the implicit
reward of a LoRA run against its own base, or the plain log-prob of a model without a reference).
``reward``: the weighted total of a GRPO run's rewards per answer, averaged, and each reward's mean
(``reward/<name>``), from the values the worker's reward functions gave.
``tool_calls``: the calls in the answers against the reference replies' calls (``tool_scoring``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import sacrebleu
from rouge_score import rouge_scorer

from trainer_core.evaluation import tool_scoring

_ROUGE = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def normalize(text: str) -> str:
    return " ".join(text.split())


def exact(answer: str, reference: str) -> float:
    return 1.0 if normalize(answer) == normalize(reference) else 0.0


def rouge_l(answer: str, reference: str) -> float:
    """ROUGE-L F-measure in [0, 1] (rouge-score tokenizes on lower-cased ASCII letters and digits)."""
    return _ROUGE.score(reference, answer)["rougeL"].fmeasure


def sentence_bleu(answer: str, reference: str) -> float:
    """sacrebleu's sentence BLEU (0-100, with its default exponential smoothing)."""
    return sacrebleu.sentence_bleu(answer, [reference]).score


def corpus_bleu(answers: list[str], references: list[str]) -> float:
    return sacrebleu.corpus_bleu(answers, [references]).score


@dataclass
class SampleScores:
    exact: float | None = None
    rouge_l: float | None = None
    bleu: float | None = None
    loss: float | None = None  # mean negative log-likelihood of the reference answer's tokens
    tokens: int = 0  # reference answer tokens the loss is over
    judge: float | None = None
    preferred: float | None = None  # a pair: 1.0 when the chosen answer's reward beats the rejected one's, else 0.0
    margin: float | None = None  # a pair: reward(chosen) - reward(rejected), in nats (not scaled by a DPO beta)
    reward: float | None = None  # the weighted total of the rewards that scored this answer
    rewards: dict | None = None  # reward name -> value (None: that reward gave no score for this answer)
    tool: tool_scoring.ToolCallScore | None = None  # metric tool_calls: the answer's calls against the reference's


def score_text(answer: str, reference: str, metrics: list[str]) -> SampleScores:
    return SampleScores(exact=exact(answer, reference) if "exact" in metrics else None,
                        rouge_l=rouge_l(answer, reference) if "rouge" in metrics else None,
                        bleu=sentence_bleu(answer, reference) if "bleu" in metrics else None)


def overall(scores: list[SampleScores], answers: list[str], references: list[str], metrics: list[str]) -> dict:
    """Metrics over every sample scored so far: means of exact match, ROUGE-L and judge scores, corpus BLEU,
    and loss as the token-weighted mean NLL of all reference tokens with perplexity = exp(loss)."""
    result: dict[str, float | int | None] = {"samples": len(scores)}
    if "exact" in metrics:
        result["exact"] = _mean([s.exact for s in scores])
    if "rouge" in metrics:
        result["rouge_l"] = _mean([s.rouge_l for s in scores])
    if "bleu" in metrics:
        result["bleu"] = corpus_bleu(answers, references) if answers else None
    if "perplexity" in metrics:
        counted = [s for s in scores if s.loss is not None and s.tokens]
        tokens = sum(s.tokens for s in counted)
        loss = sum(s.loss * s.tokens for s in counted) / tokens if tokens else None
        result["loss"] = loss
        result["perplexity"] = math.exp(loss) if loss is not None and loss < 700 else None
    if "judge" in metrics:
        result["judge"] = _mean([s.judge for s in scores])
        result["judged"] = sum(s.judge is not None for s in scores)
    if "preference_accuracy" in metrics:
        result["preference_accuracy"] = _mean([s.preferred for s in scores])
        result["preference_margin"] = _mean([s.margin for s in scores])
    if "reward" in metrics:
        result["reward"] = _mean([s.reward for s in scores])
        names = dict.fromkeys(name for s in scores for name in (s.rewards or {}))
        for name in names:
            result[f"reward/{name}"] = _mean([(s.rewards or {}).get(name) for s in scores])
    if tool_scoring.METRIC in metrics:
        result.update(tool_scoring.tool_call_metrics([s.tool for s in scores if s.tool is not None]))
    return result


def weighted_total(values: dict[str, float | None], weights: dict[str, float]) -> float | None:
    """TRL's total reward of one answer: the weighted sum of the rewards that gave a score (None: none did)."""
    given = [weights[name] * value for name, value in values.items() if value is not None]
    return sum(given) if given else None


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None
