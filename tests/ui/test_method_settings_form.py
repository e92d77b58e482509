"""The New run form's method settings (issue 19): the chosen method's YAML section in a text area, round-tripped
with presets, bad YAML named by the method's field, and GRPO's "Check rewards" on a few real rows."""
from __future__ import annotations

import pytest

from tests.support.apptest import click, fakes, open_new_run, texts  # noqa: F401 - fakes is a fixture
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.methods.preference_settings import DPOSettings
from trainer_core.config import presets
from trainer_core.config import TrainConfig
from ui import form
from ui.form import K


def test_loading_the_grpo_demo_preset_shows_its_rewards_and_starts_with_them(fakes):
    at = open_new_run()
    at.selectbox(key="nr_preset_choice").set_value("grpo-demo")
    click(at, "Load preset")
    assert at.selectbox(key=K + "method").value == "grpo"
    text = at.text_area(key=form.settings_key("grpo")).value
    assert "rewards:" in text and "type: length" in text and "num_generations: 4" in text
    settings = next(d.value for d in at.dataframe if "setting" in d.value.columns)
    assert list(settings["setting"])[:3] == ["rewards", "num_generations", "max_prompt_length"]
    click(at, "Preview data")
    assert fakes.preview[-1].method_settings == presets.load_preset("grpo-demo").method_settings


def test_edited_settings_reach_the_config_and_bad_yaml_names_the_method(fakes):
    at = open_new_run()
    at.selectbox(key=K + "method").set_value("dpo").run()
    at.text_area(key=form.settings_key("dpo")).input("beta: 0.3\nloss_type: ipo\n").run()
    click(at, "Preview data")
    assert fakes.preview[-1].method_settings == DPOSettings(beta=0.3, loss_type="ipo")
    at.text_area(key=form.settings_key("dpo")).input("beta: [0.3\n").run()
    click(at, "Preview data")
    errors = texts(at, "error")
    assert any(e.startswith("**dpo**: not valid YAML") and "e.g. beta: 0.1" in e for e in errors), errors
    at.text_area(key=form.settings_key("dpo")).input("- beta\n").run()
    click(at, "Preview data")
    assert "**dpo**: write a mapping of setting: value, e.g. beta: 0.1" in texts(at, "error")


def test_settings_round_trip_through_the_form_state():
    cfg = TrainConfig(method="grpo", method_settings=GRPOSettings(num_generations=2,
                                                                  rewards=[{"type": "length", "target": 5}]))
    state = form.config_to_state(cfg)
    assert state[form.settings_key("dpo")] == ""  # only the run's method has settings
    built, errors = form.build_config(state, with_secrets=False)
    assert errors == [] and built.method_settings == cfg.method_settings
    state[form.settings_key("dpo")] = "beta: 0.2\n"  # another method's text is kept in the form, not in the config
    state[K + "method"] = "dpo"
    built, errors = form.build_config(state, with_secrets=False)
    assert errors == [] and built.method_settings == DPOSettings(beta=0.2)


@pytest.mark.subprocess  # the check runs the rewards in a child process
def test_check_rewards_scores_the_bundled_rows_and_warns_on_a_constant_reward(fakes):
    at = open_new_run()
    at.selectbox(key=K + "method").set_value("grpo").run()
    at.text_area(key=form.settings_key("grpo")).input(
        "rewards:\n  - {type: length, target: 3}\n  - {type: contains, keywords: [zebra]}\n").run()
    click(at, "Check rewards")
    assert texts(at, "error") == []
    table = next(d.value for d in at.dataframe if "reward" in d.value.columns)
    assert list(table["reward"]) == ["length", "contains"]
    assert all(len(scores.split(", ")) == 4 for scores in table["scores"])  # 4 rows' reference answers
    assert any("contains gave every completion the same score (0)" in w for w in texts(at, "warning"))


def test_an_alias_bomb_in_the_settings_is_refused_before_it_expands():
    from tests.test_presets import BOMB

    state = form.config_to_state(TrainConfig(method="dpo"))
    state[form.settings_key("dpo")] = BOMB
    cfg, errors = form.build_config(state, with_secrets=False)
    assert [e.field for e in errors] == ["dpo"] and "aliases (*name) are not allowed" in errors[0].message
    assert cfg is not None and cfg.method_settings == DPOSettings()  # the text did not reach the config
