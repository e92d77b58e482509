"""ui.form: the New run widgets <-> TrainConfig mapping, without running the page."""
from __future__ import annotations

import dataclasses
import io
import json
from types import SimpleNamespace

import pytest

from trainer_core.data import preview
from trainer_core.config import BUNDLED_DATASET, BUNDLED_MODEL, FieldError, TrainConfig
from ui import form
from ui.form import K, NOT_MAPPED


def state_of(cfg: TrainConfig, **extra) -> dict:
    return {**form.config_to_state(cfg), **{K + key: value for key, value in extra.items()}}


# ---------------------------------------------------------------------- parsers
def test_split_list_takes_commas_and_lines():
    assert form.split_list(" a.jsonl, b.csv\n\nc.json ,") == ["a.jsonl", "b.csv", "c.json"]
    assert form.split_list("") == []


def test_parse_mapping_reads_role_column_lines_and_names_the_bad_ones():
    mapping, errors = form.parse_mapping("instruction=question\noutput: answer  # the reply\n\n# note\nbroken\n=x")
    assert mapping == {"instruction": "question", "output": "answer"}
    assert errors == [FieldError("custom_format_mapping", "line 5: write role=column, got 'broken'"),
                      FieldError("custom_format_mapping", "line 6: write role=column, got '=x'")]


def test_parse_gpu_ids():
    assert form.parse_gpu_ids("0, 2") == ([0, 2], [])
    assert form.parse_gpu_ids("") == ([], [])
    assert form.parse_gpu_ids("0,x") == ([], [FieldError(
        "gpu_ids", "write GPU numbers separated by commas, such as 0,1; got '0,x'")])


def test_model_name_per_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert form.model_name("bundled", "ignored") == BUNDLED_MODEL
    assert form.model_name("hub", " org/model ") == "org/model"
    assert form.model_name("local", "my-model") == "./my-model"  # a folder name is not a hub id
    (tmp_path / "here").mkdir()
    assert form.model_name("local", "here") == "here"
    assert form.model_name("local", "/abs/folder") == "/abs/folder"


# ---------------------------------------------------------------------- config <-> widget values
def test_every_widget_field_round_trips_through_the_widget_values(home, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a"}\n')
    cfg = dataclasses.replace(
        TrainConfig(), run_name="trip", model_name="org/model", local_datasets=[str(data)],
        local_eval_datasets=[str(data)], custom_format_mapping={"text": "body"}, learning_rate=1e-4,
        target_modules=["q_proj", "lm_head", "my_proj"], gpu_ids=[0, 1], max_steps=7, packing=True)
    built, errors = form.build_config(form.config_to_state(cfg), with_secrets=False)
    assert errors == []
    assert built == cfg


def test_widget_values_of_a_config():
    state = form.config_to_state(TrainConfig(target_modules=["q_proj", "lm_head", "my_proj"], gpu_ids=[1, 3],
                                             custom_format_mapping={"instruction": "q", "output": "a"}))
    assert state[K + "model_source"] == "bundled" and state[K + "model_text"] == ""
    assert state[K + "dataset_source"] == "bundled" and state[K + "local_datasets"] == ""
    assert state[K + "target_modules"] == ["q_proj", "lm_head"]  # the multiselect offers only its choices
    assert state[K + "extra_modules"] == "my_proj"
    assert state[K + "gpu_ids"] == "1, 3"
    assert state[K + "custom_format_mapping"] == "instruction=q\noutput=a\n"
    assert form.config_to_state(TrainConfig(hf_dataset="org/data", local_datasets=[]))[K + "dataset_source"] == "hub"


def test_widget_values_never_carry_secrets():
    state = form.config_to_state(TrainConfig(hf_token="hf_secret", wandb_token="wb_secret"))
    assert "hf_secret" not in json.dumps(state, default=str) and "wb_secret" not in json.dumps(state, default=str)


def test_secrets_come_from_their_own_widgets_only_when_asked():
    state = state_of(TrainConfig(), hf_token=" hf_abc ")
    with_secrets, _ = form.build_config(state)
    without, _ = form.build_config(state, with_secrets=False)
    assert (with_secrets.hf_token, without.hf_token) == ("hf_abc", "")


def test_text_fields_are_stripped_and_bad_values_reported_together():
    cfg, errors = form.build_config(state_of(TrainConfig(), run_name="  padded  ", subset=" en "))
    assert (cfg.run_name, cfg.subset) == ("padded", "en") and errors == []
    cfg, errors = form.build_config(state_of(TrainConfig(), gpu_ids="x", custom_format_mapping="oops",
                                             dataset_source="local", local_datasets=""))
    assert cfg is not None
    assert [e.field for e in errors] == ["custom_format_mapping", "local_datasets", "gpu_ids"]


def test_fields_without_a_widget_keep_the_loaded_presets_values():
    state = state_of(TrainConfig())
    state[form.BASE] = TrainConfig(is_dataset_audio=True)  # a field the page has no widget for
    cfg, _ = form.build_config(state)
    assert cfg.is_dataset_audio is True
    assert form.build_config(state_of(TrainConfig()))[0].is_dataset_audio is False


def test_dataset_sources():
    assert form.dataset_values({K + "dataset_source": "bundled"}) == (
        {"hf_dataset": "", "local_datasets": [BUNDLED_DATASET]}, [])
    assert form.dataset_values({K + "dataset_source": "hub", K + "hf_dataset": " org/d "}) == (
        {"hf_dataset": "org/d", "local_datasets": []}, [])
    assert form.dataset_values({K + "dataset_source": "hub"})[1] == [
        FieldError("hf_dataset", "enter a hub dataset id such as org/name")]
    assert form.dataset_values({K + "dataset_source": "upload"})[1] == [
        FieldError("local_datasets", "choose a file to upload (.jsonl, .json, .csv or .parquet)")]


def test_an_upload_is_saved_once_per_upload(home):
    class Upload(io.BytesIO):
        file_id, name = "f1", "rows.jsonl"

    state: dict = {K + "dataset_source": "upload", K + "upload": Upload(b'{"text": "a"}\n')}
    first, errors = form.dataset_values(state)
    assert errors == [] and first["local_datasets"][0].startswith(str(home / "datasets"))
    state[K + "upload"] = SimpleNamespace(file_id="f1", name="rows.jsonl")  # the same upload: not read again
    assert form.dataset_values(state)[0] == first
    bad = SimpleNamespace(file_id="f2", name="rows.txt", read=lambda n=-1: b"", seekable=lambda: False)
    assert form.dataset_values({**state, K + "upload": bad})[1][0].field == "local_datasets"


# ---------------------------------------------------------------------- column mapping
def test_role_pickers_map_only_what_differs_and_typed_lines_win():
    state = {form.MAP_AS: "alpaca", K + "map_alpaca_instruction": "question", K + "map_alpaca_input": NOT_MAPPED,
             K + "map_alpaca_output": "output", K + "custom_format_mapping": "output=reply\n"}
    assert form.role_mapping(state, "alpaca") == {"instruction": "question"}
    assert form.current_mapping(state) == ({"instruction": "question", "output": "reply"}, [])


def test_speaker_pickers_of_chat_formats():
    state = {K + "map_sharegpt_conversations": "dialog", K + "map_sharegpt_from": "speaker",
             K + "map_sharegpt_assistant": "bot", K + "map_sharegpt_user": "user"}
    assert form.role_mapping(state, "sharegpt") == {"conversations": "dialog", "from": "speaker", "assistant": "bot"}
    assert (form.mapped_column(state, "sharegpt"), form.mapped_role_key(state, "sharegpt")) == ("dialog", "speaker")
    assert (form.mapped_column({}, "chatml"), form.mapped_role_key({}, "chatml")) == ("messages", "role")


def test_remembered_keys_include_the_role_pickers():
    keys = form.remembered_keys({K + "map_chatml_role": "who", "other": 1})
    assert K + "map_chatml_role" in keys and K + "model_source" in keys and K + "learning_rate" in keys
    assert "other" not in keys


def test_choice_problems_name_values_a_selectbox_cannot_show():
    assert form.choice_problems(TrainConfig()) == []
    assert form.choice_problems(TrainConfig(optim="lion")) == [
        FieldError("optim", f"'lion' is not one of {', '.join(form.CHOICES['optim'])}")]


@pytest.mark.parametrize("confirmed, expected", [(False, ["trust_remote_code"]), (True, [])])
def test_remote_code_needs_its_confirmation(confirmed, expected):
    state = {K + "trust_remote_code": True, K + "trust_remote_code_confirm": confirmed}
    assert [e.field for e in form.remote_code_errors(state)] == expected


def test_the_preview_key_follows_the_previews_own_fields():
    cfg = TrainConfig()
    assert form.config_key(dataclasses.replace(cfg, learning_rate=1e-3, lora_r=64)) == form.config_key(cfg)
    for name, value in (("max_seq_length", 256), ("num_processes", 2), ("system_prompt", "Be brief.")):
        assert name in preview.PREVIEW_FIELDS
        assert form.config_key(dataclasses.replace(cfg, **{name: value})) != form.config_key(cfg)


def test_speakers_chosen_only_when_a_picker_names_another_speaker():
    assert form.speakers_chosen({}, "chatml") is False
    assert form.speakers_chosen({K + "map_chatml_user": "user", K + "map_chatml_system": NOT_MAPPED}, "chatml") is False
    assert form.speakers_chosen({K + "map_chatml_assistant": "bot"}, "chatml") is True


def test_a_preview_is_current_only_for_the_settings_it_was_made_for():
    cfg = TrainConfig()
    shown = object()
    state = {form.PREVIEW: (form.config_key(cfg), shown)}
    assert form.current_preview(state, cfg) is shown
    assert form.current_preview(state, dataclasses.replace(cfg, learning_rate=1e-3)) is shown  # not a preview field
    assert form.current_preview(state, dataclasses.replace(cfg, max_seq_length=64)) is None
    assert form.current_preview(state, None) is None
    assert form.current_preview({form.PREVIEW: (None, [FieldError("x", "y")])}, cfg) is None  # errors, not a preview


def test_the_column_pickers_sample_the_first_local_file(home, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path))
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text('{"text": "a"}\n')
    second.write_text('{"text": "b"}\n')
    state = {K + "dataset_source": "local", K + "local_datasets": f"{first}, {second}"}
    assert form.sample_source(state) == (first.resolve(), "", "a.jsonl")
    assert form.sample_source({K + "dataset_source": "hub", K + "hf_dataset": "org/d"}) == (None, "", "")
    missing = str(tmp_path / "nope.jsonl")
    path, problem, label = form.sample_source({K + "dataset_source": "local", K + "local_datasets": missing})
    assert (path, label) == (None, missing) and problem == f"{missing} does not exist: check the path or upload the file"
