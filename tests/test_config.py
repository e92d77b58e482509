"""The typed run config: validation rules, loose-input parsing and secret handling."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainer_core import methods
from trainer_core.host import hardware
from trainer_core.methods import METHODS
from trainer_core.config import (ATTENTION_MODULES, DEFAULT_TARGET_MODULES, MLP_MODULES, ConfigError, FieldError,
                                 TrainConfig)

QLORA_ON_CPU = "4-bit loading (QLoRA) needs an NVIDIA GPU with CUDA, and none was found. Choose LoRA instead."


def errors(**values) -> list[FieldError]:
    return TrainConfig(**values).validate()


@pytest.fixture
def fake_cuda(fake_gpu_host):
    """A CUDA host with two GPUs and bitsandbytes installed."""


@pytest.fixture
def with_module(monkeypatch):
    """Pretend an optional package is installed."""
    real = hardware.has_module

    def install(name: str) -> None:
        monkeypatch.setattr(hardware, "has_module", lambda n: n == name or real(n))

    return install


# ---------------------------------------------------------------------- defaults
def test_defaults_validate_cleanly_without_files(home):
    assert errors() == []


def test_defaults_validate_cleanly_with_files(home):
    assert TrainConfig().validate() == []
    assert TrainConfig().check() == TrainConfig()


def test_defaults():
    cfg = TrainConfig()
    assert (cfg.model_name, cfg.method, cfg.adapter, cfg.local_datasets, cfg.max_steps, cfg.learning_rate) == (
        "bundled:SmolLM2-135M-Instruct", "sft", "lora", ["bundled:demo-chat"], 60, 2e-4)
    assert cfg.target_modules == DEFAULT_TARGET_MODULES
    assert cfg.target_modules is not TrainConfig().target_modules  # mutable defaults are not shared
    assert cfg.model_label == "SmolLM2-135M-Instruct (bundled)"
    assert cfg.dataset_label == "bundled:demo-chat"
    assert cfg.method_label == "LoRA"
    assert all(TrainConfig.help(name) for name in TrainConfig.field_names())


# ---------------------------------------------------------------------- one rule each
@pytest.mark.parametrize("value, message", [
    (0.0, "set a positive learning rate such as 2e-4 (got 0.0)"),
    (-1e-4, "set a positive learning rate such as 2e-4 (got -0.0001)"),
    (math.nan, "must be a finite number, got nan"),
    (math.inf, "must be a finite number, got inf"),
    (-math.inf, "must be a finite number, got -inf"),
    (1.5, "must be > 0.0 and <= 1.0, got 1.5"),  # too high names the bound, not the "positive" fix
])
def test_learning_rate(home, value, message):
    assert errors(learning_rate=value) == [FieldError("learning_rate", message)]


def test_batch_size_zero(home):
    assert errors(batch_size=0) == [FieldError("batch_size", "use a batch size of at least 1 (got 0)")]


def test_max_steps_and_epochs_both_zero(home):
    assert errors(max_steps=0, num_epochs=0.0) == [FieldError(
        "max_steps", "max_steps and num_epochs are both 0: set max steps (e.g. 60) or epochs (e.g. 1)")]
    assert errors(max_steps=0, num_epochs=1.0) == []
    assert errors(max_steps=10, num_epochs=0.0) == []


def test_warmup_steps_and_ratio_both_set(home):
    assert errors(warmup_steps=5, warmup_ratio=0.1) == [FieldError(
        "warmup_ratio", "set either warmup_steps or warmup_ratio, not both (set the other to 0)")]
    assert errors(warmup_steps=0, warmup_ratio=0.1) == []


def test_qlora_on_cpu_points_to_lora(home):
    assert errors(adapter="qlora") == [FieldError("adapter", QLORA_ON_CPU)]
    with pytest.warns(FutureWarning):  # the old name, mapped where the config is read
        assert TrainConfig.from_dict({"training_type": "qlora"}).validate() == [FieldError("adapter", QLORA_ON_CPU)]
    assert errors(load_in_4bit=True) == [FieldError("load_in_4bit", QLORA_ON_CPU)]


def test_qlora_with_cuda_is_fine(home, fake_cuda):
    assert errors(adapter="qlora") == []
    assert errors(optim="paged_adamw_8bit") == []


@pytest.mark.parametrize("optim", ["adamw_8bit", "paged_adamw_8bit"])
def test_8bit_optimizer_on_cpu(home, optim):
    assert errors(optim=optim) == [FieldError(
        "optim", "8-bit optimizers need CUDA (bitsandbytes); choose adamw_torch on this machine")]


def test_unknown_choices(home):
    assert errors(optim="lion", lr_scheduler_type="wavy", format_type="xml", method="ppo", adapter="dora") == [
        FieldError("method", f"choose one of {', '.join(METHODS)}"),
        FieldError("adapter", "choose one of lora, qlora, full"),
        FieldError("lr_scheduler_type", "choose one of linear, cosine, cosine_with_restarts, polynomial, constant, "
                                        "constant_with_warmup"),
        FieldError("optim", "choose one of adamw_torch, adamw_torch_fused, adamw_8bit, paged_adamw_8bit, adafactor, "
                            "sgd"),
        FieldError("format_type", "choose one of auto, alpaca, chatml, sharegpt, xlam, text"),
    ]


def test_lora_rank_zero(home):
    assert errors(lora_r=0) == [FieldError("lora_r", "use a rank such as 8, 16 or 64 (got 0)")]
    # LoRA settings do not matter when LoRA is off
    assert errors(lora_r=0, adapter="full") == []


def test_empty_target_modules_need_a_switch(home):
    assert errors(target_modules=[], finetune_attention_modules=False, finetune_mlp_modules=False) == [FieldError(
        "target_modules", "list at least one module (e.g. q_proj, v_proj) or turn on attention/MLP modules")]
    assert errors(target_modules=[], finetune_mlp_modules=False) == []
    assert TrainConfig(target_modules=[], finetune_mlp_modules=False).effective_target_modules == ATTENTION_MODULES
    assert TrainConfig(target_modules=[]).effective_target_modules == ATTENTION_MODULES + MLP_MODULES
    assert TrainConfig(target_modules=["q_proj"]).effective_target_modules == ["q_proj"]


def test_target_module_names_are_identifiers(home):
    assert errors(target_modules=["q_proj", "rm -rf /"]) == [FieldError(
        "target_modules", "module names are plain identifiers such as q_proj")]


def test_unsupported_modalities(home):
    assert errors(is_dataset_audio=True) == [FieldError("is_dataset_audio", "audio trains with method stt "
                                                        "(speech-to-text) or tts (text-to-speech): set one, or "
                                                        "turn this off")]
    assert errors(is_dataset_audio=True, method="stt") == []
    assert errors(is_dataset_audio=True, method="tts", adapter="full") == []


def test_an_old_is_embedding_switch_reads_as_the_embedding_method_with_one_note(home, monkeypatch):
    from trainer_core.methods import embedding

    monkeypatch.setattr(embedding, "_installed_version", lambda package: "0.22.0")  # LoRA's own rule is tested below
    with pytest.warns(FutureWarning, match="is_embedding is deprecated: true means method: embedding"):
        cfg = TrainConfig.from_yaml("is_embedding: true\nmodel_name: bundled:all-MiniLM-L6-v2\n")
    assert cfg.method == "embedding" and "is_embedding" not in cfg.to_dict()  # read once, never kept
    assert cfg.validate() == []
    assert TrainConfig.from_dict({"is_embedding": False}).method == "sft"  # old run folders wrote false
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"is_embedding": True, "method": "dpo"})
    assert info.value.errors == [FieldError("is_embedding", "is_embedding is deprecated: true means method: "
                                                            "embedding, but method is 'dpo': remove is_embedding")]


def test_the_bundled_embedding_model_is_for_the_embedding_method(home):
    assert errors(method="embedding", adapter="full", model_name="bundled:all-MiniLM-L6-v2") == []
    assert errors(model_name="bundled:all-MiniLM-L6-v2") == [FieldError(
        "model_name", "bundled:all-MiniLM-L6-v2 is an embedding model: choose method embedding, or a language model")]


@pytest.mark.parametrize("run_name", ["a/b", "../up", "x" * 81, "tab\there", "name\n", "semi;colon"])
def test_bad_run_name(home, run_name):
    assert errors(run_name=run_name) == [FieldError(
        "run_name", "use letters, digits, spaces and - _ . only (no slashes), at most 80 characters")]


@pytest.mark.parametrize("run_name", ["", "my run", "lr=2e-4 (v2)", "x" * 80, "smol_lora-1.5"])
def test_good_run_name(home, run_name):
    assert errors(run_name=run_name) == []


def test_model_path_that_does_not_exist(home, tmp_path):
    missing = tmp_path / "models" / "nope"
    assert errors(model_name=str(missing)) == [FieldError(
        "model_name", f"model folder {missing.resolve()} does not exist: check the path")]


def test_model_folder_without_config_json(home, tmp_path):
    folder = tmp_path / "mymodel"
    folder.mkdir()
    assert errors(model_name=str(folder)) == [FieldError(
        "model_name", f"{folder.resolve()} has no config.json: point at a Hugging Face model folder")]
    (folder / "config.json").write_text("{}")
    assert errors(model_name=str(folder)) == []


def test_model_path_outside_allowed_roots(home, tmp_path):
    outside = tmp_path.parent / "not-allowed-model"
    found = errors(model_name=str(outside))
    assert [e.field for e in found] == ["model_name"]
    assert found[0].message.startswith(f"{outside} resolves to {outside.resolve()}, which is outside the allowed")
    assert found[0].message.endswith("Put the model under the data root or set FINETUNE_STUDIO_ALLOWED_ROOTS.")


def test_model_path_escaping_with_dotdot(home, tmp_path):
    sneaky = f"{tmp_path}/../{tmp_path.name}-x/model"
    assert [e.field for e in errors(model_name=sneaky)] == ["model_name"]
    assert "outside the allowed folders" in errors(model_name=sneaky)[0].message


@pytest.mark.parametrize("hub_id", ["HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2", "Qwen/Qwen2.5-0.5B"])
def test_hub_model_id_accepted(home, hub_id):
    assert errors(model_name=hub_id) == []


@pytest.mark.parametrize("hub_id", ["org/name/extra", "bad id!", "-lead/x"])
def test_bad_hub_model_id(home, hub_id):
    assert errors(model_name=hub_id) == [FieldError("model_name", "not a hub id (org/name) nor an existing folder")]


def test_empty_model_name(home):
    assert errors(model_name="  ") == [FieldError("model_name", "choose the bundled model, a local folder or a hub id")]


def test_hub_dataset_and_local_files_together(home):
    assert errors(hf_dataset="org/data") == [FieldError(
        "hf_dataset", "choose either a hub dataset or local files, not both (clear one of them)")]


def test_hub_dataset_alone(home):
    assert errors(hf_dataset="org/data", local_datasets=[]) == []
    assert errors(hf_dataset="not a/valid id", local_datasets=[]) == [FieldError(
        "hf_dataset", "a hub dataset id looks like org/name")]
    assert errors(hf_dataset="org/data", local_datasets=[], train_split=" ") == [FieldError(
        "train_split", "name the split to train on, e.g. train")]
    assert TrainConfig(hf_dataset="org/data", subset="en", local_datasets=[]).dataset_label == "org/data [en]"


def test_no_dataset_at_all(home):
    assert errors(local_datasets=[]) == [FieldError(
        "local_datasets", "choose a dataset: the bundled demo, an uploaded file, or a hub dataset id")]


@pytest.mark.parametrize("start, end, ok", [(0, 0, True), (10, 0, True), (10, 11, True), (10, 10, False),
                                            (10, 5, False)])
def test_dataset_slice(home, start, end, ok):
    expected = [] if ok else [FieldError(
        "dataset_slice_end", "must be greater than dataset_slice_start (or 0 for 'to the end')")]
    assert errors(dataset_slice_start=start, dataset_slice_end=end) == expected


@pytest.mark.parametrize("folder", ["../tb", "logs/../../tb", "/abs/tb"])
def test_tensorboard_dir_stays_in_the_run_folder(home, with_module, folder):
    with_module("tensorboard")
    assert errors(enable_tensorboard=True, tensorboard_dir=folder) == [FieldError(
        "tensorboard_dir", "give a folder name relative to the run folder, without '..'")]
    assert errors(enable_tensorboard=True, tensorboard_dir="logs/tb") == []


def test_optional_loggers_must_be_installed(home, monkeypatch):
    monkeypatch.setattr(hardware, "has_module", lambda name: False)
    assert errors(enable_tensorboard=True, enable_wandb=True, wandb_project=" ") == [
        FieldError("enable_wandb", "wandb is not installed: pip install wandb, or turn W&B off"),
        FieldError("wandb_project", "name a W&B project"),
        FieldError("enable_tensorboard", "tensorboard is not installed: pip install tensorboard, or turn it off"),
    ]


def test_resume_from_checkpoint(home, tmp_path):
    from trainer_core.protocol import paths

    outside = tmp_path / "elsewhere" / "checkpoint-5"
    found = errors(resume_from_checkpoint=str(outside))
    assert [e.field for e in found] == ["resume_from_checkpoint"]
    assert "outside the allowed folders" in found[0].message

    ckpt = paths.run_dir("r1") / "outputs" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    assert errors(resume_from_checkpoint=str(ckpt)) == [FieldError(
        "resume_from_checkpoint", f"{ckpt} is not a completed checkpoint folder (no trainer_state.json)")]
    (ckpt / "trainer_state.json").write_text("{}")
    assert errors(resume_from_checkpoint=str(ckpt)) == []


def test_init_adapter_is_a_lora_adapter_of_this_base_and_rank(home, tmp_path):
    import json

    from trainer_core.protocol import paths

    adapter = paths.run_dir("r1") / "adapter"
    adapter.mkdir(parents=True)
    saved = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "task_type": "CAUSAL_LM"}
    (adapter / "adapter_config.json").write_text(json.dumps(saved))
    (paths.run_dir("r1") / "config.yaml").write_text(TrainConfig(lora_r=8, lora_alpha=16).to_yaml())
    assert errors(init_adapter=str(adapter), lora_r=8, lora_alpha=16) == []
    assert errors(init_adapter=str(adapter), lora_r=16, lora_alpha=16) == [FieldError(
        "lora_r", "the adapter in init_adapter has r 8: set lora_r to 8 (it goes on training as it was saved)")]
    other = tmp_path / "other-base"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert errors(init_adapter=str(adapter), lora_r=8, lora_alpha=16, model_name=str(other)) == [FieldError(
        "model_name", "the adapter in init_adapter was trained on bundled:SmolLM2-135M-Instruct: set model_name to "
                      "it")]
    assert errors(init_adapter=str(adapter), adapter="full") == [FieldError(
        "init_adapter", "a run starting from an adapter trains that adapter: choose adapter lora (or qlora), or clear "
                        "init_adapter")]
    assert errors(init_adapter=str(adapter), method="reward", lora_r=8, lora_alpha=16) == [FieldError(
        "init_adapter", "the adapter was trained for CAUSAL_LM and reward trains SEQ_CLS: start from an adapter of "
                        "the same kind, or clear init_adapter")]
    assert errors(init_adapter=str(tmp_path)) == [FieldError(
        "init_adapter", f"{tmp_path} holds no readable adapter_config.json: give a LoRA adapter folder (a finished "
                        "run's adapter/, or one of its checkpoints)")]
    found = errors(init_adapter="/etc")
    assert [e.field for e in found] == ["init_adapter"] and "outside the allowed folders" in found[0].message


def test_cpt_and_completions_need_matching_formats(home):
    assert errors(method="cpt", format_type="chatml") == [FieldError(
        "format_type", "continued pretraining trains on raw text: choose 'text' or 'auto'")]
    assert errors(train_on_completions=True, format_type="text") == [FieldError(
        "train_on_completions", "raw text has no completions: turn this off or pick a chat format")]


def test_every_problem_is_reported_at_once(home):
    cfg = TrainConfig(run_name="a/b", learning_rate=0.0, batch_size=0, lora_r=0,
                      dataset_slice_start=5, dataset_slice_end=2)
    expected = [
        FieldError("run_name", "use letters, digits, spaces and - _ . only (no slashes), at most 80 characters"),
        FieldError("learning_rate", "set a positive learning rate such as 2e-4 (got 0.0)"),
        FieldError("batch_size", "use a batch size of at least 1 (got 0)"),
        FieldError("dataset_slice_end", "must be greater than dataset_slice_start (or 0 for 'to the end')"),
        FieldError("lora_r", "use a rank such as 8, 16 or 64 (got 0)"),
    ]
    assert cfg.validate() == expected
    with pytest.raises(ConfigError) as info:
        cfg.check()
    assert info.value.errors == expected
    assert str(info.value) == "; ".join(f"{e.field}: {e.message}" for e in expected)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------------- loose input
def test_from_dict_coerces_loose_values():
    cfg = TrainConfig.from_dict({
        "packing": "true", "gradient_checkpointing": "1", "use_rslora": "off", "trust_remote_code": False,
        "learning_rate": "2e-4", "max_steps": "30", "batch_size": 8.0, "num_epochs": 2, "lora_dropout": "0.05",
        "target_modules": "q_proj, v_proj,", "gpu_ids": (0, 1), "run_name": 42,
        "custom_format_mapping": {"instruction": "question"},
    })
    assert (cfg.packing, cfg.gradient_checkpointing, cfg.use_rslora, cfg.trust_remote_code) == (
        True, True, False, False)
    assert cfg.learning_rate == 2e-4 and type(cfg.learning_rate) is float
    assert cfg.max_steps == 30 and type(cfg.max_steps) is int
    assert cfg.batch_size == 8 and type(cfg.batch_size) is int
    assert cfg.num_epochs == 2.0 and type(cfg.num_epochs) is float
    assert cfg.lora_dropout == 0.05
    assert cfg.target_modules == ["q_proj", "v_proj"]
    assert cfg.gpu_ids == [0, 1]
    assert cfg.run_name == "42"
    assert cfg.custom_format_mapping == {"instruction": "question"}


def test_from_dict_unknown_key_suggests_the_field():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"learning_rat": 1e-4, "zzzzqqq": 1})
    assert info.value.errors == [
        FieldError("learning_rat", "unknown field. Did you mean 'learning_rate'?"),
        FieldError("zzzzqqq", "unknown field. Remove it."),
    ]


@pytest.mark.parametrize("key, raw, message", [
    ("max_steps", 1.5, "expected a whole number, got 1.5"),
    ("max_steps", "1.5", "expected a whole number, got '1.5'"),
    ("max_steps", True, "expected a whole number, got True"),
    ("max_steps", math.inf, "expected a whole number, got inf"),
    ("learning_rate", None, "a value is required"),
    ("run_name", None, "a value is required"),
    ("learning_rate", "fast", "expected a number, got 'fast'"),
    ("learning_rate", False, "expected a number, got False"),
    ("packing", "maybe", "expected true or false, got 'maybe'"),
    ("packing", 2, "expected true or false, got 2"),
    ("run_name", ["a"], "expected text, got list"),
    ("target_modules", 5, "expected a list, got 5"),
    ("custom_format_mapping", {"instruction": 1}, "expected a mapping of role names to column names"),
])
def test_from_dict_rejects_wrong_types(key, raw, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({key: raw})
    assert info.value.errors == [FieldError(key, message)]


def test_from_dict_collects_all_problems():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"max_steps": 1.5, "batchsize": 2, "learning_rate": None})
    assert [e.field for e in info.value.errors] == ["max_steps", "batchsize", "learning_rate"]


def test_from_dict_needs_a_mapping():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(["learning_rate", 1])  # type: ignore[arg-type]
    assert info.value.errors == [FieldError("config", "expected a mapping of field names to values")]


def test_from_yaml():
    assert TrainConfig.from_yaml("") == TrainConfig()
    assert TrainConfig.from_yaml("max_steps: 10\npacking: yes\n") == TrainConfig(max_steps=10, packing=True)
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_yaml("max_steps: [1,\n")
    assert [e.field for e in info.value.errors] == ["config"]
    assert info.value.errors[0].message.startswith("not valid YAML: ")
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_yaml("- 1\n- 2\n")
    assert info.value.errors == [FieldError("config", "expected a mapping of field names to values")]


# ---------------------------------------------------------------------- secrets
SECRETS = {"hf_token": "hf_SECRETabc123", "wandb_token": "wb_SECRETxyz789"}


def custom_config() -> TrainConfig:
    return TrainConfig(
        run_name="round trip", model_name="org/model", method="cpt", adapter="full", max_seq_length=1024,
        gpu_ids=[0, 1], hf_dataset="org/data", local_datasets=[], subset="en", eval_split="test",
        custom_format_mapping={"instruction": "question", "output": "answer"}, system_prompt="Be brief.\nReally.",
        num_epochs=2.5, max_steps=0, learning_rate=5e-5, warmup_steps=0, warmup_ratio=0.1,
        target_modules=["q_proj"], lora_r=8, enable_wandb=True, wandb_project="p", **SECRETS)


def test_public_dict_and_yaml_never_contain_secrets():
    cfg = custom_config()
    assert cfg.to_dict()["hf_token"] == SECRETS["hf_token"]  # the form still holds them
    public = cfg.to_public_dict()
    assert "hf_token" not in public and "wandb_token" not in public
    # an sft run has no method settings, so no section (a dpo run's: tests/methods/test_method_settings.py)
    assert set(public) == set(TrainConfig.field_names()) - {"hf_token", "wandb_token", "method_settings"}
    text = cfg.to_yaml()
    assert "SECRET" not in text
    assert "hf_token" not in text and "wandb_token" not in text
    assert cfg.secrets() == SECRETS
    assert TrainConfig().secrets() == {}
    stripped = cfg.without_secrets()
    assert (stripped.hf_token, stripped.wandb_token) == ("", "")
    assert cfg.hf_token == SECRETS["hf_token"]  # the original is not modified


def test_yaml_round_trip_keeps_every_public_field():
    cfg = custom_config()
    back = TrainConfig.from_yaml(cfg.to_yaml())
    assert back == cfg.without_secrets()
    assert back.to_public_dict() == cfg.to_public_dict()
    assert yaml.safe_load(cfg.to_yaml()) == cfg.to_public_dict()
    assert TrainConfig.from_dict(cfg.to_public_dict()) == cfg.without_secrets()


def test_errors_about_a_secret_do_not_echo_it():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"hf_token": {"value": SECRETS["hf_token"]}})
    assert "SECRET" not in str(info.value)


def test_method_and_effective_flags():
    assert (TrainConfig(adapter="qlora").effective_4bit, TrainConfig().effective_4bit) == (True, False)
    assert TrainConfig(load_in_4bit=True).effective_4bit is True
    assert TrainConfig(adapter="full", use_lora=True).effective_use_lora is False
    assert TrainConfig(adapter="qlora", use_lora=False).effective_use_lora is True
    assert TrainConfig(method="cpt", adapter="full").effective_use_lora is False
    assert TrainConfig(method="cpt").method_label == "Continued pretraining"
    assert TrainConfig(method="cpt", adapter="qlora").method_label == "Continued pretraining · QLoRA (4-bit)"
    assert [TrainConfig(adapter=a).method_label for a in ("lora", "qlora", "full")] == [
        "LoRA", "QLoRA (4-bit)", "Full fine-tuning"]  # the texts History showed before method and adapter
    assert dataclasses.replace(TrainConfig(), model_name="org/m").model_label == "org/m"


def test_language_layers_off_leaves_nothing_to_train(home):
    found = errors(finetune_language_layers=False)
    assert [e.field for e in found] == ["finetune_language_layers"]
    assert "nothing to train" in found[0].message
    assert errors(finetune_language_layers=False, adapter="full") == []  # no LoRA: switch is moot


# ---------------------------------------------------------------------- layering
def test_config_does_not_import_the_data_package():
    """Fields only: data/ imports config for its constants, never the other way round (no import circle)."""
    code = ("import sys, trainer_core.config; "
            "print(sorted(m for m in sys.modules if m.startswith('trainer_core.data')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------- training_type (before method x adapter)
@pytest.mark.parametrize("training_type, use_lora, pair", [
    ("lora", True, ("sft", "lora")), ("qlora", True, ("sft", "qlora")), ("full", True, ("sft", "full")),
    ("cpt", True, ("cpt", "lora")), ("cpt", False, ("cpt", "full")),
    ("qlora", False, ("sft", "qlora")),  # use_lora only ever mattered for cpt
])
def test_training_type_maps_onto_method_and_adapter(training_type, use_lora, pair):
    for cfg in (TrainConfig.from_dict({"training_type": training_type, "use_lora": use_lora}),
                TrainConfig.from_yaml(f"training_type: {training_type}\nuse_lora: {str(use_lora).lower()}\n")):
        assert (cfg.method, cfg.adapter) == pair
        assert methods.to_training_type(cfg.method, cfg.adapter) == training_type or pair == ("cpt", "full")
        assert "training_type" not in cfg.to_yaml()  # new files: method/adapter
        assert dataclasses.replace(cfg, max_steps=3).adapter == pair[1]
    with pytest.raises(TypeError):  # read where configs are read, never a constructor argument
        TrainConfig(training_type=training_type)


def test_training_type_is_read_with_one_deprecation_note():
    with pytest.warns(FutureWarning) as caught:
        cfg = TrainConfig.from_dict({"training_type": "cpt"})
    assert [str(w.message) for w in caught] == [
        "training_type is deprecated: 'cpt' means method: cpt and adapter: lora; write those two fields instead "
        "(training_type keeps being read)."]
    assert (cfg.method, cfg.adapter) == ("cpt", "lora")


def test_training_type_unknown_or_contradicting_is_reported_with_the_rest():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"training_type": "dpo", "optim": 3, "colour": "red"})
    assert info.value.errors == [
        FieldError("training_type", "choose one of lora, qlora, full, cpt, or better set method and adapter instead"),
        FieldError("colour", "unknown field. Remove it.")]
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"training_type": "qlora", "adapter": "full"})
    assert info.value.errors == [FieldError("training_type", "'qlora' means adapter qlora, but adapter is 'full': "
                                                             "remove training_type")]
    assert TrainConfig.from_dict({"training_type": "qlora", "adapter": "qlora", "method": "sft"}).adapter == "qlora"


def test_a_method_section_reads_as_its_fields():
    cfg = TrainConfig.from_yaml("method: cpt\nformat_type: text\ncpt:\n  embedding_learning_rate: 5.0e-5\n"
                                "sft: {train_on_completions: false}\n")
    assert (cfg.method, cfg.embedding_learning_rate, cfg.train_on_completions) == ("cpt", 5e-5, False)
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"cpt": {"embedding_lr": 1e-5}, "sft": [1], "train_on_completions": True,
                               "method": "sft", "adapter": "lora", "max_steps": 1}
                              | {"sft": {"train_on_completions": True}})
    assert info.value.errors == [  # sections in registry order
        FieldError("sft.train_on_completions", "train_on_completions is set twice (at the top and in sft): keep one"),
        FieldError("cpt.embedding_lr", "not a setting of the cpt method. Did you mean 'embedding_learning_rate'?")]
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"sft": "packing"})
    assert info.value.errors == [FieldError("sft", "write the sft section as a mapping of train_on_completions "
                                                   "settings")]


def test_lora_on_an_embedding_model_is_refused_before_start_while_peft_is_too_old(home, monkeypatch):
    """sentence-transformers' LoRA path (transformers 5's add_adapter) needs peft>=0.22; with an older one installed
    the run failed in the worker after loading: the form now says so, reading peft's version without importing it."""
    from trainer_core.methods import embedding

    monkeypatch.setattr(embedding, "_installed_version", lambda package: "0.21.2")
    assert errors(method="embedding", adapter="lora", model_name="bundled:all-MiniLM-L6-v2") == [FieldError(
        "adapter", "LoRA on an embedding model needs peft>=0.22.0 (sentence-transformers' adapters through "
                   "transformers 5), and peft 0.21.2 is installed: choose adapter full, or install peft>=0.22.0")]
    monkeypatch.setattr(embedding, "_installed_version", lambda package: "0.22.1")
    assert errors(method="embedding", adapter="lora", model_name="bundled:all-MiniLM-L6-v2") == []
