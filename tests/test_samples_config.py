"""The samples-during-training config fields: defaults, exact validation messages, loose input, the form."""
from __future__ import annotations

import pytest

from trainer_core.config import promptsets
from trainer_core.config import ConfigError, FieldError, TrainConfig, sample_prompts_of
from ui import form


def sample_errors(**values) -> list[FieldError]:
    return [e for e in TrainConfig(**values).validate() if e.field.startswith("sample_")]


def test_defaults_sample_nothing_and_validate(home):
    cfg = TrainConfig()
    assert (cfg.sample_prompts, cfg.sample_prompt_set, cfg.sample_every_steps, cfg.sample_max_new_tokens) == \
        ([], "", 0, 64)
    assert sample_errors() == []
    assert sample_prompts_of(cfg) == ()


def test_inline_prompts_and_a_builtin_set_are_valid(home):
    assert sample_errors(sample_prompts=["Hi?", "  Two words.  "], sample_every_steps=10) == []
    assert sample_prompts_of(TrainConfig(sample_prompts=["Hi?", "  Two words.  ", " "])) == ("Hi?", "Two words.")
    cfg = TrainConfig(sample_prompt_set="quick-check")
    assert sample_errors(sample_prompt_set="quick-check") == []
    assert sample_prompts_of(cfg) == promptsets.BUILTIN["quick-check"]


def test_each_problem_names_its_field_and_the_fix(home):
    assert sample_errors(sample_prompts=[f"p{i}" for i in range(9)]) == [FieldError(
        "sample_prompts", "the list has 9 prompts; samples take at most 8 (each is generated at every sampling "
                          "step): keep the most telling ones")]
    assert sample_errors(sample_prompts=["ok", "x" * 2001]) == [FieldError(
        "sample_prompts", "prompt 2 of the list has 2,001 characters; sample prompts are at most 2,000: shorten it")]
    assert sample_errors(sample_prompts=["bad\x00"]) == [FieldError(
        "sample_prompts", "prompt 1 contains a NUL character (\\x00): remove it")]
    assert sample_errors(sample_prompts=["a"], sample_prompt_set="quick-check") == [FieldError(
        "sample_prompt_set", "choose either inline sample_prompts or a prompt set, not both (clear one)")]
    assert sample_errors(sample_every_steps=5) == [FieldError(
        "sample_every_steps", "there are no sample prompts: list some in sample_prompts or name a sample_prompt_set, "
                              "or set sample_every_steps to 0")]
    assert sample_errors(sample_every_steps=-1) == [FieldError("sample_every_steps", "must be >= 0 and <= 10000000, got -1")]
    assert sample_errors(sample_max_new_tokens=0) == [FieldError(
        "sample_max_new_tokens", "let each answer have at least 1 new token (64 is a good start) (got 0)")]
    assert sample_errors(sample_max_new_tokens=5000) == [FieldError(
        "sample_max_new_tokens", "must be >= 1 and <= 1024, got 5000")]


def test_a_missing_or_oversized_prompt_set_is_named(home):
    [error] = sample_errors(sample_prompt_set="nope")
    assert error.field == "sample_prompt_set" and error.message.startswith("there is no prompt set 'nope'; known sets:")
    promptsets.save("big", [f"prompt {i}" for i in range(10)])
    assert sample_errors(sample_prompt_set="big") == [FieldError(
        "sample_prompt_set", "prompt set 'big' has 10 prompts; samples take at most 8 (each is generated at every "
                             "sampling step): keep the most telling ones")]
    promptsets.save("long", ["short", "y" * 3000])
    assert sample_errors(sample_prompt_set="long") == [FieldError(
        "sample_prompt_set", "prompt 2 of prompt set 'long' has 3,000 characters; sample prompts are at most 2,000: "
                             "shorten it")]
    (promptsets.sets_dir() / "hollow.yaml").write_text("prompts: []\n")  # written by hand: save refuses it
    assert sample_errors(sample_prompt_set="hollow") == [FieldError(
        "sample_prompt_set", "prompt set 'hollow' has no prompts: add some to it, or choose another set")]


def test_a_prompt_with_commas_stays_one_prompt_from_loose_input(home):
    assert TrainConfig.from_dict({"sample_prompts": "Name a, b and c."}).sample_prompts == ["Name a, b and c."]
    assert TrainConfig.from_dict({"sample_prompts": ""}).sample_prompts == []
    assert TrainConfig.from_yaml("sample_prompts:\n  - 'Hi, you'\n  - |\n    two\n    lines\n").sample_prompts == \
        ["Hi, you", "two\nlines\n"]
    with pytest.raises(ConfigError) as exc:
        TrainConfig.from_dict({"sample_every_steps": "often"})
    assert exc.value.errors == [FieldError("sample_every_steps", "expected a whole number, got 'often'")]


def test_the_config_round_trips_through_yaml(home):
    cfg = TrainConfig(sample_prompts=["Hi, you", "two\nlines"], sample_every_steps=3, sample_max_new_tokens=16)
    assert TrainConfig.from_yaml(cfg.to_yaml()) == cfg


@pytest.mark.parametrize("prompts", [[], ["one"], ["one", "two, with a comma"], ["multi\nline", "single"]])
def test_the_form_text_area_round_trips_prompts(prompts):
    assert form.parse_prompts(form.prompts_text(prompts)) == prompts


def test_the_form_reads_one_prompt_a_line_or_separated_blocks():
    assert form.parse_prompts("  first \n\n second\n") == ["first", "second"]
    assert form.parse_prompts("a\nb\n---\n\n---\nc") == ["a\nb", "c"]


def test_the_prompt_set_picker_keeps_a_chosen_set_that_is_gone():
    assert form.prompt_set_options("", ["a", "b"]) == ["", "a", "b"]
    assert form.prompt_set_options("gone", ["a"]) == ["", "a", "gone"]


def test_a_loaded_preset_prompt_with_a_separator_line_of_its_own_comes_back_whole():
    preset = TrainConfig(sample_prompts=["Format:\n---\nthen a table", "Short."])
    state = {form.BASE: preset, **form.sample_state(preset)}
    assert form.sample_values(state)["sample_prompts"] == preset.sample_prompts
    state[form.K + "sample_prompts"] += "\n---\nAdded."  # edited in the form: read as typed
    assert form.sample_values(state)["sample_prompts"] == ["Format:", "then a table", "Short.", "Added."]
