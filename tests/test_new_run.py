"""The New run page through AppTest: presets, column mapping, data preview, model and memory panel, Start."""
from __future__ import annotations


import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from db.store import Store
from trainer_core.planning import memory, model_info
from trainer_core.data import preview
from trainer_core.config import presets
from trainer_core.config import BUNDLED_MODEL, FieldError, TrainConfig
from trainer_core.jobs.orchestrator import RunRefused
from tests.support.apptest import (TINY, click, fakes, open_new_run, texts,  # noqa: F401 - fakes: a fixture
                                   use_local_file)
from ui.state import get_orchestrator

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "datasets"


def html_blocks(at: AppTest) -> list[str]:
    return [e.proto.body for e in at.get("html")]


def fixture_copy(tmp_path: Path, name: str) -> Path:
    """A fixture file where the page may read it (the allowed roots are tmp_path in tests)."""
    copy = tmp_path / name
    copy.write_bytes((FIXTURES / name).read_bytes())
    return copy


# ---------------------------------------------------------------------- model facts and memory
def test_model_panel_shows_facts_and_a_fitting_estimate(fakes):
    at = open_new_run()
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["Architecture"] == "LlamaForCausalLM"
    assert tiles["Parameters"] == "135M"
    assert tiles["Chat template"] == "yes"
    assert tiles["Context"] == "8,192"
    est = memory.estimate_memory(TINY, TrainConfig(), "cpu")
    assert tiles["Estimated need on CPU"] == f"{est.total_gb:.1f} GB"
    table = at.dataframe[0].value
    assert list(table["part"]) == [part for part, _ in est.rows()]
    assert list(table["GB"]) == [f"{gb:.2f}" for _, gb in est.rows()]
    assert [s.startswith("Fits: needs") for s in texts(at, "success")] == [True]
    assert fakes.inspect == [BUNDLED_MODEL]
    at.number_input(key="nr_max_steps").set_value(5).run()
    assert fakes.inspect == [BUNDLED_MODEL]  # cached: a rerun does not read the model again
    assert fakes.preview == []  # and never tokenizes the data unless asked


def test_memory_panel_says_what_to_change_when_it_does_not_fit(fakes):
    fakes.free_gb = 0.5
    at = open_new_run()
    [error] = [e for e in texts(at, "error") if e.startswith("Will not fit")]
    assert "0.5 GB free on test RAM" in error
    assert "turn on gradient checkpointing" in error and "lower batch_size to 2" in error


def test_memory_panel_reports_tight_fit(fakes):
    need = memory.estimate_memory(TINY, TrainConfig(), "cpu").total_gb
    fakes.free_gb = need * 1.02
    at = open_new_run()
    assert any(w.startswith("Tight: needs") for w in texts(at, "warning")), texts(at, "warning")


def test_model_panel_explains_a_model_it_cannot_read(app_home, monkeypatch):
    def broken(name, token=None):
        raise model_info.ModelInfoError("the hub cannot be reached and nothing is cached: connect or use a folder")

    monkeypatch.setattr(model_info, "inspect_model", broken)
    at = open_new_run()
    at.radio(key="nr_model_source").set_value("hub")
    at.text_input(key="nr_model_text").input("org/missing-model").run()
    assert "**model_name**: the hub cannot be reached and nothing is cached: connect or use a folder" in \
        texts(at, "warning")
    assert not any(m.label.startswith("Estimated need") for m in at.metric)


def test_model_panel_on_the_real_bundled_model(app_home):
    at = open_new_run()
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["Architecture"] == "LlamaForCausalLM" and tiles["Chat template"] == "yes"
    assert tiles["Parameters"].endswith("M")


# ---------------------------------------------------------------------- preview
def test_preview_runs_only_when_asked_and_renders_rows_safely(fakes):
    at = open_new_run()
    assert fakes.preview == []
    click(at, "Preview data")
    assert len(fakes.preview) == 1 and fakes.preview[0].model_name == BUNDLED_MODEL
    markdown = texts(at, "markdown")
    assert any("**Format: chatml** (found a 'messages' column with role/content turns)" in m for m in markdown)
    tiles = {m.label: m.value for m in at.metric}
    assert (tiles["Training rows"], tiles["Total tokens"], tiles["Trained tokens"]) == ("4", "1.17k", "400")
    assert (tiles["Truncated"], tiles["Dropped"], tiles["Steps per epoch"]) == ("1", "2", "1")
    assert "Dropped rows: no assistant turn: 2" in texts(at, "warning")
    first, second = html_blocks(at)
    assert second.count("<mark") == 1
    assert "<script>" not in first and "&lt;script&gt;alert(1)&lt;/script&gt;" in first
    assert '<mark style="background:#c7f0d2;padding:0">Hello &amp; bye</mark>' in first
    assert "&lt;|assistant|&gt;</mark>" not in first  # the prompt is not highlighted
    assert "**Row 1** · 900 tokens · truncated" in markdown


def test_preview_histogram_marks_max_seq_length(fakes):
    at = open_new_run()
    at.number_input(key="nr_max_seq_length").set_value(256).run()
    click(at, "Preview data")
    [chart] = at.get("vega_lite_chart")
    spec = json.loads(chart.proto.spec)
    frames = [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.proto.datasets]
    bars = next(f for f in frames if "rows" in f)
    assert bars["rows"].sum() == 4 and len(bars) == 40
    assert bars["end"].max() == 900  # the longest row sets the range
    assert set(bars[bars["start"] >= 256]["part"]) == {"truncated"}
    rule = next(f for f in frames if "max_seq_length" in f)
    assert rule["max_seq_length"].tolist() == [256]
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["bar", "rule"]


def test_preview_errors_are_shown_with_their_fields(fakes):
    fakes.result = preview.PreviewError([FieldError("format_type", "could not tell the format")])
    at = open_new_run()
    click(at, "Preview data")
    assert "**format_type**: could not tell the format" in texts(at, "error")
    assert not html_blocks(at)


def test_a_preview_says_when_the_settings_changed_since(fakes):
    at = open_new_run()
    click(at, "Preview data")
    assert not at.info
    at.number_input(key="nr_max_seq_length").set_value(1024).run()
    assert any("settings changed since this preview" in i for i in texts(at, "info"))
    assert len(fakes.preview) == 1
    click(at, "Preview data")
    assert not at.info and fakes.preview[-1].max_seq_length == 1024


def test_a_preview_stays_current_when_only_training_knobs_change(fakes):
    at = open_new_run()
    click(at, "Preview data")
    at.number_input(key="nr_learning_rate").set_value(1e-3)
    at.number_input(key="nr_lora_r").set_value(8).run()
    assert not at.info


def test_memory_estimate_uses_the_longest_previewed_row(fakes):
    at = open_new_run()
    at.number_input(key="nr_max_seq_length").set_value(2048).run()
    click(at, "Preview data")
    cfg = fakes.preview[-1]
    est = memory.estimate_memory(TINY, cfg, "cpu", longest_row=900)
    assert f"{est.total_gb:.1f}" != f"{memory.estimate_memory(TINY, cfg, 'cpu').total_gb:.1f}"
    assert {m.label: m.value for m in at.metric}["Estimated need on CPU"] == f"{est.total_gb:.1f} GB"
    assert any("sized from the longest row in the preview (900 tokens)" in c for c in texts(at, "caption"))


def test_preview_refuses_remote_code_without_confirmation(fakes):
    at = open_new_run()
    at.checkbox(key="nr_trust_remote_code").check().run()
    click(at, "Preview data")
    assert any(e.startswith("**trust_remote_code**:") for e in texts(at, "error"))
    assert fakes.preview == []


# ---------------------------------------------------------------------- column mapping
def test_mapping_pickers_map_unknown_columns_and_the_preview_uses_them(fakes, tmp_path):
    data = fixture_copy(tmp_path, "custom.csv")
    at = use_local_file(open_new_run(), data)
    assert any("Columns of custom.csv: `question`, `answer`, `notes`" in c for c in texts(at, "caption"))
    assert any(w.startswith("**format_type**: could not tell the format") for w in texts(at, "warning"))
    assert at.radio(key="nr_map_as_choice").value == "alpaca"
    pickers = {s.label: s for s in at.selectbox if s.key and s.key.startswith("nr_map_alpaca_")}
    assert list(pickers) == ["Instruction column *", "Input column (optional)", "Output column *"]
    assert pickers["Instruction column *"].options == ["—", "question", "answer", "notes"]
    pickers["Instruction column *"].set_value("question")
    pickers["Output column *"].set_value("answer")
    at.run()
    assert any("Auto-detected format: **alpaca** (found 'question' (mapped to 'instruction') and 'answer' "
               "(mapped to 'output') columns)" in c for c in texts(at, "caption"))
    click(at, "Preview data")
    assert fakes.preview[-1].custom_format_mapping == {"instruction": "question", "output": "answer"}
    assert fakes.preview[-1].local_datasets == [str(data)]


def test_mapping_pickers_for_a_chat_column_with_other_speaker_names(fakes, tmp_path):
    data = tmp_path / "talk.jsonl"
    data.write_text(json.dumps({"dialog": [{"speaker": "customer", "text": "Hi"},
                                           {"speaker": "agent", "text": "Hello"}]}) + "\n")
    at = use_local_file(open_new_run(), data)
    at.selectbox(key="nr_format_type").set_value("chatml").run()
    at.selectbox(key="nr_map_chatml_messages").set_value("dialog").run()
    assert at.selectbox(key="nr_map_chatml_role").options == ["—", "speaker", "text"]
    at.selectbox(key="nr_map_chatml_role").set_value("speaker")
    at.selectbox(key="nr_map_chatml_content").set_value("text").run()
    assert any("`customer`, `agent`" in c for c in texts(at, "caption"))
    at.selectbox(key="nr_map_chatml_user").set_value("customer")
    at.selectbox(key="nr_map_chatml_assistant").set_value("agent").run()
    click(at, "Preview data")
    assert fakes.preview[-1].custom_format_mapping == {"messages": "dialog", "role": "speaker", "content": "text",
                                                       "user": "customer", "assistant": "agent"}
    assert fakes.preview[-1].format_type == "chatml"


def test_typed_mapping_lines_win_over_the_pickers(fakes, tmp_path):
    at = use_local_file(open_new_run(), fixture_copy(tmp_path, "custom.csv"))
    at.selectbox(key="nr_map_alpaca_instruction").set_value("notes")
    at.selectbox(key="nr_map_alpaca_output").set_value("answer")
    at.text_area(key="nr_custom_format_mapping").input("instruction=question").run()
    click(at, "Preview data")
    assert fakes.preview[-1].custom_format_mapping == {"instruction": "question", "output": "answer"}


def test_a_broken_file_is_reported_where_the_columns_would_be(fakes, tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    at = use_local_file(open_new_run(), broken)
    assert any(e.startswith("**local_datasets**: broken.jsonl: line 1 is not valid JSON") for e in texts(at, "error"))


# ---------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", ["cpu-demo", "qlora-8b-24gb", "full-small", "cpt-raw-text"])
def test_loading_a_builtin_preset_fills_the_page_with_exactly_that_config(fakes, name):
    at = open_new_run()
    at.selectbox(key="nr_preset_choice").set_value(name)
    click(at, "Load preset")
    assert f"Loaded preset '{name}'." in texts(at, "success")
    click(at, "Preview data")
    assert fakes.preview[-1].to_dict() == presets.load_preset(name).to_dict()


def test_save_preset_writes_yaml_without_secrets_and_it_loads_back(fakes, app_home):
    at = open_new_run()
    at.text_input(key="nr_hf_token").input("hf_SECRET_123")
    at.text_input(key="nr_wandb_token").input("wb_SECRET_456")
    at.number_input(key="nr_max_steps").set_value(7)
    at.text_input(key="nr_preset_name").input("my-seven")
    at.text_input(key="nr_preset_description").input("Seven steps")
    click(at, "Save preset")
    path = app_home / "presets" / "my-seven.yaml"
    assert any(s.startswith(f"Saved preset 'my-seven' to {path}") for s in texts(at, "success"))
    text = path.read_text()
    assert text.startswith("# Seven steps\n") and "SECRET" not in text
    assert presets.load_preset("my-seven").max_steps == 7
    at.selectbox(key="nr_preset_choice").set_value("my-seven")
    at.number_input(key="nr_max_steps").set_value(99)
    click(at, "Load preset")
    assert at.number_input(key="nr_max_steps").value == 7
    assert at.text_input(key="nr_hf_token").value == "hf_SECRET_123"  # a preset never touches the token


def test_save_preset_with_a_bad_name_says_why(fakes, app_home):
    at = open_new_run()
    at.text_input(key="nr_preset_name").input("../escape")
    click(at, "Save preset")
    assert any(e.startswith("**preset_name**: name a preset with letters") for e in texts(at, "error"))
    assert not (app_home / "presets").exists() or not list((app_home / "presets").iterdir())


def test_a_broken_user_preset_is_reported_not_loaded(fakes, app_home):
    (app_home / "presets").mkdir(parents=True)
    (app_home / "presets" / "typo.yaml").write_text("max_step: 3\n")
    at = open_new_run()
    at.selectbox(key="nr_preset_choice").set_value("typo")
    click(at, "Load preset")
    assert "**max_step**: in preset typo.yaml: unknown field. Did you mean 'max_steps'?" in texts(at, "error")
    assert at.number_input(key="nr_max_steps").value == 60


def test_form_values_survive_a_visit_to_another_page(fakes):
    at = open_new_run()
    at.number_input(key="nr_max_steps").set_value(13).run()
    at.switch_page("pages/history.py").run()
    at.switch_page("pages/new_run.py").run()
    assert not at.exception, at.exception
    assert at.number_input(key="nr_max_steps").value == 13


# ---------------------------------------------------------------------- Start
def test_trust_remote_code_needs_a_second_confirmation(fakes):
    at = open_new_run()
    at.number_input(key="nr_learning_rate").set_value(0.0)  # keeps the run from starting in every case
    at.checkbox(key="nr_trust_remote_code").check().run()
    click(at, "Start training")
    errors = texts(at, "error")
    assert any(e.startswith("**trust_remote_code**: tick 'I have read this model's code") for e in errors), errors
    at.checkbox(key="nr_trust_remote_code_confirm").check().run()
    click(at, "Start training")
    errors = texts(at, "error")
    assert not any(e.startswith("**trust_remote_code**") for e in errors)
    assert any(e.startswith("**learning_rate**") for e in errors)
    assert Store().list_runs() == []


def test_early_stopping_needs_an_eval_set(fakes):
    at = open_new_run()
    at.number_input(key="nr_early_stopping_patience").set_value(3)
    click(at, "Start training")
    assert any(e.startswith("**early_stopping_patience**: early stopping watches eval loss")
               for e in texts(at, "error"))
    at.number_input(key="nr_eval_fraction").set_value(0.1)
    at.number_input(key="nr_learning_rate").set_value(0.0)
    click(at, "Start training")
    assert not any(e.startswith("**early_stopping_patience**") for e in texts(at, "error"))


def test_a_queued_run_stays_on_the_page(fakes, monkeypatch):
    orch = get_orchestrator()
    started = []
    monkeypatch.setattr(orch, "start", lambda cfg, actor=None: started.append(cfg) or "run-q")
    monkeypatch.setattr(orch, "get_run", lambda run_id: SimpleNamespace(id=run_id, status="queued", name="my run"))
    at = open_new_run()
    at.text_input(key="nr_hf_token").input("hf_tok")
    click(at, "Start training")
    assert [t.value for t in at.title] == ["New run"]
    assert any(s.startswith("Queued 'my run': it starts when the current run ends; see History")
               for s in texts(at, "success"))
    assert "live_run_id" not in at.session_state
    assert started[0].hf_token == "hf_tok"  # the token goes to the orchestrator, in memory


def test_a_started_run_switches_to_live(fakes, monkeypatch):
    orch = get_orchestrator()
    monkeypatch.setattr(orch, "start", lambda cfg, actor=None: "run-s")
    monkeypatch.setattr(orch, "get_run", lambda run_id: SimpleNamespace(id=run_id, status="starting", name="x"))
    at = open_new_run()
    click(at, "Start training")
    assert at.session_state["live_run_id"] == "run-s"


def test_a_refused_run_is_a_warning(fakes, monkeypatch):
    def refuse(cfg, actor=None):
        raise RunRefused("no usable checkpoint to resume from")

    monkeypatch.setattr(get_orchestrator(), "start", refuse)
    at = open_new_run()
    click(at, "Start training")
    assert texts(at, "warning")[-1] == "no usable checkpoint to resume from"


# Left at their defaults below: secrets (never in presets), hub fields (the built-in presets cover them),
# trust_remote_code (needs its confirmation), the unsupported switches, which have no widget, and
# sample_prompt_set (a run samples either a set or inline prompts; the prompts are set here).
UNTOUCHED = {"hf_token", "wandb_token", "hf_dataset", "subset", "train_split", "eval_split", "trust_remote_code",
             "finetune_vision_layers", "is_dataset_image", "is_dataset_audio", "sample_prompt_set",
             "launcher", "ray_address", "ray_gpus_per_worker", "ray_max_failures",  # Ray: tests/ui/test_ray_pages.py
             "method_settings"}  # a cpt run has none (a method's settings: tests/ui/test_method_settings_form.py)


def test_every_config_field_with_a_widget_round_trips(fakes, tmp_path):
    """A config that differs from the defaults in every widget-backed field comes back unchanged."""
    data = str(fixture_copy(tmp_path, "custom.csv"))
    cfg = TrainConfig(run_name="all fields", model_name=str(tmp_path / "model"), method="cpt", adapter="full",
                      max_seq_length=384, load_in_4bit=True, use_loftq=True, finetune_language_layers=False,
                      enable_wandb=True, eval_fraction=0.2, resume_from_checkpoint="runs/r1/checkpoint-5",
                      init_adapter="runs/r0/adapter",
                      local_datasets=[data], local_eval_datasets=[data],
                      format_type="alpaca", eval_steps=7, early_stopping_patience=2,
                      dataset_slice_start=1, dataset_slice_end=9, custom_format_mapping={"instruction": "question",
                                                                                          "output": "answer"},
                      system_prompt="Be brief.", num_epochs=2.5, max_steps=0, learning_rate=3e-5,
                      embedding_learning_rate=1e-6, batch_size=3, gradient_accumulation_steps=2, warmup_steps=0,
                      warmup_ratio=0.1, weight_decay=0.05, max_grad_norm=0.5, lr_scheduler_type="cosine",
                      optim="sgd", random_seed=11, packing=True, train_on_completions=True,
                      gradient_checkpointing=True, logging_steps=3, save_steps=20, use_lora=False, lora_r=4,
                      lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "my_proj"], use_rslora=True,
                      finetune_attention_modules=False, finetune_mlp_modules=False, gpu_ids=[1], num_processes=1,
                      enable_tensorboard=True, tensorboard_dir="tb", wandb_project="p2", allow_memory_overcommit=True,
                      sample_prompts=["Say hi, briefly.", "Two lines:\nfirst\n\nsecond"], sample_every_steps=5,
                      sample_max_new_tokens=32, sample_images=["", str(tmp_path / "second.png")], image_max_side=512,
                      tool_template="hermes", train_on_tool_results=True)
    untouched = {name for name in TrainConfig.field_names() if getattr(cfg, name) == getattr(TrainConfig(), name)}
    assert untouched == UNTOUCHED  # every other field is set away from its default here
    presets.save_preset("everything", cfg)
    at = open_new_run()
    at.selectbox(key="nr_preset_choice").set_value("everything")
    click(at, "Load preset")
    click(at, "Preview data")
    assert fakes.preview[-1].to_dict() == cfg.to_dict()


# ---------------------------------------------------------------------- the real preview (tokenizer in a subprocess)
@pytest.mark.subprocess  # the real preview: a transformers subprocess
def test_preview_of_the_bundled_demo_with_the_real_tokenizer(app_home, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(ROOT / ".test-cache" / "models"))  # convert once per machine
    at = open_new_run()
    at.checkbox(key="nr_train_on_completions").check()
    at.number_input(key="nr_max_seq_length").set_value(128).run()
    at.button(key="nr_preview_button").click().run(timeout=240)
    assert not at.exception, at.exception
    assert not at.error, texts(at, "error")
    assert any(m.startswith("**Format: chatml**") for m in texts(at, "markdown"))
    blocks = html_blocks(at)
    assert len(blocks) == 5 and all("<mark" in b for b in blocks)
    assert all("&lt;|im_start|&gt;assistant" in b for b in blocks)  # the template's markers, escaped
    tiles = {m.label: m.value for m in at.metric}
    assert int(tiles["Training rows"].replace(",", "")) > 0
    assert at.get("vega_lite_chart")


def test_the_form_shows_the_global_batch_of_a_two_process_run(fakes):
    at = open_new_run()
    at.number_input(key="nr_batch_size").set_value(3).run()
    at.number_input(key="nr_gradient_accumulation_steps").set_value(2).run()
    at.number_input(key="nr_num_processes").set_value(2).run()
    assert not at.exception, at.exception
    assert ("2 data-parallel process(es): global batch 12 rows per step (batch 3 × accumulation 2 × 2)"
            in texts(at, "caption"))
