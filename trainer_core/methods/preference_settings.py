"""The settings of the preference methods (DPO, ORPO, SimPO, KTO) and of reward-model training: one small
documented dataclass each, read from the YAML section named after the method. The defaults are TRL's,
except where a comment says why."""
from __future__ import annotations

from dataclasses import dataclass

from trainer_core.methods.settings import setting

DPO_LOSSES = ("sigmoid", "hinge", "ipo", "robust", "bco_pair", "sppo_hard", "nca_pair", "exo_pair", "apo_zero",
              "apo_down", "discopop", "sigmoid_norm", "aot", "aot_unpaired")


@dataclass
class DPOSettings:
    beta: float = setting(0.1, "How far the tuned model may move from the reference: higher keeps it closer "
                               "(TRL's beta; 0.1 is the DPO paper's).", low=0.0, high=100.0, low_open=True)
    loss_type: str = setting("sigmoid", "The DPO loss: sigmoid (the paper's), ipo, hinge, robust, ... "
                                        "(TRL's DPOConfig.loss_type).", choices=DPO_LOSSES)
    label_smoothing: float = setting(0.0, "Assumed share of flipped preference labels (robust / cDPO losses).",
                                     low=0.0, high=0.5)
    rpo_alpha: float = setting(0.0, "Weight of an SFT term on the chosen answers (RPO); 0 turns it off.",
                               low=0.0, high=100.0)


@dataclass
class ORPOSettings:
    beta: float = setting(0.1, "Weight of the odds-ratio term against the SFT loss on chosen answers "
                               "(the ORPO paper's lambda).", low=0.0, high=100.0, low_open=True)


@dataclass
class SimPOSettings:
    beta: float = setting(2.0, "Reward scale (SimPO's beta; the paper uses 2.0-2.5).", low=0.0, high=100.0,
                          low_open=True)
    gamma: float = setting(0.5, "Target reward margin divided by beta (SimPO's gamma/beta ratio).", low=0.0,
                           high=10.0)
    sft_weight: float = setting(0.0, "Weight of an SFT term on chosen answers (CPO-SimPO); 0 is pure SimPO.",
                                low=0.0, high=100.0)


@dataclass
class KTOSettings:
    beta: float = setting(0.1, "How far the tuned model may move from the reference.", low=0.0, high=100.0,
                          low_open=True)
    desirable_weight: float = setting(1.0, "Weight of good completions' loss: raise it when good ones are rarer "
                                           "(keep weight x count within 1-4/3 of the bad side's).", low=0.0,
                                      high=100.0, low_open=True)
    undesirable_weight: float = setting(1.0, "Weight of bad completions' loss.", low=0.0, high=100.0,
                                        low_open=True)
    loss_type: str = setting("kto", "kto, or apo_zero_unpaired.", choices=("kto", "apo_zero_unpaired"))


@dataclass
class RewardSettings:
    center_rewards_coefficient: float = setting(0.0, "Pulls the reward model's outputs toward zero mean "
                                                     "(0.01 is the usual value); 0 turns it off.", low=0.0,
                                                high=10.0)
