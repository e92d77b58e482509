"""OpenAI's reinforcement requests read into the studio's GRPO run (no server, no worker): each grader's rewards,
each hyperparameter's setting, the files reinforcement trains on, a continued model's start, and every refusal as an
OpenAI error naming the parameter."""
from __future__ import annotations

import json

import pytest

from trainer_core.api import datafile, files, graders, requests
from trainer_core.api.errors import ApiError
from trainer_core.config import ConfigError
from trainer_core.rewards.spec import parse_rewards

OUT = "{{sample.output_text}}"
CAPITALS = [{"messages": [{"role": "developer", "content": "Answer with the city only."},
                          {"role": "user", "content": f"Capital of {country}?"}], "reference_answer": city}
            for country, city in (("France", "Paris"), ("Peru", "Lima"), ("Japan", "Tokyo"))]


def check(operation: str, reference: str = "{{item.reference_answer}}", **extra) -> dict:
    return {"type": "string_check", "name": "city", "input": OUT, "reference": reference, "operation": operation,
            **extra}


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def refused(call) -> dict:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value.body()["error"] | {"status": caught.value.status}


@pytest.mark.parametrize("grader, reward", [
    (check("eq"), {"type": "answer_match", "column": "reference_answer", "mode": "exact", "extract": "whole",
                   "weight": 1.0, "name": "city"}),
    (check("ne"), {"type": "answer_match", "column": "reference_answer", "mode": "exact", "extract": "whole",
                   "weight": -1.0, "name": "city"}),
    (check("eq", "Paris (France)"), {"type": "format", "pattern": r"\s*Paris\ \(France\)\s*", "weight": 1.0,
                                     "name": "city"}),
    (check("ne", "I don't know"), {"type": "format", "pattern": r"\s*I\ don't\ know\s*", "weight": -1.0,
                                   "name": "city"}),
    (check("like", "Paris"), {"type": "contains", "keywords": ["Paris"], "case_sensitive": True, "weight": 1.0,
                              "name": "city"}),
    (check("ilike", "paris"), {"type": "contains", "keywords": ["paris"], "case_sensitive": False, "weight": 1.0,
                               "name": "city"}),
    ({**check("eq", "{{ item.answer }}"), "name": "Exact match!"},
     {"type": "answer_match", "column": "answer", "mode": "exact", "extract": "whole", "weight": 1.0,
      "name": "Exact_match"}),
])
def test_each_string_check_is_its_closest_builtin_reward(grader, reward):
    mapped = graders.to_rewards(grader)
    assert mapped.rewards == [reward]
    specs, problems = parse_rewards(mapped.rewards)  # what the run's config validation reads
    assert problems == [] and [s.kind for s in specs] == [reward["type"]]


def test_the_mapped_rewards_score_like_openais_graders():
    from trainer_core.rewards.builtin import BUILTINS

    def score(grader, completions, **columns):
        [reward] = graders.to_rewards(grader).rewards
        params = {k: v for k, v in reward.items() if k not in ("type", "weight", "name")}
        return [reward["weight"] * s for s in BUILTINS[reward["type"]]([], completions, **params, **columns)]

    answers = {"reference_answer": ["Paris", "Lima"]}
    assert score(check("eq"), [" Paris\n", "Lima, Peru"], **answers) == [1.0, 0.0]
    assert score(check("ne"), ["Paris", "Lima, Peru"], **answers) == [-1.0, 0.0]  # OpenAI's 0 / 1, shifted by -1
    assert score(check("eq", "Paris"), ["Paris", "paris"]) == [1.0, 0.0]
    assert score(check("like", "Paris"), ["It is Paris.", "it is paris"]) == [1.0, 0.0]
    assert score(check("ilike", "Paris"), ["It is Paris.", "it is paris"]) == [1.0, 1.0]


def test_a_multi_grader_is_its_graders_weighted_by_calculate_output():
    grader = {"type": "multi", "name": "total", "calculate_output": "(3 * exact + near) / 4 - 0.5 * refusal + 1",
              "graders": {"exact": check("eq"), "near": check("ilike", "paris"),
                          "refusal": {"type": "multi", "calculate_output": "2 * a",
                                      "graders": {"a": check("eq", "I cannot help")}}}}
    mapped = graders.to_rewards(grader)
    assert [(r["name"], r["type"], r["weight"]) for r in mapped.rewards] == [
        ("exact", "answer_match", 0.75), ("near", "contains", 0.25), ("a", "format", -1.0)]
    assert mapped.fields == {"reference_answer": "method.reinforcement.grader.graders.exact.reference"}
    unused = {**grader, "calculate_output": "exact"}  # a grader left out of the sum weighs nothing
    assert [r["name"] for r in graders.to_rewards(unused).rewards] == ["exact"]


@pytest.mark.parametrize("grader, param, code, fix", [
    ({"type": "python", "source": "def grade(sample, item): return 1.0"}, "method.reinforcement.grader.type",
     "unsupported", "ask an admin to start the GRPO run with grpo.rewards: [{python: FILE"),
    ({"type": "score_model", "model": "gpt-4o", "input": []}, "method.reinforcement.grader.type", "unsupported",
     "train a reward model (method reward)"),
    ({"type": "label_model", "model": "gpt-4o", "input": [], "labels": ["a"], "passing_labels": ["a"]},
     "method.reinforcement.grader.type", "unsupported", "LLM judge"),
    ({"type": "text_similarity", "input": OUT, "reference": "{{item.a}}", "evaluation_metric": "bleu"},
     "method.reinforcement.grader.type", "unsupported", "use a string_check grader"),
    ({"type": "semantic"}, "method.reinforcement.grader.type", None, "string_check or multi"),
    ("eq", "method.reinforcement.grader", None, "must be an object"),
    (check("startswith"), "method.reinforcement.grader.operation", None, "eq, ne, like or ilike"),
    (check("eq", "{{item.a}}", input="{{sample.output_json.city}}"), "method.reinforcement.grader.input", None,
     "{{sample.output_text}}"),
    (check("eq", "The answer is {{item.a}}"), "method.reinforcement.grader.reference", None, "cannot be mapped"),
    (check("eq", "{{item.a.b}}"), "method.reinforcement.grader.reference", None, "top-level field"),
    (check("eq", "{{sample.output_text}}"), "method.reinforcement.grader.reference", None, "cannot be mapped"),
    (check("eq", "{{item.messages}}"), "method.reinforcement.grader.reference", None, "the prompt itself"),
    (check("like", "{{item.a}}"), "method.reinforcement.grader.operation", "unsupported", "give reference as plain"),
    (check("eq", ""), "method.reinforcement.grader.reference", None, "reference is required"),
    (check("eq", pass_threshold=0.5), "method.reinforcement.grader.pass_threshold", None, "it takes type, name"),
    ({"type": "multi", "graders": {"a": check("eq"), "b": check("like", "x")}, "calculate_output": "max(a, b)"},
     "method.reinforcement.grader.calculate_output", "unsupported", "weighted sum"),
    ({"type": "multi", "graders": {"a": check("eq"), "b": check("like", "x")}, "calculate_output": "a * b"},
     "method.reinforcement.grader.calculate_output", "unsupported", "no min, max or products"),
    ({"type": "multi", "graders": {"a": check("eq")}, "calculate_output": "a + c"},
     "method.reinforcement.grader.calculate_output", "unsupported", "(a)"),
    ({"type": "multi", "graders": {"a": check("eq")}}, "method.reinforcement.grader.calculate_output", None,
     "calculate_output is required"),
    ({"type": "multi", "graders": {"a": {"type": "python", "source": "x"}}, "calculate_output": "a"},
     "method.reinforcement.grader.graders.a.type", "unsupported", "your own code"),
    ({"type": "multi", "graders": {"a": check("eq")}, "calculate_output": "0 * a + 1"},
     "method.reinforcement.grader", None, "all its weights are 0"),
])
def test_a_grader_that_cannot_be_mapped_is_refused_naming_its_parameter(grader, param, code, fix):
    error = refused(lambda: graders.to_rewards(grader))
    assert error["status"] == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["code"] == code and fix in error["message"], error


# ---------------------------------------------------------------------- the whole request
@pytest.fixture
def stored(home):
    """Files as the API stores them: OpenAI's reinforcement rows, chat rows, alpaca rows, preference pairs."""
    upload = {"prompts": ("capitals.jsonl", jsonl(CAPITALS)),
              "chat": ("chat.jsonl", jsonl([{"messages": [{"role": "user", "content": "Capital of Peru?"},
                                                          {"role": "assistant", "content": "Lima"}]}] * 2)),
              "alpaca": ("alpaca.jsonl", jsonl([{"instruction": "Capital of Peru?", "output": "Lima"}] * 2)),
              "pairs": ("pairs.jsonl", jsonl([{"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."}] * 2))}
    return {name: files.save(data, filename, "fine-tune", "ana") for name, (filename, data) in upload.items()}


def body(training_file: str, grader=None, hyper=None, **extra) -> dict:
    section = {"grader": grader or check("eq")}
    if hyper is not None:
        section["hyperparameters"] = hyper
    return {"model": "SmolLM2-135M-Instruct", "training_file": training_file,
            "method": {"type": "reinforcement", "reinforcement": section}, **extra}


def test_openai_reinforcement_rows_are_stored_as_grpo_prompts(stored):
    rows = stored["prompts"]
    assert (rows.shape, rows.format, rows.rows, rows.columns) == ("prompts", "prompts", 3, ["reference_answer"])
    converted = [json.loads(line) for line in rows.training_path.read_text().splitlines()]
    assert rows.training_path.name == f"{rows.id}.prompts.jsonl"  # developer turns are the studio's system turns
    assert converted[0]["messages"][0] == {"role": "system", "content": "Answer with the city only."}
    assert stored["chat"].columns == ["answer"]  # chat rows: the last answer is the answer field
    assert stored["alpaca"].columns is None and stored["pairs"].columns is None
    files.delete(rows)
    assert not rows.training_path.exists() and not rows.path.exists()


def test_a_bad_reinforcement_row_is_refused_naming_its_line():
    bad = jsonl(CAPITALS[:1]) + jsonl([{"messages": [{"role": "wizard", "content": "?"}], "reference_answer": "x"}])
    error = refused(lambda: datafile.check(bad, "rl.jsonl"))
    assert error["param"] == "file" and error["message"].startswith("rl.jsonl: line 2: messages is not a list")


def test_a_reinforcement_job_is_a_grpo_run_with_the_graders_rewards(stored):
    request, cfg = requests.read(body(
        stored["prompts"].id, hyper={"n_epochs": 2, "batch_size": 2, "compute_multiplier": 1.5, "eval_interval": 5,
                                     "reasoning_effort": "high", "learning_rate_multiplier": 2},
        studio={"grpo": {"max_completion_length": 16}}))
    assert cfg.method == "grpo" and cfg.num_epochs == 2.0 and cfg.max_steps == 0 and cfg.eval_steps == 5
    assert cfg.method_settings.num_generations == 6  # the studio's 4 x 1.5
    assert cfg.batch_size == 12  # 2 prompts x 6 completions each
    assert cfg.learning_rate == pytest.approx(4e-4) and cfg.method_settings.max_completion_length == 16
    assert cfg.method_settings.rewards == [{"type": "answer_match", "column": "reference_answer", "mode": "exact",
                                            "extract": "whole", "weight": 1.0, "name": "city"}]
    assert cfg.local_datasets == [str(stored["prompts"].training_path)]
    assert request.hyperparameters == {"n_epochs": 2, "batch_size": 2, "learning_rate_multiplier": 2.0,
                                       "compute_multiplier": 1.5, "eval_samples": "auto", "reasoning_effort": "high",
                                       "eval_interval": 5}
    assert request.grader == check("eq") and request.method == "reinforcement"
    assert request.notes == ["reasoning_effort 'high' is ignored: the studio's models have no reasoning-effort "
                             "setting; each completion is up to grpo.max_completion_length tokens (studio.grpo)"]
    request, cfg = requests.read(body(stored["chat"].id, check("eq", "{{item.answer}}")))  # auto: 1 prompt a step
    assert (cfg.batch_size, cfg.method_settings.num_generations, request.hyperparameters["batch_size"]) == (4, 4, 1)
    assert request.notes == [] and request.hyperparameters["reasoning_effort"] == "default"


@pytest.mark.parametrize("change, param, fix", [
    ({"hyper": {"compute_multiplier": 0}}, "method.reinforcement.hyperparameters.compute_multiplier", "over 0"),
    ({"hyper": {"compute_multiplier": 11}}, "method.reinforcement.hyperparameters.compute_multiplier", "at most 10"),
    ({"hyper": {"eval_interval": 0}}, "method.reinforcement.hyperparameters.eval_interval", "from 1 to"),
    ({"hyper": {"eval_samples": 4}}, "method.reinforcement.hyperparameters.eval_samples", "leave it \"auto\""),
    ({"hyper": {"reasoning_effort": "max"}}, "method.reinforcement.hyperparameters.reasoning_effort", "one of"),
    ({"hyper": {"beta": 0.1}}, "method.reinforcement.hyperparameters.beta", "is a dpo hyperparameter"),
    ({"hyper": {"batch_size": 0}}, "hyperparameters.batch_size", "at least 1"),
    ({"hyper": {"compute_multiplier": 2}, "studio": {"grpo": {"num_generations": 2}}},
     "method.reinforcement.hyperparameters.compute_multiplier", "both set it"),
    ({"hyper": {"eval_interval": 3}, "studio": {"eval_steps": 2}}, "method.reinforcement.hyperparameters.eval_interval",
     "both set it"),
    ({"studio": {"grpo": {"rewards": ["length"]}}}, "studio.grpo.rewards", "set by method.reinforcement.grader"),
    ({"grader": check("eq", "{{item.city}}")}, "method.reinforcement.grader.reference",
     "names the field 'city', which not every row of training_file"),
    ({"file": "pairs"}, "training_file", "holds preference pairs (DPO), but this method trains on prompts"),
    ({"file": "alpaca"}, "training_file", "in the alpaca layout, but this method trains on prompts"),
    ({"section": {"grader": check("eq"), "response_format": {}}}, "method.reinforcement.response_format",
     "takes grader and hyperparameters"),
    ({"section": {}}, "method.reinforcement.grader", "grader is required"),
])
def test_a_reinforcement_request_is_refused_naming_the_parameter(stored, change, param, fix):
    request = body(stored[change.get("file", "prompts")].id, change.get("grader"), change.get("hyper"))
    if "studio" in change:
        request["studio"] = change["studio"]
    if "section" in change:
        request["method"]["reinforcement"] = change["section"]
    error = refused(lambda: requests.read(request))
    assert error["param"] == param and fix in error["message"], error


def test_a_grpo_setting_the_run_refuses_is_named_as_the_request_set_it(stored):
    request, cfg = requests.read(body(stored["prompts"].id, studio={"grpo": {"max_completion_length": 4096}}))
    error = requests.config_error(ConfigError(cfg.validate()), studio=request.studio).body()["error"]
    assert error["param"] == "studio.grpo.max_completion_length" and "max_seq_length 512" in error["message"]


def test_reinforcement_hyperparameters_belong_to_reinforcement(stored):
    error = refused(lambda: requests.read({"model": "SmolLM2-135M-Instruct", "training_file": stored["chat"].id,
                                           "hyperparameters": {"compute_multiplier": 2}}))
    assert error["param"] == "hyperparameters.compute_multiplier"
    assert error["message"] == "compute_multiplier is a reinforcement hyperparameter"


def test_a_continued_model_starts_from_its_adapter(stored, home):
    adapter = home / "runs" / "run-1" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
                                                             "task_type": "CAUSAL_LM"}))
    start = requests.StartPoint("bundled:SmolLM2-135M-Instruct", "bundled:SmolLM2-135M-Instruct",
                                {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "target_modules": ["q_proj"],
                                 "use_rslora": False, "init_adapter": str(adapter)})
    name = "ft:smollm2-135m-instruct::ftjob-run-1"
    request, cfg = requests.read({"model": name, "training_file": stored["chat"].id}, start)
    assert (cfg.model_name, cfg.init_adapter, cfg.lora_r, cfg.lora_alpha, cfg.target_modules) == (
        "bundled:SmolLM2-135M-Instruct", str(adapter), 8, 16, ["q_proj"])
    assert request.model == name and cfg.validate() == []
    request, cfg = requests.read({"model": name, "training_file": stored["chat"].id, "studio": {"lora_r": 32}}, start)
    error = requests.config_error(ConfigError(cfg.validate()), studio=request.studio).body()["error"]
    assert error["param"] == "studio.lora_r" and error["message"] == (
        "studio.lora_r: the adapter in init_adapter has r 8: set lora_r to 8 (it goes on training as it was saved)")
    error = refused(lambda: requests.read({"model": name, "training_file": stored["chat"].id,
                                           "studio": {"init_adapter": str(adapter)}}, start))
    assert error["param"] == "studio.init_adapter" and "set by model" in error["message"]
    error = refused(lambda: requests.read({"model": name, "training_file": stored["chat"].id}))  # not resolved
    assert error["param"] == "model" and error["code"] == "model_not_found"
