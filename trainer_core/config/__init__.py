"""The one typed run configuration: the form, presets, the CLI and the database all use it.

Every field has a default and a help text (``train_config.TrainConfig``). ``validate`` collects every problem at once
and names the field and the fix, so the form can show them together (``checks``). Loose input (YAML, the form, JSON,
old files) is read and converted in ``reading``; the names, choices and limits it is checked against are in
``limits``. Secrets (``hf_token``, ``wandb_token``) are fields so the form can hold them, but ``to_public_dict`` /
``to_yaml`` strip them.

This package's names are imported from here (``from trainer_core.config import TrainConfig``).
"""
from __future__ import annotations

from trainer_core.config.checks import (builtin_loader_names, hub_dataset_problem, looks_like_path,
                                        ray_address_problem, sample_prompts_of, server_cluster)
from trainer_core.config.limits import (_HUB_ID_RE, ATTENTION_MODULES, BUNDLED_DATASET, BUNDLED_MODEL, BUNDLED_PAIRS,
                                        CONFIG_BYTES_MAX, DEFAULT_TARGET_MODULES, FORMAT_TYPES, HUB_ID_MAX, LAUNCHERS,
                                        MAPPING_VALUE_MAX, MLP_MODULES, OPTIMIZERS, RAY_ADDRESS_ENV,
                                        RAY_ADDRESSES_ENV, RAY_MAX_FAILURES, SAMPLE_NEW_TOKENS_MAX,
                                        SAMPLE_PROMPT_CHARS, SAMPLE_PROMPTS_MAX, SCHEDULERS, SHARED_STORAGE_ENV,
                                        TEXT_LIMITS, TOOL_TEMPLATES)
from trainer_core.config.reading import (IS_EMBEDDING_NOTE, TrainingTypeDeprecation, load_yaml, read_is_embedding,
                                         read_training_type, read_yaml_file, secrets_in_file, training_type_note)
from trainer_core.config.train_config import TrainConfig
from trainer_core.protocol.errors import ConfigError, FieldError
from trainer_core.protocol.secrets import SECRET_FIELDS

__all__ = ["ATTENTION_MODULES", "BUNDLED_DATASET", "BUNDLED_MODEL", "BUNDLED_PAIRS", "CONFIG_BYTES_MAX",
           "ConfigError", "DEFAULT_TARGET_MODULES", "FORMAT_TYPES", "FieldError", "HUB_ID_MAX", "IS_EMBEDDING_NOTE",
           "LAUNCHERS", "MAPPING_VALUE_MAX", "MLP_MODULES", "OPTIMIZERS", "RAY_ADDRESSES_ENV", "RAY_ADDRESS_ENV",
           "RAY_MAX_FAILURES", "SAMPLE_NEW_TOKENS_MAX", "SAMPLE_PROMPTS_MAX", "SAMPLE_PROMPT_CHARS", "SCHEDULERS",
           "TOOL_TEMPLATES",
           "SECRET_FIELDS", "SHARED_STORAGE_ENV", "TEXT_LIMITS", "TrainConfig", "TrainingTypeDeprecation",
           "_HUB_ID_RE", "builtin_loader_names", "hub_dataset_problem", "load_yaml", "looks_like_path",
           "ray_address_problem", "read_is_embedding", "read_training_type", "read_yaml_file", "sample_prompts_of", "server_cluster", "secrets_in_file",
           "training_type_note"]
