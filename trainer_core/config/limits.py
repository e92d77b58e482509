"""The names, choices and limits a run configuration is checked against (trainer_core.config)."""
from __future__ import annotations

import re


LAUNCHERS = ("local", "ray")
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable: the cluster's dashboard address (Ray Jobs)
RAY_ADDRESSES_ENV = "FINETUNE_STUDIO_RAY_ADDRESSES"  # other clusters a run may name (an admin's comma-separated list)
SHARED_STORAGE_ENV = "FINETUNE_STUDIO_SHARED_STORAGE"  # a path every node of the Ray cluster mounts
RAY_MAX_FAILURES = 10  # restarts of a Ray run's workers: each one repeats the steps since the last checkpoint
BUNDLED_MODEL = "bundled:SmolLM2-135M-Instruct"
BUNDLED_DATASET = "bundled:demo-chat"
BUNDLED_PAIRS = "bundled:demo-pairs"  # the demo's questions as preference pairs (DPO, ORPO, SimPO, KTO, reward)
BUNDLED_TOOLS = "bundled:demo-tools"  # tool-calling conversations (scripts/make_tool_dataset.py)
BUNDLED_TOOLS_EVAL = "bundled:demo-tools-eval"  # the same tools with other cities and numbers, held out
TOOL_TEMPLATES = ("auto", "model", "hermes")  # data.tool_calls, export.tool_templates
FORMAT_TYPES = ("auto", "alpaca", "chatml", "sharegpt", "xlam", "text")
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd")
DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj"]
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_RUN_NAME_RE = re.compile(r"^[\w .,:()+=@-]{1,80}$")
HUB_ID_MAX = 200  # the hub allows 96 characters for the owner and for the name
# Longest accepted free text per field: a prompt is a paragraph, names are names. Anything longer is a paste
# gone wrong, and would be copied into every training row (system_prompt) or every page that shows the run.
TEXT_LIMITS = {"system_prompt": 20_000, "subset": 200, "train_split": 200, "eval_split": 200, "wandb_project": 128}
MAPPING_VALUE_MAX = 200
# A config is a few dozen fields (a few KB); parsing a hostile 24 MB YAML of 1.5M keys took minutes and GBs, so a
# file or text above this is refused before it is parsed, with the limit in the message.
CONFIG_BYTES_MAX = 1 << 20
SAMPLE_PROMPTS_MAX = 8  # each one costs a greedy generation at every sampling step
SAMPLE_PROMPT_CHARS = 2_000
SAMPLE_NEW_TOKENS_MAX = 1_024
