"""Preference methods (dashboard halves): DPO, ORPO, SimPO, KTO and reward-model training.

Each trains on preference data (trainer_core.data.preference): pairs for DPO, ORPO, SimPO and reward;
labelled completions for KTO (pairs are unpaired for it). Their settings are the YAML section named after
the method (``dpo: {beta: 0.1}``), read once into ``TrainConfig.method_settings`` (a DPOSettings for dpo...).
"""
from __future__ import annotations

from typing import Any

from trainer_core.methods.base import TRAINER_METRICS, MethodSpec, MetricSpec
from trainer_core.methods.preference_settings import (DPOSettings, KTOSettings, ORPOSettings, RewardSettings,
                                                      SimPOSettings)
from trainer_core.protocol.errors import FieldError


def _validator(method: str):
    def validate(cfg: Any) -> list[FieldError]:
        if cfg.packing:
            return [FieldError("packing", f"{method} compares whole answers: turn packing off")]
        return []

    return validate


def _pair_metrics(prefix: str = "rewards") -> tuple[MetricSpec, ...]:
    return (
        MetricSpec(f"{prefix}/margins", "Reward margin (chosen - rejected)", axis="implicit reward", tile=True),
        MetricSpec(f"{prefix}/accuracies", "Preference accuracy", axis="share of pairs", format=".1%", tile=True),
        MetricSpec(f"{prefix}/chosen", "Reward of chosen", axis="implicit reward"),
        MetricSpec(f"{prefix}/rejected", "Reward of rejected", axis="implicit reward"),
        MetricSpec("logps/chosen", "Log-prob of chosen", axis="log-probability", chart=False),
        MetricSpec("logps/rejected", "Log-prob of rejected", axis="log-probability", chart=False),
    )


PAIRS_FIX = ("use prompt/chosen/rejected columns, or chosen/rejected message lists sharing the prompt turns "
             "(map other names with custom_format_mapping, e.g. {chosen: good, rejected: bad})")

DPO = MethodSpec(
    name="dpo", label="DPO (preference pairs)",
    help="Direct Preference Optimization: raise the likelihood of chosen answers over rejected ones, relative "
         "to the base model (with LoRA the reference is the base with the adapter off: no second copy).",
    data_shapes=("pairs",), data_fix=PAIRS_FIX, validate=_validator("dpo"),
    settings=DPOSettings, activation_factor=2.0,
    reference_model=True, metric_specs=TRAINER_METRICS[:4] + _pair_metrics())
ORPO = MethodSpec(
    name="orpo", label="ORPO (preference pairs, no reference)",
    help="Odds Ratio Preference Optimization: SFT on chosen answers plus a penalty on rejected ones, in one "
         "stage and without a reference model.",
    data_shapes=("pairs",), data_fix=PAIRS_FIX, validate=_validator("orpo"),
    settings=ORPOSettings, activation_factor=2.0,
    metric_specs=TRAINER_METRICS[:4] + _pair_metrics() + (
        MetricSpec("log_odds_ratio", "Log odds ratio", axis="log odds"),
        MetricSpec("nll_loss", "SFT loss on chosen", axis="loss")))
SIMPO = MethodSpec(
    name="simpo", label="SimPO (preference pairs, no reference)",
    help="Simple Preference Optimization: length-normalised log-probabilities as rewards with a target margin; "
         "no reference model.",
    data_shapes=("pairs",), data_fix=PAIRS_FIX, validate=_validator("simpo"),
    settings=SimPOSettings, activation_factor=2.0,
    metric_specs=TRAINER_METRICS[:4] + _pair_metrics())
KTO = MethodSpec(
    name="kto", label="KTO (good / bad answers)",
    help="Kahneman-Tversky Optimization: learns from answers labelled good or bad, unpaired (pairs are split "
         "into one good and one bad answer).",
    data_shapes=("kto",),
    data_fix="use prompt/completion/label columns (label true for a good answer), or preference pairs",
    validate=_validator("kto"), settings=KTOSettings, activation_factor=2.0, reference_model=True,
    metric_specs=TRAINER_METRICS[:4] + (
        MetricSpec("rewards/chosen", "Reward of good answers", axis="implicit reward"),
        MetricSpec("rewards/rejected", "Reward of bad answers", axis="implicit reward"),
        MetricSpec("rewards/margins", "Reward margin (good - bad)", axis="implicit reward", tile=True),
        MetricSpec("kl", "KL to the reference", axis="KL", tile=True)))
REWARD = MethodSpec(
    name="reward", label="Reward model (from pairs)",
    help="Trains a sequence classifier to score chosen answers above rejected ones (Bradley-Terry): the "
         "result can be a GRPO run's reward model.",
    data_shapes=("pairs",), data_fix=PAIRS_FIX, validate=_validator("reward"), settings=RewardSettings,
    output="reward",
    model_class="sequence_classification", activation_factor=2.0,
    metric_specs=TRAINER_METRICS[:4] + (
        MetricSpec("accuracy", "Pair accuracy", axis="share of pairs", format=".1%", tile=True),
        MetricSpec("margin", "Score margin", axis="score", tile=True),
        MetricSpec("eval_accuracy", "Eval pair accuracy", axis="share of pairs", format=".1%", tile=True)))
