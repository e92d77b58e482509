"""Reward models (dashboard half): a language model with a one-label score head, trained with method reward on
preference pairs; it scores answers and writes none, so it is used as a GRPO run's reward model. A base model is
never told to be one from its files: the method that trained a run decides."""
from __future__ import annotations

from trainer_core.kinds.base import NEEDS_WRITER, NO_ONNX, ModelKind, never

KIND = ModelKind(
    name="reward",
    label="Reward / classifier",
    summary="A model that scores answers (a sequence-classification head): a GRPO run's reward model.",
    detected_by="never from a model's files: a run of method reward",
    detect=never,
    output="reward",
    data_shapes=("pairs",),
    methods=("reward",),
    adapters=("lora", "qlora", "full"),
    method_fix="choose a text model (method reward puts a score head on it)",
    serve_routes=(),
    serve_engine="",
    not_served="served",
    vllm="vLLM serves models that write answers",
    not_evaluated="evaluated by its answers",
    eval_instead="its pair accuracy on the eval split is charted during training (Run details)",
    exports={"merged": NEEDS_WRITER, "gguf": NEEDS_WRITER, "onnx": NO_ONNX},
    default_exports=("adapter",),
    playground="",
    samples="pair accuracy on the eval split",
    uses="it scores answers and does not write them: use it as a GRPO run's reward model "
         "(grpo.rewards: [{reward_model: <this run>}])",
    worker="trainer_core.worker.methods.reward",
)
