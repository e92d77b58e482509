"""The method contract (issue 18): every registered method goes through what a user's run goes through —
validate, the data preview (a subprocess) and a 2-step training run of the tiny model through the orchestrator,
the worker process, the event log and the store — and reports the metrics its spec says it charts.

Adding a method to ``trainer_core.methods.METHODS`` adds it here; a method without a case below fails
``test_every_registered_method_has_a_contract_case`` until one is written."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from trainer_core import methods
from trainer_core.config import BUNDLED_PAIRS, TrainConfig
from trainer_core.data import loading
from trainer_core.data.preview import build_preview
from trainer_core.protocol.status import RunStatus

RAW_TEXT = ["The tide tables of the northern harbour list two high waters a day.",
            "Copper roofs turn green as the metal reacts with air and rain over many years.",
            "A sourdough starter is flour and water kept alive by wild yeasts and bacteria."] * 4

# method -> (config fields, what the preview must show, a per-step metric its worker must report)
CASES: dict[str, tuple[dict, str, str]] = {
    "sft": ({}, "chat", "loss"),
    "cpt": ({"local_datasets": ["{text}"]}, "text", "loss"),
    # with the RPO term: TRL 1.16 has no DPOConfig.rpo_alpha (it raised TypeError at start); "sft" loss weight now
    "dpo": ({"local_datasets": [BUNDLED_PAIRS], "dpo": {"rpo_alpha": 0.5}}, "pairs", "rewards/accuracies"),
    "orpo": ({"local_datasets": [BUNDLED_PAIRS]}, "pairs", "rewards/accuracies"),
    "simpo": ({"local_datasets": [BUNDLED_PAIRS]}, "pairs", "rewards/accuracies"),
    "kto": ({"local_datasets": [BUNDLED_PAIRS]}, "kto", "kl"),
    "reward": ({"local_datasets": [BUNDLED_PAIRS]}, "pairs", "loss"),
    "grpo": ({"grpo": {"num_generations": 2, "max_completion_length": 8, "max_prompt_length": 96,
                       "rewards": [{"type": "length", "target": 4}], "sample_every": 0}},
             "prompts", "rewards/length/mean"),
}
# Methods whose contract lives with their own model (a sentence-transformers model, not the tiny causal LM)
OWN_CASES = {"embedding": "tests/methods/test_embedding_train.py", "stt": "tests/speech/test_stt_train.py",
             "tts": "tests/speech/test_tts_train.py"}


def config_for(name: str, model: Path, tmp_path: Path) -> TrainConfig:
    fields, _, _ = CASES[name]
    text_file = tmp_path / "notes.jsonl"
    text_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in RAW_TEXT))
    fields = json.loads(json.dumps(fields).replace('"{text}"', json.dumps(str(text_file))))
    batch = 2
    return TrainConfig.from_dict({  # read as a YAML file is: a method's settings are its section
        "run_name": f"contract {name}", "model_name": str(model), "method": name, "max_steps": 2, "batch_size": batch,
        "max_seq_length": 128, "warmup_steps": 0, "logging_steps": 1, "save_steps": 0, "learning_rate": 1e-3,
        **fields})


def test_every_registered_method_has_a_contract_case():
    assert sorted(methods.METHODS) == sorted([*CASES, *(n for n in OWN_CASES if n in methods.METHODS)])
    for path in OWN_CASES.values():
        assert Path(path).exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_method_validates_with_its_own_data_and_refuses_the_wrong_shape(name, studio, tiny_model, tmp_path):
    cfg = config_for(name, tiny_model, tmp_path)
    assert cfg.validate() == [] and loading.check_data(cfg) == []
    spec = methods.get(name)
    # the other family's data is refused before start, naming the dataset field and the method's fix
    wrong = {"chat": [BUNDLED_PAIRS], "text": [BUNDLED_PAIRS], "pairs": ["bundled:demo-chat"],
             "kto": ["bundled:demo-chat"], "prompts": [str(tmp_path / "notes.jsonl")]}[spec.data_shapes[0]]
    problems = loading.check_data(dataclasses.replace(cfg, local_datasets=wrong))
    assert len(problems) == 1 and problems[0].field in ("format_type", "local_datasets"), problems
    if spec.data_shapes[0] in ("chat", "text"):  # pairs given to sft/cpt: the fix is another method
        assert "look like preference pairs: train them with method dpo" in problems[0].message
    else:
        assert "this method needs" in problems[0].message or "could not tell the data's shape" in problems[0].message
        assert "prompt" in problems[0].message  # what the method's rows must hold


@pytest.mark.subprocess
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_method_previews_its_rows(name, studio, tiny_model, tmp_path):
    cfg = config_for(name, tiny_model, tmp_path)
    preview = build_preview(cfg, rows_shown=2)
    assert preview.format.split("+")[0] == CASES[name][1] or CASES[name][1] in preview.format, preview.format
    assert preview.rows and all(r.num_tokens > 0 for r in preview.rows)
    assert preview.total_rows > 0


@pytest.mark.train
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_method_trains_two_steps_and_reports_its_metrics(name, studio, tiny_model, tmp_path):
    cfg = config_for(name, tiny_model, tmp_path)
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"
    run = studio.get_run(run_id)
    assert run.steps_done == 2
    assert Path(run.output_dir).is_dir() and any(Path(run.output_dir).iterdir())
    key = CASES[name][2]
    frame = studio.metrics(run_id, keys=[key] if key not in ("loss",) else None)
    assert key in frame.columns, f"{key} not among {list(frame.columns)} / {studio.metric_keys(run_id)}"
    values = frame.dropna(subset=[key])
    assert list(values["step"]) == [1, 2]  # one row per step, none lost or duplicated
    assert all(math.isfinite(v) for v in values[key])
    # every per-step metric the method's spec charts by default that the run logged is stored and finite
    logged = set(frame.columns) | set(studio.metric_keys(run_id))
    charted = [m.key for m in methods.get(name).metric_specs_of(json.loads(run.config_json)) if m.chart]
    assert key in charted
    assert logged & set(charted)
