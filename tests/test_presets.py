"""Presets: every built-in one loads and validates; user presets save, list and load without secrets."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_core.config import presets
from trainer_core.config import BUNDLED_MODEL, CONFIG_BYTES_MAX, ConfigError, TrainConfig
from trainer_core.config.presets import PresetError

ROOT = Path(__file__).resolve().parent.parent
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name, both parts present

# What each built-in preset may not do on this CPU-only machine: exactly these fields fail, for CUDA.
CPU_ERRORS = {
    "cpu-demo": set(),
    "qlora-8b-24gb": {"adapter", "optim"},
    "full-small": set(),
    "cpt-raw-text": set(),
    "dpo-demo": set(),
    "grpo-demo": set(),
    "tool-calling-demo": set(),
}


def builtin_names() -> list[str]:
    return [p.name for p in presets.list_presets() if p.builtin]


def test_the_builtin_presets_are_the_documented_seven(home):
    assert sorted(builtin_names()) == sorted(CPU_ERRORS)
    assert all(p.description for p in presets.list_presets() if p.builtin)


@pytest.mark.parametrize("name", sorted(CPU_ERRORS))
def test_builtin_preset_is_valid_where_it_is_meant_to_run(home, monkeypatch, name, fake_gpu_host):
    cfg = presets.load_preset(name)
    assert cfg.to_dict() == TrainConfig.from_yaml((presets.builtin_dir() / f"{name}.yaml").read_text()).to_dict()
    assert cfg.validate() == []


@pytest.mark.parametrize("name", sorted(CPU_ERRORS))
def test_builtin_preset_on_this_cpu_fails_only_for_cuda(home, name):
    errors = presets.load_preset(name).validate()
    assert {e.field for e in errors} == CPU_ERRORS[name]
    assert all("CUDA" in e.message for e in errors), errors


@pytest.mark.parametrize("name", sorted(CPU_ERRORS))
def test_builtin_preset_names_well_formed_hub_ids(home, name):
    cfg = presets.load_preset(name)
    assert cfg.model_name == BUNDLED_MODEL or HUB_ID.match(cfg.model_name), cfg.model_name
    assert cfg.hf_dataset == "" or HUB_ID.match(cfg.hf_dataset), cfg.hf_dataset
    assert bool(cfg.hf_dataset) != bool(cfg.local_datasets)  # exactly one dataset source


def test_builtin_presets_match_their_method(home):
    kinds = {name: presets.load_preset(name) for name in CPU_ERRORS}
    assert kinds["qlora-8b-24gb"].effective_4bit and kinds["qlora-8b-24gb"].gradient_checkpointing
    assert kinds["full-small"].adapter == "full" and not kinds["full-small"].effective_use_lora
    assert (kinds["cpt-raw-text"].method, kinds["cpt-raw-text"].adapter) == ("cpt", "lora")
    assert kinds["cpt-raw-text"].format_type == "text"
    assert kinds["qlora-8b-24gb"].train_on_completions is True  # read from its sft section
    assert kinds["cpt-raw-text"].embedding_learning_rate > 0
    assert kinds["cpu-demo"].model_name == BUNDLED_MODEL
    assert (kinds["dpo-demo"].method, kinds["grpo-demo"].method) == ("dpo", "grpo")


OLD_PRESETS = sorted(p.stem for p in (ROOT / "tests" / "fixtures" / "old_presets").glob("*.yaml"))


def test_every_preset_from_before_method_and_adapter_is_kept_as_a_fixture():
    assert OLD_PRESETS == ["cpt-raw-text", "cpu-demo", "full-small", "qlora-8b-24gb"]  # dpo/grpo came after


@pytest.mark.parametrize("name", OLD_PRESETS)
def test_the_presets_as_written_before_method_and_adapter_still_load_the_same(home, name):
    """tests/fixtures/old_presets: the built-in presets as they were, with training_type (and a user's own
    presets written then look the same): each loads to the very config its new file holds."""
    old = (ROOT / "tests" / "fixtures" / "old_presets" / f"{name}.yaml").read_text()
    assert "training_type:" in old and "method:" not in old
    with pytest.warns(FutureWarning, match="training_type is deprecated"):
        assert TrainConfig.from_yaml(old) == presets.load_preset(name)


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(home), "FINETUNE_STUDIO_FORCE_CPU": "1"}
    return subprocess.run([sys.executable, "-m", "trainer_core", *args], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_validates_the_cpu_demo_preset(home):
    result = run_cli(home, "validate", "--config", "presets/cpu-demo.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "config is valid"


def test_cli_rejects_the_qlora_preset_on_cpu_for_cuda_only(home):
    result = run_cli(home, "validate", "--config", "presets/qlora-8b-24gb.yaml")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["adapter", "optim"], lines


def test_save_then_load_round_trips_without_secrets(home):
    cfg = TrainConfig(run_name="mine", max_steps=7, lora_r=8, hf_token="hf_SECRET_1", wandb_token="wb_SECRET_2")
    path = presets.save_preset("my-run_1.0", cfg, description="Seven steps\nrank 8")
    assert path == home / "presets" / "my-run_1.0.yaml"
    text = path.read_text()
    assert "SECRET" not in text and "hf_token" not in text and "wandb_token" not in text
    assert text.startswith("# Seven steps\n# rank 8\n")
    loaded = presets.load_preset("my-run_1.0")
    assert loaded.to_dict() == TrainConfig(run_name="mine", max_steps=7, lora_r=8).to_dict()
    mine = [p for p in presets.list_presets() if not p.builtin]
    assert mine == [presets.Preset("my-run_1.0", path, False, "Seven steps rank 8")]


def test_a_trailing_yaml_suffix_is_part_of_the_file_name_not_the_preset_name(home):
    path = presets.save_preset("demo2.yaml", TrainConfig())
    assert path.name == "demo2.yaml"
    assert presets.load_preset("demo2").to_dict() == TrainConfig().to_dict()


@pytest.mark.parametrize("name", ["", "../evil", "a/b", "a\\b", ".hidden", "two words", "x" * 65, "na\nme",
                                  "/etc/passwd", "~user"])
def test_preset_names_with_path_characters_are_refused(home, name):
    with pytest.raises(PresetError) as info:
        presets.save_preset(name, TrainConfig())
    assert [e.field for e in info.value.errors] == ["preset_name"]
    assert not (home / "presets").exists() or list((home / "presets").iterdir()) == []


def test_saving_over_a_builtin_or_an_existing_preset_needs_care(home):
    with pytest.raises(PresetError, match="built-in"):
        presets.save_preset("cpu-demo", TrainConfig())
    presets.save_preset("mine", TrainConfig(max_steps=1))
    with pytest.raises(PresetError, match="Overwrite"):
        presets.save_preset("mine", TrainConfig(max_steps=2))
    assert presets.load_preset("mine").max_steps == 1
    presets.save_preset("mine", TrainConfig(max_steps=2), overwrite=True)
    assert presets.load_preset("mine").max_steps == 2
    assert list((home / "presets").iterdir()) == [home / "presets" / "mine.yaml"]  # no partial files left


def test_loading_an_unknown_preset_lists_the_known_ones(home):
    with pytest.raises(PresetError) as info:
        presets.load_preset("nope")
    [error] = info.value.errors
    assert error.field == "preset" and "no preset named 'nope'" in error.message and "cpu-demo" in error.message


def test_a_user_preset_holding_a_secret_is_refused(home):
    (home / "presets").mkdir(parents=True)
    (home / "presets" / "leaky.yaml").write_text("max_steps: 3\nhf_token: hf_abc\n")
    with pytest.raises(PresetError) as info:
        presets.load_preset("leaky")
    assert [e.field for e in info.value.errors] == ["hf_token"]
    assert "hf_abc" not in str(info.value)


def test_a_broken_user_preset_names_file_and_field(home):
    (home / "presets").mkdir(parents=True)
    (home / "presets" / "typo.yaml").write_text("max_step: 3\nlora_r: many\n")
    (home / "presets" / "bad.yaml").write_text("max_steps: [1\n")
    (home / "presets" / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(PresetError) as info:
        presets.load_preset("typo")
    assert [(e.field, e.message) for e in info.value.errors] == [
        ("max_step", "in preset typo.yaml: unknown field. Did you mean 'max_steps'?"),
        ("lora_r", "in preset typo.yaml: expected a whole number, got 'many'"),
    ]
    with pytest.raises(PresetError, match="bad.yaml is not valid YAML"):
        presets.load_preset("bad")
    with pytest.raises(PresetError, match="list.yaml must hold a mapping"):
        presets.load_preset("list")


def test_a_user_preset_never_shadows_a_builtin_one(home):
    (home / "presets").mkdir(parents=True)
    (home / "presets" / "cpu-demo.yaml").write_text("max_steps: 1\n")
    assert [p.builtin for p in presets.list_presets() if p.name == "cpu-demo"] == [True]
    assert presets.load_preset("cpu-demo").max_steps == 60


def test_a_symlinked_user_preset_pointing_outside_is_refused(home, tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text("max_steps: 3\n")
    (home / "presets").mkdir(parents=True)
    (home / "presets" / "link.yaml").symlink_to(outside)
    with pytest.raises(PresetError, match="outside the allowed folders"):
        presets.load_preset("link")


def test_installed_layout_finds_presets_inside_the_package(home, tmp_path, monkeypatch):
    package = tmp_path / "site-packages" / "trainer_core"
    (package / "builtin_presets").mkdir(parents=True)
    (package / "builtin_presets" / "shipped.yaml").write_text("# Shipped\nmax_steps: 4\n")
    monkeypatch.setattr(presets, "__file__", str(package / "config" / "presets.py"))
    assert presets.builtin_dir() == package / "builtin_presets"
    assert presets.list_presets()[0] == presets.Preset("shipped", package / "builtin_presets" / "shipped.yaml",
                                                       True, "Shipped")


# An over-large config is refused before it is parsed (issue 24, wrong states 11: a 24 MB YAML of 1.5M keys ran
# validate for minutes and GBs). The files below are not even valid YAML: the size error, not a YAML error, shows
# that nothing parsed them.
OVERSIZED = "a: [\n" + "x" * (CONFIG_BYTES_MAX + 1)


def test_an_oversized_config_file_is_refused_by_the_cli_before_parsing(home, tmp_path):
    from trainer_core.__main__ import load_config

    path = tmp_path / "huge.yaml"
    path.write_text(OVERSIZED)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), [])
    assert [e.field for e in info.value.errors] == ["config"]
    assert f"({CONFIG_BYTES_MAX:,})" in str(info.value) and f"{path.stat().st_size:,} bytes" in str(info.value)


def test_an_oversized_preset_is_refused_before_parsing(home):
    (home / "presets").mkdir(parents=True, exist_ok=True)
    (home / "presets" / "huge.yaml").write_text(OVERSIZED)
    with pytest.raises(PresetError) as info:
        presets.load_preset("huge")
    assert [e.field for e in info.value.errors] == ["preset"]
    assert f"({CONFIG_BYTES_MAX:,})" in str(info.value)


def test_an_oversized_run_config_text_is_refused_before_parsing():
    with pytest.raises(ConfigError, match=r"larger than a config can be"):
        TrainConfig.from_yaml(OVERSIZED)
    assert TrainConfig.from_yaml("max_steps: 3\n").max_steps == 3  # the limit is far above a real config


# YAML aliases are refused where user YAML is parsed: ~400 characters of nested aliases expand to GBs when the
# config is copied out (the hostile review's alias bomb, which hung the New run page on every rerun).
BOMB = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9 if i else ["x"] * 9) + "]\n" for i in range(9))


def test_yaml_aliases_are_refused_in_configs_presets_and_set_values(home, tmp_path):
    from trainer_core.__main__ import load_config

    with pytest.raises(ConfigError, match=r"aliases \(\*name\) are not allowed"):
        TrainConfig.from_yaml("dpo:\n  " + BOMB.replace("\n", "\n  ").rstrip())
    path = tmp_path / "bomb.yaml"
    path.write_text("max_steps: 3\n" + BOMB)
    with pytest.raises(ConfigError, match=r"aliases \(\*name\) are not allowed"):
        load_config(str(path), [])
    (tmp_path / "ok.yaml").write_text("max_steps: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "ok.yaml"), ["dpo=&a {beta: *a}"])
    assert [e.field for e in info.value.errors] == ["dpo"]
    (home / "presets").mkdir(parents=True, exist_ok=True)
    (home / "presets" / "bomb.yaml").write_text(BOMB)
    with pytest.raises(PresetError, match="not valid YAML"):
        presets.load_preset("bomb")
    assert TrainConfig.from_yaml("method: dpo\ndpo: {beta: 0.2}\n").method_settings.beta == 0.2  # plain YAML reads
