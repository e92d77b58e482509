"""A conversation rendered with the chat template a model trains with (the Playground's "Show prompt").

Like the data preview (``trainer_core.data.preview``), the rendering happens in a subprocess,
``python -m trainer_core.worker.prompt_child``, which loads the tokenizer exactly as training does
(``model_files.resolve_model`` + ``token_cache.load_tokenizer``) and applies its chat template through
``token_cache``: the dashboard never imports transformers. Results are cached per model and conversation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from trainer_core.auth import access
from trainer_core.data.bounded_cache import BoundedCache
from trainer_core.config import TrainConfig
from trainer_core.specs.model_source import ResolvedSource
from trainer_core.protocol import files, sandbox

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RenderedPrompt:
    text: str  # what the model reads, special tokens included
    tokens: int
    tokenizer: str


class PromptRenderError(ValueError):
    """The prompt could not be rendered: the message says why and what to do."""


_cache: BoundedCache[str, RenderedPrompt] = BoundedCache(16)


def training_config(resolved: ResolvedSource) -> TrainConfig:
    """The config whose tokenizer renders prompts for this source: the run's own, else the base model's."""
    return resolved.config or replace(TrainConfig(), model_name=resolved.base_model)


def render(resolved: ResolvedSource, messages: list[dict[str, str]], timeout_s: float = TIMEOUT_S) -> RenderedPrompt:
    cfg = training_config(resolved)
    # Only what picks the tokenizer: a run and its base model share one rendering (and one child process).
    tokenizer_fields = {"model_name": cfg.model_name, "trust_remote_code": cfg.trust_remote_code}
    request = json.dumps({"config": tokenizer_fields, "messages": messages}, sort_keys=True)
    cached = _cache.get(request)
    if cached is not None:
        return cached
    # The HF token (a gated hub tokenizer) reaches the child through its environment, as for the preview.
    env = {**access.child_env(os.environ), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if os.environ.get("HF_TOKEN"):
        env["HF_TOKEN"] = os.environ["HF_TOKEN"]
    try:
        command = sandbox.child_command([sys.executable, "-m", "trainer_core.worker.prompt_child"], json.loads(request),
                                        env)
        done = subprocess.run(command, input=request, text=True, capture_output=True, env=env, timeout=timeout_s,
                              check=False, cwd=os.getcwd())
    except sandbox.SandboxError as exc:
        raise PromptRenderError(str(exc)) from None
    except subprocess.TimeoutExpired:
        raise PromptRenderError(f"loading the tokenizer of {cfg.model_label} took longer than {timeout_s:.0f} s "
                                "(a slow hub download?): try again later") from None
    reply = files.last_json_line(done.stdout)
    if not isinstance(reply, dict):
        raise PromptRenderError(f"the prompt renderer failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    if "error" in reply:
        raise PromptRenderError(reply["error"])
    rendered = RenderedPrompt(reply["text"], int(reply["tokens"]), reply["tokenizer"])
    _cache.put(request, rendered)
    return rendered
