"""A method's settings are one typed object (TrainConfig.method_settings), built once where a config is read from the
YAML section named after the method, written back as that section; old files (every section written, sections of
other methods, the deprecated fields) keep loading."""
from __future__ import annotations

import dataclasses

import pytest

from trainer_core.config import ConfigError, FieldError, TrainConfig
from trainer_core.methods import METHODS
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.methods.preference_settings import DPOSettings, KTOSettings


def test_the_section_is_read_into_the_methods_dataclass_and_written_back_as_the_section():
    cfg = TrainConfig.from_yaml("method: dpo\ndpo:\n  beta: 0.3\n  loss_type: ipo\n")
    assert cfg.method_settings == DPOSettings(beta=0.3, loss_type="ipo")
    public = cfg.to_public_dict()
    assert public["dpo"] == {"beta": 0.3, "loss_type": "ipo", "label_smoothing": 0.0, "rpo_alpha": 0.0}
    assert "method_settings" not in public
    assert TrainConfig.from_yaml(cfg.to_yaml()) == cfg
    assert TrainConfig(method="kto").method_settings == KTOSettings()  # the defaults
    assert TrainConfig().method_settings is None and "dpo" not in TrainConfig().to_dict()  # sft has none


def test_a_new_method_adds_no_config_field():
    assert not set(METHODS) & set(TrainConfig.field_names())
    assert all(dataclasses.is_dataclass(spec.settings) for spec in METHODS.values() if spec.settings is not None)


def test_an_old_config_with_every_section_and_the_old_fields_still_loads():
    old = {"method": "grpo", "is_embedding": False, "dpo": {}, "orpo": {}, "simpo": {}, "kto": {"beta": 0.5},
           "reward": {}, "grpo": {"num_generations": 2, "rewards": [{"type": "length", "target": 5}]},
           "embedding": {}, "stt": {}, "tts": {}}  # what to_dict wrote before settings were typed
    cfg = TrainConfig.from_dict(old)
    assert cfg.method_settings == GRPOSettings(num_generations=2, rewards=[{"type": "length", "target": 5}])
    assert set(cfg.to_dict()) & set(METHODS) == {"grpo"}  # another method's section is not kept
    with pytest.warns(FutureWarning):
        assert TrainConfig.from_dict({"training_type": "qlora", "grpo": {"beta": 5.0}}).method_settings is None


def test_what_a_setting_cannot_hold_is_refused_when_read_and_bounds_are_checked_with_the_rest():
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict({"method": "dpo", "dpo": {"bta": 0.2, "loss_type": 3}, "kto": "fast", "colour": 1})
    assert [e.field for e in info.value.errors] == ["kto", "colour", "dpo.bta", "dpo.loss_type"]
    cfg = TrainConfig.from_dict({"method": "dpo", "dpo": {"beta": 0, "loss_type": "best"}, "learning_rate": 0})
    problems = cfg.validate()
    assert FieldError("dpo.beta", "must be above 0.0") in problems
    assert FieldError("dpo.loss_type", "'best' is not one of " + ", ".join(DPOSettings.__dataclass_fields__[
        "loss_type"].metadata["choices"])) in problems
    assert "learning_rate" in [p.field for p in problems]  # together with the other fields' problems


def test_the_settings_follow_the_method():
    cfg = TrainConfig(method="dpo", method_settings=DPOSettings(beta=0.4))
    assert dataclasses.replace(cfg, max_steps=3).method_settings == DPOSettings(beta=0.4)
    assert dataclasses.replace(cfg, method="grpo").method_settings == GRPOSettings()  # the new method's defaults
    assert dataclasses.replace(cfg, method="sft").method_settings is None
    with pytest.raises(TypeError, match="read a mapping with TrainConfig.from_dict"):
        TrainConfig(method="dpo", method_settings={"beta": 0.4})
