"""Evaluation jobs: generate answers on held-out data and score them (issue 11).

- ``spec``: ``EvalSpec``, the job's one typed config (job.json), checked once with every problem named;
- ``samples``: test rows (any training format, a run's own eval split, a hub split) turned into
  prompt/reference pairs exactly as training splits them, and the data fingerprint and settings hash that
  key the cached base-model baseline;
- ``scoring``: exact match, ROUGE-L (``rouge-score``) and BLEU (``sacrebleu``), per sample and overall;
- ``judge``: an optional LLM judge through any OpenAI-compatible endpoint (``httpx``);
- ``samples_check``: degenerate sample answers (empty, a loop, a chat-template leak), during training too.

``python -m trainer_core eval`` is ``trainer_core.cli.evaluate``.

Nothing here imports torch or transformers: the dashboard validates specs and reads results through it.
The worker side is ``trainer_core.worker.evaluate``.
"""
from __future__ import annotations
