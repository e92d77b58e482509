"""How much memory a run will need, from the model's shape and the config, and whether it fits.

An estimate, not a measurement: it counts the big tensors (weights, trainable copies, gradients,
optimizer state, saved activations, logits) for the engine that will run and adds a runtime overhead.
Units are GB = 10^9 bytes. Assumptions per engine (bench/gpu_smoke.py prints the estimate next to the
measured peak so they can be calibrated on a GPU):

* transformers + peft + trl: QLoRA's ``prepare_model_for_kbit_training`` upcasts every weight that is not
  4-bit (embeddings, lm_head, norms) to fp32; the loss materialises the logits and an fp32 copy of them.
* Unsloth: its gradient checkpointing offloads each layer's saved input to CPU RAM, its fused RMSNorm /
  RoPE / SwiGLU kernels keep about half of what eager PyTorch saves per layer, and its chunked
  cross-entropy holds a quarter of the batch's bf16 logits at a time and no fp32 copy.
* Full fine-tuning on a GPU keeps fp32 master weights, gradients and optimizer moments, and autocast holds
  a 16-bit working copy of the weights during the step. Dashboard-safe: no torch here; the GPU is read with
NVML (``pynvml`` from nvidia-ml-py, optional) and system RAM with psutil.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import psutil

from trainer_core.host import hardware
from trainer_core.config import TrainConfig
from trainer_core.planning.model_info import ModelInfo

GB = 1e9
# bitsandbytes NF4 with double quantization: 4 bits per weight, one 8-bit absmax per 64 weights,
# one fp32 constant per 256 absmax values.
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
LORA_BYTES = 4  # PEFT keeps LoRA A/B in fp32 even on a bf16 model (autocast_adapter_dtype)
CUDA_OVERHEAD_GB = 0.8  # CUDA context, cuBLAS workspace
CPU_OVERHEAD_GB = 1.0  # Python, torch and tokenizer libraries resident in the worker
FRAGMENTATION = 0.10  # allocator slack on top of the counted tensors
TIGHT_RATIO = 0.85  # above this share of free memory a run is "tight"
TRANSFORMERS, UNSLOTH = "transformers", "unsloth"  # engine names (trainer_core.worker.engines)
UNSLOTH_LAYER_SHARE = 0.5  # share of eager PyTorch's saved activations per layer that Unsloth's kernels keep
UNSLOTH_LOSS_CHUNKS = 4  # its chunked cross-entropy holds 1/4 of the logits at a time


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gb: float
    trainable_params: int
    adapter_gb: float  # trainable copies that sit beside the base weights: LoRA A/B, saved embeddings
    gradients_gb: float
    optimizer_gb: float
    activations_gb: float
    overhead_gb: float
    total_gb: float

    def rows(self) -> list[tuple[str, float]]:
        return [("Model weights", self.weights_gb), ("Adapters and saved modules", self.adapter_gb),
                ("Gradients", self.gradients_gb), ("Optimizer state", self.optimizer_gb),
                ("Activations", self.activations_gb), ("Runtime overhead", self.overhead_gb),
                ("Total", self.total_gb)]


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "cuda" or "cpu"
    label: str
    free_gb: float  # NaN when it could not be read
    total_gb: float


# ---------------------------------------------------------------------- estimate
def module_shapes(info: ModelInfo) -> dict[str, tuple[int, int]]:
    """(in, out) features of the adaptable linear layers in one Llama-style decoder layer."""
    h, i = info.hidden_size, info.intermediate_size
    return {"q_proj": (h, info.q_dim), "k_proj": (h, info.kv_dim), "v_proj": (h, info.kv_dim),
            "o_proj": (info.q_dim, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def encoder_module_shapes(info: ModelInfo) -> dict[str, list[tuple[int, int]]]:
    """(in, out) features of the linear layers in one BERT-style encoder layer, by the names LoRA targets
    (``dense`` is the attention output, the intermediate and the output projection)."""
    h, i = info.hidden_size, info.intermediate_size
    return {"query": [(h, info.q_dim)], "key": [(h, info.kv_dim)], "value": [(h, info.kv_dim)],
            "dense": [(h, h), (h, i), (i, h)]}


def _is_encoder(cfg: TrainConfig) -> bool:
    """An embedding model (sentence-transformers): an encoder with pooling, no language-model head."""
    return cfg.method_spec.model_class == "sentence_embedding"


def _encoder_lora_parameters(info: ModelInfo, cfg: TrainConfig) -> int:
    shapes = encoder_module_shapes(info)
    targets = cfg.method_settings.lora_target_modules  # an EmbeddingSettings
    per_layer = sum(cfg.lora_r * (fan_in + fan_out) for name in targets for fan_in, fan_out in shapes.get(name, []))
    return per_layer * info.num_layers


def lora_parameters(info: ModelInfo, cfg: TrainConfig) -> int:
    """r x (in + out) per adapted module and layer (experts each get their own adapter)."""
    if _is_encoder(cfg):
        return _encoder_lora_parameters(info, cfg)
    shapes = module_shapes(info)
    experts = max(info.num_experts, 1)
    per_layer = 0
    for name in cfg.effective_target_modules:
        if name in shapes:
            fan_in, fan_out = shapes[name]
            copies = experts if name in ("gate_proj", "up_proj", "down_proj") else 1
            per_layer += cfg.lora_r * (fan_in + fan_out) * copies
    return per_layer * info.num_layers


def saved_module_count(cfg: TrainConfig) -> int:
    """Modules of vocabulary x hidden size the method trains in full beside the adapter (its memory factor:
    continued pretraining with an embedding LR saves embed_tokens and lm_head)."""
    return len(cfg.method_spec.saved_modules(cfg))


def saves_embeddings(cfg: TrainConfig) -> bool:
    return saved_module_count(cfg) > 0


def _optimizer_bytes(optim: str, param_bytes: float) -> float:
    """Optimizer state per trainable parameter."""
    if optim in ("adamw_8bit", "paged_adamw_8bit"):
        return 2.0  # two 8-bit moments (block constants are negligible)
    if optim == "sgd":
        return 0.0  # the Trainer's SGD has no momentum buffer
    if optim == "adafactor":
        return 4.0 / 32  # factored second moments: a row and a column vector per matrix, a small share
    return 2.0 * param_bytes  # AdamW: exp_avg and exp_avg_sq in the parameter's dtype


def _activation_bytes(info: ModelInfo, cfg: TrainConfig, act_bytes: int, on_cpu: bool, seq: int,
                      engine: str = TRANSFORMERS) -> float:
    """Tensors autograd keeps for the backward pass, for batches padded to ``seq`` tokens."""
    tokens = cfg.batch_size * seq
    h = info.hidden_size
    # per token and layer: attention block (norm in/out, q, k, v, attention output, residual) and gated MLP
    # (norm in/out, gate, up, act(gate), gate*up)
    per_layer = 5 * h + 2 * info.q_dim + 2 * info.kv_dim + 4 * info.intermediate_size
    if cfg.effective_use_lora and cfg.lora_dropout > 0:  # PEFT keeps the dropped-out input of each adapted module
        per_layer += sum(module_shapes(info)[m][0] for m in cfg.effective_target_modules if m in module_shapes(info))
    layer_bytes = per_layer * tokens * act_bytes
    # CPU attention (SDPA math path) keeps the softmax probabilities: heads x seq x seq per row; GPU
    # kernels (flash / memory-efficient) do not materialise them.
    attention = cfg.batch_size * info.num_attention_heads * seq ** 2 * act_bytes if on_cpu else 0
    if engine == UNSLOTH:
        layer_bytes *= UNSLOTH_LAYER_SHARE
    if cfg.gradient_checkpointing:  # layer inputs only, plus one layer recomputed during backward
        inputs = 0 if engine == UNSLOTH else info.num_layers * h * tokens * act_bytes  # Unsloth: in CPU RAM
        layers = inputs + layer_bytes + attention
    else:
        layers = info.num_layers * (layer_bytes + attention)
    if _is_encoder(cfg):
        logits = tokens * h * 4  # no vocabulary logits: one pooled embedding per text, and its similarities
    elif engine == UNSLOTH:
        logits = tokens * info.vocab_size * act_bytes / UNSLOTH_LOSS_CHUNKS
    else:
        logits = tokens * info.vocab_size * (act_bytes + 4)  # logits, and their fp32 copy for the cross-entropy
    # a method that keeps several forward passes per row (chosen and rejected answers) keeps as many of both
    return (layers + logits) * cfg.method_spec.activation_factor_of(cfg)


def estimate_memory(info: ModelInfo, cfg: TrainConfig, device: str = "cuda",
                    longest_row: int | None = None, engine: str = TRANSFORMERS) -> MemoryEstimate:
    """Peak memory of a training step for ``cfg`` on ``device`` ("cuda": bf16 compute; "cpu": fp32) with
    ``engine`` ("transformers" or "unsloth"; Unsloth only runs on CUDA).

    Batches are padded to their longest row, so without packing the peak comes from the longest row:
    pass ``longest_row`` (e.g. ``max(preview.lengths)``) to size activations from the data instead of
    assuming every row fills max_seq_length.
    """
    on_cpu = device == "cpu"
    engine = TRANSFORMERS if on_cpu else engine
    seq = cfg.max_seq_length
    if _is_encoder(cfg) and info.max_position_embeddings:  # an encoder truncates to its position table
        seq = min(seq, int(info.max_position_embeddings))
    if longest_row and not cfg.packing:  # packed rows are always max_seq_length long
        seq = min(longest_row, cfg.max_seq_length)
    dtype_bytes = 4 if on_cpu else 2
    params = info.num_parameters
    embeddings = info.vocab_size * info.hidden_size * (1 if info.tie_word_embeddings else 2)
    if cfg.effective_4bit:
        # linear layers in NF4; embeddings and lm_head stay 16-bit (Unsloth) or are upcast to fp32 by
        # prepare_model_for_kbit_training (transformers)
        weights = (params - embeddings) * NF4_BYTES + embeddings * (2 if engine == UNSLOTH else 4)
    elif not cfg.effective_use_lora and not on_cpu:
        weights = params * (4 + dtype_bytes)  # fp32 master weights + autocast's 16-bit working copy
    else:
        weights = params * dtype_bytes

    if cfg.effective_use_lora:
        lora = lora_parameters(info, cfg)
        saved = saved_module_count(cfg) * info.vocab_size * info.hidden_size
        saved_bytes = 2 if cfg.effective_4bit else dtype_bytes  # copies keep the base weights' dtype
        trainable = lora + saved
        adapter = lora * LORA_BYTES + saved * saved_bytes
        gradients = adapter
        optimizer = lora * _optimizer_bytes(cfg.optim, LORA_BYTES) + saved * _optimizer_bytes(cfg.optim, saved_bytes)
    else:  # full fine-tuning: gradients and moments follow the fp32 master weights
        trainable = params
        adapter = 0.0
        gradients = params * 4
        optimizer = params * _optimizer_bytes(cfg.optim, 4)

    activations = _activation_bytes(info, cfg, dtype_bytes, on_cpu, seq, engine)
    if cfg.method_spec.reference_model and not cfg.effective_use_lora:
        weights += params * dtype_bytes  # a frozen reference copy (LoRA methods use the base without adapters)
    counted = weights + adapter + gradients + optimizer + activations
    overhead = (CPU_OVERHEAD_GB if on_cpu else CUDA_OVERHEAD_GB) * GB + FRAGMENTATION * counted
    return MemoryEstimate(
        weights_gb=weights / GB, trainable_params=int(trainable), adapter_gb=adapter / GB,
        gradients_gb=gradients / GB, optimizer_gb=optimizer / GB, activations_gb=activations / GB,
        overhead_gb=overhead / GB, total_gb=(counted + overhead) / GB)


# ---------------------------------------------------------------------- device
def device_memory(cfg: TrainConfig) -> DeviceMemory:
    """Free and total memory of the GPU the run will use, or of system RAM on a CPU host."""
    if hardware.cuda_available():
        index = cfg.gpu_ids[0] if cfg.gpu_ids else 0
        return _gpu_memory(index)
    ram = psutil.virtual_memory()
    return DeviceMemory(device="cpu", label="system RAM", free_gb=ram.available / GB, total_gb=ram.total / GB)


def _gpu_memory(index: int) -> DeviceMemory:
    if not hardware.has_module("pynvml"):
        return DeviceMemory(device="cuda", label=f"GPU {index} (install nvidia-ml-py to read its free memory)",
                            free_gb=math.nan, total_gb=math.nan)
    import pynvml  # optional dependency, checked above

    try:
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        return DeviceMemory(device="cuda", label=f"GPU {index} (NVML error: {exc})", free_gb=math.nan,
                            total_gb=math.nan)
    name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceMemory(device="cuda", label=f"{name} (GPU {index})", free_gb=mem.free / GB, total_gb=mem.total / GB)


# ---------------------------------------------------------------------- verdict
def fit_message(est: MemoryEstimate, dev: DeviceMemory, cfg: TrainConfig,
                info: ModelInfo | None = None, engine: str = TRANSFORMERS) -> tuple[str, str]:
    """(level, text): "ok", "tight" or "too_big", and what to change when it is not ok.

    With ``info`` the suggestions carry the estimate each change would give.
    """
    need = f"about {est.total_gb:.1f} GB"
    if not math.isfinite(dev.free_gb):
        return "tight", f"The run needs {need}; the free memory of {dev.label} is unknown."
    have = f"{dev.free_gb:.1f} GB free on {dev.label}"
    if est.total_gb <= TIGHT_RATIO * dev.free_gb:
        return "ok", f"Fits: needs {need} of {have}."
    changes = _suggestions(cfg, dev.device, info, engine)
    advice = (" To make room: " + "; ".join(changes) + ".") if changes else ""
    if est.total_gb <= dev.free_gb:
        return "tight", f"Tight: needs {need} of {have}; longer rows or other programs may push it over.{advice}"
    return "too_big", f"Will not fit: needs {need} but only {have}.{advice}"


def _suggestions(cfg: TrainConfig, device: str, info: ModelInfo | None, engine: str = TRANSFORMERS) -> list[str]:
    """Changes that lower memory, biggest saving first when the model is known."""
    options: list[tuple[str, TrainConfig]] = []
    full = not cfg.effective_use_lora
    if full:
        options.append(("use LoRA instead of full fine-tuning", dataclasses.replace(cfg, adapter="lora")))
    if device == "cuda" and not cfg.effective_4bit:
        options.append(("use QLoRA (4-bit weights)", dataclasses.replace(cfg, adapter="qlora")))
    if not cfg.gradient_checkpointing:
        options.append(("turn on gradient checkpointing", dataclasses.replace(cfg, gradient_checkpointing=True)))
    if cfg.batch_size > 1:
        half = max(1, cfg.batch_size // 2)
        accumulation = cfg.gradient_accumulation_steps * cfg.batch_size // half
        text = f"lower batch_size to {half} and raise gradient_accumulation_steps to {accumulation} (same effective batch)"
        options.append((text,
                        dataclasses.replace(cfg, batch_size=half, gradient_accumulation_steps=accumulation)))
    if cfg.max_seq_length > 256:
        half = cfg.max_seq_length // 2
        options.append((f"lower max_seq_length to {half}", dataclasses.replace(cfg, max_seq_length=half)))
    if full and device == "cuda" and cfg.optim in ("adamw_torch", "adamw_torch_fused"):
        options.append(("use the adamw_8bit optimizer", dataclasses.replace(cfg, optim="adamw_8bit")))
    if info is None:
        return [text for text, _ in options]
    priced = [(estimate_memory(info, changed, device, engine=engine).total_gb, text) for text, changed in options]
    return [f"{text} (about {total:.1f} GB)" for total, text in sorted(priced)]
