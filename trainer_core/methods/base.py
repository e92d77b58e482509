"""What a training method tells the dashboard: its spec (dashboard half, no ML imports).

A method (sft, cpt; dpo, grpo... next) is a plug-in with two halves. This module holds the dashboard
half's types; ``trainer_core.methods`` holds the one registry (name -> MethodSpec) and
``trainer_core.worker.methods`` the worker halves that build the trainer.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    """One metric a method reports, as charts and tiles show it.

    ``key`` is the progress-event key (a wide column such as ``loss``, or any open key such as
    ``rewards/format/mean``); ``axis`` is the y-axis title; ``format`` a d3/Python format spec for
    tiles and tooltips; ``tile`` puts its latest value in the Live tiles; ``chart`` draws it by default.
    """

    key: str
    label: str
    axis: str = ""
    format: str = ".4g"
    tile: bool = False
    chart: bool = True
