"""Resource sanity before a start: settings whose memory estimate clearly exceeds the device are refused.

"Clearly" means more than ``CLEARLY_OVER`` times the device's *total* memory (GPU memory, or system RAM
on a CPU host): the estimate is rough and free memory changes, so anything closer only gets the form's
warning. ``allow_memory_overcommit`` lets a user who knows better start anyway. The estimate itself is
trainer_core.planning.memory's; this module only decides whether to refuse, and says what to lower.
"""
from __future__ import annotations

import math

from trainer_core.planning import memory, model_info
from trainer_core.host import hardware
from trainer_core.config import FieldError, TrainConfig
from trainer_core.launchers import ray_nodes

CLEARLY_OVER = 2.0
FIELD = "memory"  # not one field: the estimate depends on several; the message names the ones to change


def memory_problems(cfg: TrainConfig) -> list[FieldError]:
    """[] when the run may start; else one error with the estimate, the device and what to lower."""
    if cfg.allow_memory_overcommit:
        return []
    try:
        info = model_info.inspect_model(cfg.model_name, token=cfg.hf_token or None)
    except model_info.ModelInfoError:
        return []  # nothing to estimate from (an unreachable hub id): the run reports what happens
    if cfg.launcher == "ray":  # the workers' nodes, not this host (unknown when the cluster does not say: not refused)
        device, dev = ray_nodes.run_worker_device(cfg)
    else:
        device, dev = ("cuda" if hardware.cuda_available() else "cpu"), memory.device_memory(cfg)
    est = memory.estimate_memory(info, cfg, device)
    if not math.isfinite(dev.total_gb) or est.total_gb <= CLEARLY_OVER * dev.total_gb:
        return []
    _, verdict = memory.fit_message(est, dev, cfg, info)  # the estimate and what to lower, as the form shows it
    return [FieldError(FIELD, f"{verdict} That is more than {CLEARLY_OVER:g} times the {dev.total_gb:,.1f} GB "
                              f"{dev.label} has in total, so the run is refused. If you know better, set "
                              "allow_memory_overcommit to start anyway.")]
