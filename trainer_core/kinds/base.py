"""What a model kind tells the studio: one row of the capability table (dashboard half, no ML imports).

A model kind (text, vision-language, speech-to-text, text-to-speech, embedding, reward) is a plug-in like a method:
this dataclass is its dashboard half, ``trainer_core/kinds/<name>.py`` holds one, ``trainer_core.kinds`` the one
registry, and ``worker`` names the module of its worker half (auto class, processor, collator, samples). Every
consumer (export, serve, eval, Playground, New run, the model card) asks the row instead of branching on the kind's
name; docs/model-kinds.md is generated from the rows (``python -m trainer_core.kinds``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# Export targets, in the order the Export form lists them
EXPORT_TARGETS = ("adapter", "merged", "gguf", "onnx")
# Why ONNX is refused for every kind but the one whose sentence-transformers folder optimum exports
NO_ONNX = ("onnx: only an embedding run (a sentence-transformers folder) is exported to ONNX here: choose adapter, "
           "merged or gguf for this run")
# Playground modes (ModelKind.playground): chat (text and vision-language), search, transcribe, speak
CHAT, SEARCH, TRANSCRIBE, SPEAK = "chat", "search", "transcribe", "speak"
# An export target refused because it loads the model as one that writes answers: the export spec says what the
# model is for instead (model_source.ResolvedSource.not_a_writer) and what to export
NEEDS_WRITER = "merged into a model that writes answers"


@dataclass(frozen=True)
class Facts:
    """What a model folder says about itself, read once from its JSON files (``planning.modality.model_facts``):
    ``config`` is config.json, ``processor`` the merged (pre)processor config, ``files`` the names of the folder's
    marker files that decide a kind (modules.json of a sentence-transformers folder)."""

    config: dict
    processor: dict = field(default_factory=dict)
    files: frozenset[str] = frozenset()

    @property
    def architecture(self) -> str:
        names = self.config.get("architectures")  # a list of class names as transformers writes it; the file is the user's
        return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else "unknown"

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type") or "unknown")


def never(facts: Facts) -> bool:
    """For a kind that is told by the method that trained it, never from a base model's files."""
    return False


@dataclass(frozen=True)
class ModelKind:
    """One model kind and everything the studio can do with it. Refusals are sentences that name the reason and
    the fix; an empty string means allowed.

    * ``detect(facts)``: whether a model folder is of this kind (kinds are tried in the registry's order);
      ``detected_by`` says how, for the docs.
    * ``output``: what a run of it produces, in ``MethodSpec.output``'s words (text, reward, embedding, speech,
      audio): the method decides the kind of its runs, the model's files the kind of a base model.
    * ``methods`` / ``adapters``: what trains it; ``method_fix``: what to choose when a model of
      another kind meets this kind's methods (or its data).
    * ``serve_routes``: its OpenAI-compatible routes (empty: not served; ``not_served`` completes "it cannot be
      ..." and ``uses`` says what instead); ``serve_engine``: the server that answers them; ``vllm``: why vLLM
      cannot serve it ("" when it can).
    * ``eval_metrics``: what an eval job scores it with (``eval_defaults``: what the Eval form picks first); a kind
      with none is refused by eval jobs, saying what it
      cannot be (``not_evaluated``) and where its quality shows instead (``eval_instead``).
    * ``exports``: target -> "" (offered) or why it is refused; ``default_exports``: what the Export form offers
      first; ``gguf_needs_converter``: GGUF only where llama.cpp's installed converter knows the architecture
      (asked at export time); ``lora_merge_refusal``: why a LoRA run of this kind is not merged (exported as
      its adapter only; "" when it merges).
    * ``playground``: its Playground mode ("" when it has none); ``samples``: what Live shows during training.
    * ``memory_inputs``: what the memory estimate reads beyond the model's size.
    * ``uses``: what a model that writes no answers is for instead ("" for kinds that write answers).
    * ``worker``: the dotted module of its worker half.
    """

    name: str
    label: str
    summary: str
    detected_by: str
    detect: Callable[[Facts], bool]
    output: str
    data_shapes: tuple[str, ...]
    methods: tuple[str, ...]
    adapters: tuple[str, ...]
    method_fix: str
    serve_routes: tuple[str, ...]
    serve_engine: str
    exports: dict[str, str]
    default_exports: tuple[str, ...]
    playground: str
    samples: str
    worker: str
    eval_metrics: tuple[str, ...] = ()
    eval_defaults: tuple[str, ...] = ()
    not_evaluated: str = ""
    eval_instead: str = ""
    not_served: str = ""
    vllm: str = ""
    gguf_needs_converter: bool = False
    lora_merge_refusal: str = ""
    memory_inputs: tuple[str, ...] = ("parameters", "sequence length", "batch size", "adapter", "precision")
    uses: str = ""
    processor: bool = False  # saved and loaded with a processor (images or audio), not a tokenizer alone

    @property
    def writes_answers(self) -> bool:
        return self.output == "text"

    @property
    def sees_images(self) -> bool:
        return "images" in self.data_shapes

    @property
    def served(self) -> bool:
        return bool(self.serve_routes)

    def export_refusal(self, target: str) -> str:
        """Why ``target`` is refused for this kind ("" when offered; unknown targets are the export spec's to name)."""
        return self.exports.get(target, "")

    def trains(self, method: str) -> bool:
        return method in self.methods
