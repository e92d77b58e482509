"""EvalSpec: every training format becomes prompt/reference samples; bad input is named with its field and fix."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil

import pytest

from tests.support import ROOT
from trainer_core.specs import model_source
from trainer_core.planning import memory
from trainer_core.config import BUNDLED_MODEL, FieldError, TrainConfig
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.specs.jobspec import read_spec, write_spec
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, write_kind

DATA = ROOT / "tests" / "fixtures" / "datasets"
BASE = ModelSource(model=BUNDLED_MODEL)


@pytest.fixture
def files(home, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(DATA, target)
    return target


def spec(**values) -> EvalSpec:
    return EvalSpec(**{"source": BASE, **values})


def test_every_training_format_gives_prompt_and_reference(files):
    alpaca, _ = eval_samples.load_samples(spec(data=str(files / "alpaca.jsonl")))
    assert [(s.prompt[-1]["content"], s.reference) for s in alpaca] == [
        ("Add 2 and 3.", "5"), ("Translate to French.\n\ncat", "chat"), ("Name a colour.", "Blue")]
    chat, _ = eval_samples.load_samples(spec(data=str(files / "chatml.jsonl")))
    # The reference is the LAST assistant turn; every turn before it is the prompt (as training splits it).
    assert chat[1].prompt[-1] == {"role": "user", "content": "And 3+3?"} and len(chat[1].prompt) == 3
    share, _ = eval_samples.load_samples(spec(data=str(files / "sharegpt.json")))
    assert [(s.prompt[0]["role"], s.reference) for s in share] == [("system", "Hi there!"), ("user", "Lima.")]
    mapped, _ = eval_samples.load_samples(spec(data=str(files / "custom.csv"),
                                               custom_format_mapping={"instruction": "question", "output": "answer"}))
    assert [(s.prompt[-1]["content"], s.reference) for s in mapped][:2] == [("What is 1+1?", "2"),
                                                                           ("What is the capital of Chile?", "Santiago")]


def test_max_samples_and_a_round_trip_through_job_json(files, home, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", "JUDGE_KEY")  # the admin declared it for judging
    samples, _ = eval_samples.load_samples(spec(data=str(files / "alpaca.jsonl"), max_samples=2))
    assert len(samples) == 2
    folder = paths.run_dir("20260101-000000-abcdef")
    folder.mkdir(parents=True)
    original = spec(data=str(files / "alpaca.jsonl"), metrics=["exact", "judge"], judge_url="http://x/v1",
                    judge_model="m", judge_key_env="JUDGE_KEY", lm_eval_tasks=["hellaswag"])
    write_spec(folder, original)
    write_kind(folder, JobKind.EVAL)
    assert read_spec(folder) == original
    assert original.env_names() == ["JUDGE_KEY"]
    assert "JUDGE_KEY" not in json.dumps(original.to_dict()).replace('"judge_key_env": "JUDGE_KEY"', "")


def errors_of(s: EvalSpec) -> list[FieldError]:
    return s.validate()


def test_bad_shapes_and_empty_files_name_the_data_field(files):
    text = errors_of(spec(data=str(files / "text.csv")))
    assert [e.field for e in text] == ["data"] and "raw text has no reference answers" in text[0].message
    empty = errors_of(spec(data=str(files / "empty.jsonl")))
    assert empty == [FieldError("data", "empty.jsonl has no rows")]
    unknown = errors_of(spec(data=str(files / "unknown_columns.jsonl")))
    assert [e.field for e in unknown] == ["format_type"] and "could not tell the format" in unknown[0].message
    missing = errors_of(spec(data=str(files / "nope.jsonl")))
    assert [e.field for e in missing] == ["data"] and "does not exist" in missing[0].message
    (files / "no_reply.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    no_reply = errors_of(spec(data=str(files / "no_reply.jsonl")))
    assert [e.field for e in no_reply] == ["data"] and "no assistant turn: 1" in no_reply[0].message
    (files / "no_prompt.jsonl").write_text(json.dumps({"messages": [{"role": "assistant", "content": "hi"}]}) + "\n")
    no_prompt = errors_of(spec(data=str(files / "no_prompt.jsonl")))
    assert [e.field for e in no_prompt] == ["data"] and "no user turn: 1" in no_prompt[0].message
    assert errors_of(spec(data="")) == [FieldError("data", "choose a test file (or eval_split:<run id>, "
                                                           "hub:<dataset id>), or name lm_eval_tasks")]


def test_field_errors_are_collected_together(files):
    bad = spec(data=str(files / "alpaca.jsonl"), metrics=["exact", "bleurt"], temperature=3.0, max_new_tokens=0,
               top_p=0.0, batch_size=100)
    assert [e.field for e in bad.validate()] == ["metrics", "temperature", "top_p", "max_new_tokens", "batch_size"]
    assert "unknown metric 'bleurt'" in bad.validate()[0].message


def test_the_judge_needs_an_endpoint_a_model_and_a_key_name_not_a_key(files):
    judged = spec(data=str(files / "alpaca.jsonl"), metrics=["judge"], judge_key_env="sk-abc def",
                  judge_rubric="Grade {answer}")
    assert [e.field for e in judged.validate()] == ["judge_url", "judge_model", "judge_key_env", "judge_rubric"]
    assert "the NAME of an environment variable" in judged.validate()[2].message
    assert "{prompt}, {reference}" in judged.validate()[3].message


def test_lm_eval_tasks_are_names_or_yaml_files_inside_the_allowed_folders(files, tmp_path, monkeypatch):
    task = files / "task.yaml"
    task.write_text("task: tiny\n")
    ok = spec(data="", lm_eval_tasks=["hellaswag", str(task)])
    assert ok.validate() == []
    bad = spec(data="", lm_eval_tasks=["../etc; rm", str(files / "missing.yaml"), "/etc/task.yaml"])
    assert [e.field for e in bad.validate()] == ["lm_eval_tasks"] * 3
    assert "does not exist" in bad.validate()[1].message and "outside the allowed folders" in bad.validate()[2].message
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # lm-eval not installed
    assert ok.validate() == [FieldError("lm_eval_tasks", "benchmarks need lm-evaluation-harness: pip install "
                                                         "'finetune-studio[eval]' (or pip install lm-eval), or clear "
                                                         "lm_eval_tasks")]


def test_sources_that_cannot_be_evaluated(files, home):
    run_id = "20260101-000000-aaaaaa"
    folder = paths.run_dir(run_id)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name="r").to_yaml())
    data = str(files / "alpaca.jsonl")
    no_model = spec(source=ModelSource(run_id=run_id), data=data).validate()
    assert [e.field for e in no_model] == ["run"] and "has no saved adapter yet" in no_model[0].message
    (folder / "adapter").mkdir()
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    assert spec(source=ModelSource(run_id=run_id), data=data).validate() == []
    no_step = spec(source=ModelSource(run_id=run_id, checkpoint=7), data=data).validate()
    assert no_step == [FieldError("checkpoint", "run 'r' has no checkpoint at step 7: it has no checkpoints")]


def test_a_model_larger_than_free_memory_is_refused(files, monkeypatch):
    monkeypatch.setattr(memory, "device_memory", lambda cfg: memory.DeviceMemory("cpu", "system RAM", 0.1, 8.0))
    errors = spec(data=str(files / "alpaca.jsonl")).validate()
    assert [e.field for e in errors] == ["memory"]
    assert "needs about 0.6 GB to evaluate" in errors[0].message and "0.1 GB free" in errors[0].message


def test_baseline_keys_follow_the_data_and_the_scored_settings(files):
    first = spec(data=str(files / "alpaca.jsonl"))
    fp = eval_samples.fingerprint(first)
    assert eval_samples.fingerprint(dataclasses.replace(first, source=ModelSource(run_id="x"))) == fp
    assert eval_samples.settings_hash(dataclasses.replace(first, name="other", baseline=False, batch_size=1)) == \
        eval_samples.settings_hash(first)  # not scored: the same baseline serves
    assert eval_samples.settings_hash(dataclasses.replace(first, max_new_tokens=5)) != eval_samples.settings_hash(first)
    (files / "alpaca.jsonl").write_text((files / "alpaca.jsonl").read_text() + '{"instruction": "a", "output": "b"}\n')
    assert eval_samples.fingerprint(first) != fp
    assert model_source.ModelSource(model=BUNDLED_MODEL).key == f"base:{BUNDLED_MODEL}"


def test_a_runs_own_eval_split(files, home):
    from trainer_core.data.loading import load_for_training

    run_id = "20260101-000000-bbbbbb"
    folder = paths.run_dir(run_id)
    folder.mkdir(parents=True)
    cfg = TrainConfig(model_name=BUNDLED_MODEL, local_datasets=[str(files / "alpaca.jsonl")], eval_fraction=0.34)
    (folder / "config.yaml").write_text(cfg.to_yaml())
    samples, _ = eval_samples.load_samples(spec(data=f"eval_split:{run_id}"))
    held = load_for_training(cfg).eval_rows  # the rows the run held out, chosen by the same function
    assert [s.reference for s in samples] == [r["messages"][-1]["content"] for r in held] and len(samples) == 1
    (folder / "config.yaml").write_text(dataclasses.replace(cfg, eval_fraction=0.0).to_yaml())
    assert spec(data=f"eval_split:{run_id}").validate() == [
        FieldError("data", f"run {run_id} has no eval split (no eval files and eval_fraction 0): give a test file instead")]
    missing = spec(data="eval_split:20260101-000000-cccccc").validate()
    assert [e.field for e in missing] == ["data"] and "is gone" in missing[0].message


def test_a_relative_task_yaml_is_made_absolute_before_the_worker_runs_in_its_job_folder(files, tmp_path, monkeypatch):
    """`eval --lm-eval tasks/tiny.yaml` was checked against the shell's folder, then read by the worker against
    its job folder: accepted, then failed after the model was loaded."""
    from trainer_core.jobs.evals import prepared
    from trainer_core.worker.benchmarks import task_names

    (files / "tasks").mkdir()
    (files / "tasks" / "tiny.yaml").write_text("task: tiny\n")
    monkeypatch.chdir(files)
    ready = prepared(spec(data="", lm_eval_tasks=["tasks/tiny.yaml", "hellaswag"]))
    assert ready.lm_eval_tasks == [str(files / "tasks" / "tiny.yaml"), "hellaswag"] and ready.validate() == []
    job = tmp_path / "job"
    job.mkdir()
    monkeypatch.chdir(job)  # where the worker runs
    assert task_names(ready.lm_eval_tasks) == (["tiny", "hellaswag"], [str(files / "tasks")])


@pytest.mark.parametrize("name", ["name", "data", "system_prompt", "judge_url", "judge_model", "judge_key_env",
                                  "judge_rubric", "lm_eval_tasks"])
@pytest.mark.parametrize("value", [None, 5, [1], {"a": 1}])
def test_a_field_of_the_wrong_type_is_named_not_a_crash(files, name, value):
    """A hand-edited job.json with data: null (or a number, a list) crashed validate with an AttributeError."""
    bad = spec(**{"data": str(files / "alpaca.jsonl"), "metrics": ["exact", "judge"], "judge_url": "http://x/v1",
                  "judge_model": "m", name: value})
    assert name in [e.field for e in bad.validate()]
