"""The eval metrics of preference and RL runs (issue 19): ``preference_accuracy`` on held-out pairs and
``reward`` (a GRPO run's reward functions on the eval's greedy answers), each against the base model's baseline.

Fast: the spec's validation table (pairs data for preference_accuracy, a grpo run for reward, every problem named
with its field and fix) and how test rows are read for each. Slow (real workers through the orchestrator, the tiny
model): preference_accuracy of a base model checked against log-probs computed here in a subprocess, and a 2-step
GRPO run of the tiny model evaluated with its rewards — the reward equals the length reward recomputed here on the
stored greedy answers, its baseline is scored with the same rewards, its adapter's preference accuracy is the
implicit reward against the base (the adapter disabled), and a reward that raises is a warning, not a failure."""
from __future__ import annotations

import json
import textwrap
import time

import pytest

from db.store import Store
from tests.evaluation.test_eval_pages import BASE_KEY, add_eval, samples_table
from tests.support import run_python
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.methods.grpo_settings import GRPOSettings
from trainer_core.auth import access
from trainer_core.config import BUNDLED_MODEL, ConfigError, FieldError, TrainConfig
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation.spec import METRICS, EvalSpec
from trainer_core.jobs import evals
from trainer_core.jobs.orchestrator import RunRefused
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from trainer_core.rewards.builtin import length
from ui.evaluation import headline, metric_rows

BASE = ModelSource(model=BUNDLED_MODEL)
PAIRS = [("What is the capital of France?", "Paris.", "The capital of France is Berlin, a city in Spain."),
         ("Name a primary colour.", "Red.", "Purple is a primary colour of the rainbow, like pink."),
         ("What do bees make?", "Honey.", "Bees make cheese and sometimes small pieces of glass.")]
GRPO_REWARDS = [{"type": "length", "target": 3}]


def write_pairs(path, pairs=PAIRS):
    path.write_text("".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in pairs))
    return path


def write_alpaca(path):
    path.write_text("".join(json.dumps({"instruction": p, "output": c}) + "\n" for p, c, _ in PAIRS))
    return path


def write_run(run_id: str, **fields) -> None:
    folder = paths.run_dir(run_id)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name=run_id, **fields).to_yaml())


GRPO_RUN, SFT_RUN, OTHER_GRPO = "20260101-000000-9a9a9a", "20260101-000000-5f5f5f", "20260101-000000-7b7b7b"


@pytest.fixture
def runs(home):
    write_run(GRPO_RUN, method="grpo", method_settings=GRPOSettings(rewards=GRPO_REWARDS))
    write_run(OTHER_GRPO, method="grpo", method_settings=GRPOSettings(rewards=[{"type": "length", "target": 30}]))
    write_run(SFT_RUN)


def metric_errors(spec: EvalSpec) -> list[FieldError]:
    return [e for e in spec.validate() if e.field in ("data", "metrics", "reward_run")]


def test_both_metrics_are_listed():
    assert {"preference_accuracy", "reward"} <= set(METRICS)


@pytest.mark.parametrize("case, values, field, words", [
    ("pairs for preference accuracy", {"metrics": ["preference_accuracy"], "data": "pairs"}, None, ()),
    ("chat data for preference accuracy", {"metrics": ["preference_accuracy"], "data": "alpaca"}, "data",
     ("preference_accuracy needs preference pairs", "prompt/chosen/rejected columns")),
    ("reward without a run", {"metrics": ["reward"], "data": "alpaca"}, "metrics",
     ("GRPO run's reward functions", "evaluate a grpo run", "drop 'reward'")),
    ("reward with an sft run's rewards", {"metrics": ["reward"], "data": "alpaca", "reward_run": SFT_RUN},
     "reward_run", ("needs a run trained with method grpo", "was trained with sft")),
    ("reward with a grpo run's rewards", {"metrics": ["reward"], "data": "alpaca", "reward_run": GRPO_RUN}, None, ()),
    ("reward on pairs", {"metrics": ["reward", "preference_accuracy"], "data": "pairs", "reward_run": GRPO_RUN},
     None, ()),
    ("an unknown metric, as before", {"metrics": ["rewards"], "data": "pairs"}, "metrics",
     ("unknown metric 'rewards'", "preference_accuracy, reward")),
])
def test_validation_table(runs, tmp_path, case, values, field, words):
    data = {"pairs": write_pairs(tmp_path / "pairs.jsonl"), "alpaca": write_alpaca(tmp_path / "alpaca.jsonl")}
    errors = metric_errors(EvalSpec(source=BASE, **{**values, "data": str(data[values["data"]])}))
    if field is None:
        assert errors == [], case
        return
    assert [e.field for e in errors] == [field], (case, errors)
    assert all(w in errors[0].message for w in words), (case, errors[0].message)


def test_reward_on_a_run_names_metrics_and_the_fix(runs):
    # the source is the sft run itself (no saved adapter either: that is the source field's own error)
    errors = EvalSpec(source=ModelSource(run_id=SFT_RUN), data="", lm_eval_tasks=[], metrics=["reward"]).validate()
    assert FieldError("metrics", f"reward needs a run trained with method grpo (its grpo.rewards score the answers); "
                                 f"run {SFT_RUN} was trained with sft: evaluate a grpo run, or drop 'reward' from "
                                 "metrics") in errors


def test_pairs_become_samples_with_both_sides_and_the_chosen_reference(runs, tmp_path):
    spec = EvalSpec(source=BASE, data=str(write_pairs(tmp_path / "pairs.jsonl")), metrics=["preference_accuracy"])
    samples, left_out = eval_samples.load_samples(spec)
    assert left_out is None
    assert [(s.prompt, s.reference, s.chosen, s.rejected) for s in samples] == [
        ([{"role": "user", "content": p}], c, [{"role": "assistant", "content": c}],
         [{"role": "assistant", "content": r}]) for p, c, r in PAIRS]


def test_reward_reads_prompts_with_their_columns_and_chat_rows_too(runs, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "answer": c, "topic": i}) + "\n"
                               for i, (p, c, _) in enumerate(PAIRS)))
    samples, _ = eval_samples.load_samples(EvalSpec(source=BASE, data=str(prompts), metrics=["reward"],
                                                    reward_run=GRPO_RUN))
    assert [(s.prompt[0]["content"], s.reference, s.columns) for s in samples] == [
        (p, c, {"answer": c, "topic": i}) for i, (p, c, _) in enumerate(PAIRS)]
    # alpaca rows (read as chat) become prompts, their answer the "answer" column, as GRPO reads chat rows
    chat, _ = eval_samples.load_samples(EvalSpec(source=BASE, data=str(write_alpaca(tmp_path / "a.jsonl")),
                                                 metrics=["reward", "rouge"], reward_run=GRPO_RUN))
    assert [(s.prompt[-1]["content"], s.reference, s.columns) for s in chat] == [(p, c, {"answer": c})
                                                                               for p, c, _ in PAIRS]


def test_the_baseline_key_follows_the_rewards_not_the_run(runs, tmp_path):
    data = str(write_alpaca(tmp_path / "a.jsonl"))
    same = {run: eval_samples.settings_hash(EvalSpec(source=BASE, data=data, metrics=["reward"], reward_run=run))
            for run in (GRPO_RUN, OTHER_GRPO)}
    write_run("20260101-000000-1c1c1c", method="grpo", method_settings=GRPOSettings(rewards=GRPO_REWARDS))
    twin = eval_samples.settings_hash(EvalSpec(source=BASE, data=data, metrics=["reward"],
                                               reward_run="20260101-000000-1c1c1c"))
    assert same[GRPO_RUN] == twin != same[OTHER_GRPO]


def test_a_python_reward_is_evaluated_by_an_admin_only(runs, tmp_path, monkeypatch):
    reward_file = tmp_path / "mine.py"
    reward_file.write_text("def mine(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    run_id = "20260101-000000-2d2d2d"
    write_run(run_id, method="grpo", method_settings=GRPOSettings(
        rewards=[{"python": str(reward_file), "function": "mine"}]))
    spec = EvalSpec(source=BASE, data=str(write_alpaca(tmp_path / "a.jsonl")), metrics=["reward"], reward_run=run_id)
    operator = access.Actor("op", access.Role.OPERATOR)
    with pytest.raises(ConfigError) as refused:
        evals.submit(None, spec, operator)  # refused before anything is queued (no orchestrator needed)
    assert [e.field for e in refused.value.errors] == ["metrics"]
    assert "only an admin may evaluate with it" in refused.value.errors[0].message


def test_the_python_reward_rule_is_the_specs_so_no_route_around_the_form_skips_it(runs, tmp_path, orch):
    """The rule lived in evals.submit only: a spec handed to the orchestrator another way (a script, a future page)
    ran an operator's eval of a custom Python reward. Now the spec says it needs an admin, and the orchestrator,
    which every job passes, refuses it."""
    reward_file = tmp_path / "mine.py"
    reward_file.write_text("def mine(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    run_id = "20260101-000000-3e3e3e"
    write_run(run_id, method="grpo", method_settings=GRPOSettings(
        rewards=[{"python": str(reward_file), "function": "mine"}]))
    data = str(write_alpaca(tmp_path / "a.jsonl"))
    spec = EvalSpec(source=BASE, data=data, metrics=["reward"], reward_run=run_id)
    assert spec.admin_only() and "custom Python reward" in spec.admin_only()[0]
    with pytest.raises(RunRefused, match="custom Python reward"):
        orch.submit(spec, access.Actor("op", access.Role.OPERATOR))
    assert orch.store.list_runs() == []
    assert EvalSpec(source=BASE, data=data, metrics=["reward"], reward_run=GRPO_RUN).admin_only() == []  # built-ins
    assert orch.submit(spec, access.Actor("root", access.Role.ADMIN))  # an admin may


def test_the_tab_shows_each_metric_with_its_baseline_delta():
    tuned = {"preference_accuracy": 0.75, "preference_margin": 0.5, "reward": -0.2, "reward/length": -0.2,
             "reward/format": 1.0, "preference_implicit_reward": True, "samples": 4}
    base = {"preference_accuracy": 0.5, "preference_margin": 2.0, "reward": -0.7, "reward/length": -0.7}
    rows = metric_rows(tuned, base)
    assert [(r["metric"], r["delta"], r["higher"]) for r in rows] == [
        ("Preference accuracy", 0.25, True), ("Preference margin", -1.5, True),
        ("Reward (weighted total)", pytest.approx(0.5), True), ("Reward: length", pytest.approx(0.5), True),
        ("Reward: format", None, True)]
    assert headline({"reward": -0.25}) == "Reward (weighted total) -0.250"


# ---------------------------------------------------------------------- real eval jobs
@pytest.fixture(autouse=False)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


LOGPS = textwrap.dedent("""
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, pairs = sys.argv[1], json.loads(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    def logp(prompt, answer):
        turns = [{"role": "user", "content": prompt}]
        head = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        full = tok.apply_chat_template(turns + [{"role": "assistant", "content": answer}], tokenize=True,
                                       return_dict=True)["input_ids"]
        assert full[:len(head)] == head
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([full])).logits[0].float()
        logprobs = torch.log_softmax(logits[:-1], -1)
        return sum(logprobs[i - 1, full[i]].item() for i in range(len(head), len(full)))
    print(json.dumps([[logp(p, c), logp(p, r)] for p, c, r in pairs]))
""")


@pytest.mark.train
@pytest.mark.subprocess
def test_preference_accuracy_of_a_base_model_is_its_log_prob_margin(studio, tiny_model, tmp_path, one_thread):
    data = write_pairs(tmp_path / "pairs.jsonl")
    spec = EvalSpec(source=ModelSource(model=str(tiny_model)), data=str(data), metrics=["preference_accuracy"])
    job_id, baseline_id = studio.start_eval(spec)
    assert baseline_id is None  # a base model is its own baseline
    snap = studio.wait(job_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id, 60)}"
    predictions = [json.loads(line) for line in evals.predictions_path(job_id).read_text().splitlines()]
    assert [p["index"] for p in predictions] == [0, 1, 2]
    assert all(p["answer"] == "" for p in predictions)  # nothing to generate for this metric
    assert all("ref_logp_chosen" not in p for p in predictions)  # no reference: the plain log-prob margin

    expected = run_python(LOGPS, str(tiny_model), json.dumps(PAIRS))
    assert expected.returncode == 0, expected.stderr[-3000:]
    logps = json.loads(expected.stdout.strip().splitlines()[-1])
    for p, (chosen, rejected) in zip(predictions, logps):
        assert p["logp_chosen"] == pytest.approx(chosen, abs=1e-3)
        assert p["logp_rejected"] == pytest.approx(rejected, abs=1e-3)
        assert p["margin"] == pytest.approx(chosen - rejected, abs=2e-3)
        assert p["preferred"] == (1.0 if chosen > rejected else 0.0)
    metrics = studio.eval_result(job_id).metrics
    assert 0 <= metrics["preference_accuracy"] <= 1
    assert metrics["preference_accuracy"] == pytest.approx(sum(p["preferred"] for p in predictions) / 3)
    assert metrics["preference_margin"] == pytest.approx(sum(p["margin"] for p in predictions) / 3)
    assert metrics["preference_implicit_reward"] is False and metrics["samples"] == 3


PICKY = textwrap.dedent("""
    def picky(prompts, completions, boom=None, **kwargs):
        if boom and any(boom):
            raise ValueError("boom column set")
        return [0.0 for _ in completions]
""")


@pytest.mark.train
@pytest.mark.subprocess
def test_reward_of_a_grpo_run_and_its_baseline(studio, tiny_model, tmp_path, one_thread):
    reward_file = tmp_path / "picky.py"
    reward_file.write_text(PICKY)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": p}) + "\n" for p, _, _ in PAIRS * 2))
    cfg = TrainConfig(run_name="grpo eval", model_name=str(tiny_model), method="grpo", max_steps=2, batch_size=2,
                      max_seq_length=128, warmup_steps=0, logging_steps=1, save_steps=0, learning_rate=1e-3,
                      local_datasets=[str(train)], eval_fraction=0.0,
                      method_settings=GRPOSettings(
                          num_generations=2, max_completion_length=8, max_prompt_length=96, sample_every=0,
                          rewards=[*GRPO_REWARDS, {"python": str(reward_file), "function": "picky"}]))
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 60)}"

    # reward and preference accuracy on held-out pairs (their prompts are the prompts to answer), with a baseline.
    # The random tiny model's greedy answer is newlines only (stripped: empty); a repetition penalty gives words.
    spec = EvalSpec(source=ModelSource(run_id=run_id), data=str(write_pairs(tmp_path / "pairs.jsonl")),
                    metrics=["reward", "preference_accuracy"], max_new_tokens=8, repetition_penalty=2.0)
    job_id, baseline_id = studio.start_eval(spec)
    assert baseline_id is not None
    for job in (job_id, baseline_id):
        snap = studio.wait(job, timeout=300)
        assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job, 60)}"
    for job, implicit in ((job_id, True), (baseline_id, False)):
        predictions = [json.loads(line) for line in evals.predictions_path(job).read_text().splitlines()]
        answers = [p["answer"] for p in predictions]
        assert len(answers) == 3 and all(answers), answers
        expected = length([p["prompt"] for p in predictions], answers, target=GRPO_REWARDS[0]["target"])
        metrics = studio.eval_result(job).metrics
        print(f"{'tuned' if implicit else 'base'}: answers {answers}, length rewards {expected}, metrics {metrics}")
        # the weighted total is length (weight 1) + picky (weight 1, always 0 here)
        assert metrics["reward"] == pytest.approx(sum(expected) / 3), (job, answers)
        assert metrics["reward/length"] == pytest.approx(sum(expected) / 3)
        assert metrics["reward/picky"] == 0.0
        assert [p["rewards"]["length"] for p in predictions] == pytest.approx(expected)
        assert 0 <= metrics["preference_accuracy"] <= 1 and metrics["preference_implicit_reward"] is implicit
        for p in predictions:
            assert p["preferred"] in (0.0, 1.0)
            if implicit:  # the adapter's log-probs minus the base's (the same model, adapter disabled)
                want = (p["logp_chosen"] - p["ref_logp_chosen"]) - (p["logp_rejected"] - p["ref_logp_rejected"])
                assert p["margin"] == pytest.approx(want, abs=1e-4)
            else:
                assert "ref_logp_chosen" not in p
    assert studio.eval_baseline(studio.eval_result(job_id)).job_id == baseline_id

    # a reward that raises: its metric and the total are missing, with a warning naming it; the eval completes
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "boom": i == 2}) + "\n" for i, (p, _, _) in enumerate(PAIRS)))
    spec = EvalSpec(source=ModelSource(run_id=run_id), data=str(prompts), metrics=["reward"], max_new_tokens=4,
                    baseline=False)
    job_id, _ = studio.start_eval(spec)
    snap = studio.wait(job_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id, 60)}"
    metrics = studio.eval_result(job_id).metrics
    assert "reward" not in metrics and "reward/picky" not in metrics and "reward/length" in metrics
    warnings = [e.message for e in studio.events(job_id) if e.kind == "warning"]
    assert any("Reward picky raised (ValueError: boom column set)" in w for w in warnings), warnings


def test_the_tab_shows_preference_and_reward_scores_per_sample_from_the_predictions(app_home):
    store = Store()
    insert_finished_run(store, "run-g", "grpo run", [1.0, 0.5])
    add_eval(store, "eval-base", BASE_KEY, "", {"samples": 2, "preference_accuracy": 0.5, "reward": -1.0},
             created=time.time() - 100)
    lines = [{"index": 0, "prompt": "q0", "reference": "a0", "answer": "one two", "preferred": 1.0, "margin": 0.4,
              "reward": -0.5, "rewards": {"length": -0.5}},
             {"index": 1, "prompt": "q1", "reference": "a1", "answer": "three", "preferred": 0.0, "margin": -0.2,
              "reward": 0.0, "rewards": {"length": 0.0}}]
    add_eval(store, "eval-g", "run:run-g", "run-g", {"samples": 2, "preference_accuracy": 0.5, "reward": -0.25,
                                                     "reward/length": -0.25, "preference_implicit_reward": True},
             [{k: v for k, v in line.items() if k in ("index", "prompt", "reference", "answer")} for line in lines])
    folder = paths.run_dir("eval-g")
    folder.mkdir(parents=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    at = open_page("pages/run.py", detail_run_id="run-g")
    shown = {m.label: (m.value, m.proto.delta) for m in at.metric}
    assert shown["Preference accuracy"] == ("0.5", "+0.0000")
    assert shown["Reward (weighted total)"] == ("-0.25", "+0.7500")  # against the base model's reward
    assert shown["Reward: length"][0] == "-0.25"
    table = samples_table(at)
    assert table.sort_values("index")[["preferred", "margin", "reward"]].values.tolist() == [[1.0, 0.4, -0.5],
                                                                                         [0.0, -0.2, 0.0]]


def test_a_dpo_runs_eval_split_gives_pairs_whose_chosen_answer_is_the_reference(runs, tmp_path):
    data = write_pairs(tmp_path / "train_pairs.jsonl", PAIRS * 4)
    run_id = "20260101-000000-3e3e3e"
    write_run(run_id, method="dpo", local_datasets=[str(data)], eval_fraction=0.25)
    for metrics in (["rouge"], ["preference_accuracy"]):
        samples, _ = eval_samples.load_samples(EvalSpec(source=BASE, data=f"eval_split:{run_id}", metrics=metrics))
        assert len(samples) == 3 and all(s.reference == s.chosen[0]["content"] for s in samples), metrics
        assert {s.reference for s in samples} <= {c for _, c, _ in PAIRS}
