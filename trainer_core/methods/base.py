"""What a training method tells the dashboard: its spec (dashboard half, no ML imports).

A method (sft, cpt; dpo, grpo... next) is a plug-in with two halves. This module holds the dashboard
half's types; ``trainer_core.methods`` holds the one registry (name -> MethodSpec) and
``trainer_core.worker.methods`` the worker halves that build the trainer from model, data and config.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainer_core.methods.embedding_shapes import SHAPES as _EMBEDDING_SHAPES
from trainer_core.protocol.errors import FieldError

# Data shapes a method may accept, as the data loader detects them (data.formats): a conversation per
# row ({"messages": [...]}) or raw text ({"text": ...}). Preference and prompt-only shapes come with
# the methods that need them.
SHAPES = {"chat": "chat conversations", "text": "raw text",
          "pairs": "preference pairs (prompt, chosen, rejected)",
          "kto": "answers labelled good or bad (prompt, completion, label)",
          "prompts": "prompts (text or messages) plus the columns rewards read",
          **_EMBEDDING_SHAPES,
          "speech": "speech clips with transcripts (audio, text)"}
# The shapes trainer_core.data.preference reads (the others are trainer_core.data.formats')
PREFERENCE_SHAPES = ("pairs", "kto", "prompts")
# The shapes trainer_core.data.embedding_pairs reads: texts an embedding model encodes, no conversations
EMBEDDING_SHAPES = tuple(_EMBEDDING_SHAPES)
# The adapters every method trains through: what is trained and how the base weights are held.
ADAPTERS = {"lora": "LoRA", "qlora": "QLoRA (4-bit)", "full": "Full fine-tuning"}


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


# The metrics every transformers.Trainer-based method logs (the generic progress callback reports them).
TRAINER_METRICS = (
    MetricSpec("loss", "Train loss", axis="loss", tile=True),
    MetricSpec("eval_loss", "Eval loss", axis="loss", tile=True),
    MetricSpec("learning_rate", "Learning rate", axis="learning rate", format=".1e", tile=True),
    MetricSpec("grad_norm", "Grad norm", axis="gradient norm", tile=True),
    MetricSpec("tokens_per_s", "Tokens/s", axis="tokens per second", format=".3g", tile=True),
)


def no_checks(cfg: Any) -> list[FieldError]:
    """For a method whose settings are all checked by TrainConfig.validate."""
    return []


def no_saved_modules(cfg: Any) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class MethodSpec:
    """The dashboard half of a method. ``cfg`` below is a ``trainer_core.config.TrainConfig``.

    * ``section``: the TrainConfig fields that belong to this method alone. A YAML file may group them
      under a mapping named after the method (``cpt: {embedding_learning_rate: 5e-5}``); the form shows
      them in the method's section.
    * ``data_shapes``: keys of ``SHAPES`` the method trains on; other data is refused by the loader with
      ``data_fix`` as the fix.
    * ``validate(cfg)``: every problem with the method's own settings, each naming field and fix.
    * memory factors (trainer_core.planning.memory): ``saved_modules(cfg)`` are modules of vocabulary x hidden size
      trained in full beside the adapter (embed_tokens, lm_head); ``activation_factor`` is forward passes
      kept per row (1 for one sequence per row); ``reference_model`` a frozen copy of the weights the
      method compares against.
    * ``metric_specs``: what charts and tiles show for its runs.
    * preview hook: ``preview_fields`` are the settings that change what the data preview shows;
      ``packing_strategy`` is TRL's packing rule the preview and the trainer share.
    """

    name: str
    label: str  # shown in the Method picker
    help: str
    data_shapes: tuple[str, ...]
    data_fix: str
    section: tuple[str, ...] = ()
    validate: Callable[[Any], list[FieldError]] = no_checks
    saved_modules: Callable[[Any], tuple[str, ...]] = no_saved_modules
    activation_factor: float = 1.0
    reference_model: bool = False
    metric_specs: tuple[MetricSpec, ...] = TRAINER_METRICS
    preview_fields: tuple[str, ...] = ()
    packing_strategy: str = "bfd"
    adapters: tuple[str, ...] = tuple(ADAPTERS)
    # The worker half loads its own model (``load_model(cfg, model_ref, token, warn)`` -> (model, tokenizer)):
    # embedding models are SentenceTransformer objects, not the engine's AutoModelForCausalLM.
    loads_own_model: bool = False
    # The method's own settings: a dataclass (trainer_core.methods.settings) built once when a config is read,
    # from the YAML section named after the method (``dpo: {beta: 0.1}``), and held as
    # ``TrainConfig.method_settings``; a new method adds no TrainConfig field. None: the method has only
    # ``section`` fields.
    settings: type | None = None
    # How the engine loads the model: causal_lm (AutoModelForCausalLM) or sequence_classification (a
    # one-label score head: reward models).
    model_class: str = "causal_lm"
    # Forward passes kept per row when they depend on the settings (GRPO: one per completion of a group);
    # None: ``activation_factor``.
    activations: Callable[[Any], float] | None = None
    # The metric specs of a run from its stored config (a dict: GRPO's per-reward keys depend on the reward
    # names); None: ``metric_specs``.
    metrics_for: Callable[[dict], tuple[MetricSpec, ...]] | None = None
    # Why only an admin may start a run of this method with these settings (code it runs on this host: GRPO's Python
    # rewards); the orchestrator refuses such a run from anyone else, naming each reason. None: any operator may.
    admin_reasons: Callable[[Any], list[str]] | None = None
    # Files a run needs beside its config.yaml, written into its folder at submit (GRPO: a copy of each Python reward,
    # hashed, which the worker loads instead of the user's file). None: none.
    job_files: Callable[[Any, Path], None] | None = None

    # What the trained model produces, and so its model kind (trainer_core.kinds: the capability row that says what
    # the studio can do with it after training): "text" writes answers (the base model's kind then decides between
    # text and vision-language); "reward" scores answers; "embedding" turns text into vectors; "speech" writes
    # transcripts of audio; "audio" speaks text.
    output: str = "text"

    def activation_factor_of(self, cfg: Any) -> float:
        return self.activations(cfg) if self.activations is not None else self.activation_factor

    def metric_specs_of(self, config: dict) -> tuple[MetricSpec, ...]:
        return self.metrics_for(config) if self.metrics_for is not None else self.metric_specs

    def shapes_text(self) -> str:
        return " or ".join(SHAPES[s] for s in self.data_shapes)
