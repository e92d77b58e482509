"""Real eval jobs on the bundled model (and lm-eval on the tiny model): the CLI's --json metrics checked against
values computed independently here (rouge-score and sacrebleu called on the same strings, the loss by the
model in a subprocess), predictions.jsonl growing while the job runs (observed up to a Stop between
samples), and an lm-evaluation-harness task defined locally. Slow: each loads a model in a worker."""
from __future__ import annotations

import json
import math
import textwrap

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from db.store import Store
from tests.support import MODELS_CACHE, run_python, wait_until
from tests.support.factories import insert_finished_run
from trainer_core.__main__ import main as cli
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobs import evals
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.subprocess


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Workers and the loss subprocess on one torch thread: two OpenMP threads stall whenever another process
    holds a core, which made a sample 5-8x slower on the shared test machine (docs/evaluation.md)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

QUESTIONS = [("What is the capital of France?", "The capital of France is Paris."),
             ("Name a primary colour.", "Red is a primary colour."),
             ("What is 2 + 2?", "2 + 2 equals 4."),
             ("Say hello.", "Hello!"),
             ("What do bees make?", "Bees make honey."),
             ("What is ice made of?", "Ice is frozen water.")]

# The loss of each reference answer given its prompt, computed here with the model's own loss (labels with the
# prompt masked), independently of the worker's code path.
LOSSES = textwrap.dedent("""
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, pairs = sys.argv[1], json.loads(sys.argv[2])
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for prompt, reference in pairs:
        turns = [{"role": "user", "content": prompt}]
        head = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        full = tok.apply_chat_template(turns + [{"role": "assistant", "content": reference}], tokenize=True,
                                       return_dict=True)["input_ids"]
        assert full[:len(head)] == head
        labels = [-100] * len(head) + full[len(head):]
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([full]), labels=torch.tensor([labels])).loss.item()
        out.append([loss, len(full) - len(head)])
    print(json.dumps(out))
""")


def write_test_file(path, pairs) -> None:
    path.write_text("".join(json.dumps({"instruction": q, "output": a}) + "\n" for q, a in pairs))


def test_cli_json_metrics_match_independent_computations(studio, tmp_path, capsys):
    run_id = "20260101-000000-c1c1c1"
    insert_finished_run(studio.store, run_id, "trained", [1.0, 0.5])
    folder = paths.run_dir(run_id)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(model_name=BUNDLED_MODEL, run_name="trained").to_yaml())
    data = tmp_path / "test.jsonl"
    write_test_file(data, QUESTIONS[:2])

    code = cli(["eval", "trained", "--base", "--data", str(data), "--max-new-tokens", "8", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    printed = json.loads(captured.out.strip().splitlines()[-1])
    assert {"exact", "rouge_l", "bleu", "loss", "perplexity", "samples", "job_id"} <= set(printed)
    assert printed["samples"] == 2 and printed["baseline"] is None  # --base: the base model is the baseline

    predictions = [json.loads(line) for line in evals.predictions_path(printed["job_id"]).read_text().splitlines()]
    assert [(p["prompt"], p["reference"]) for p in predictions] == QUESTIONS[:2]
    answers, references = [p["answer"] for p in predictions], [p["reference"] for p in predictions]
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    for p in predictions:
        assert p["rouge_l"] == pytest.approx(scorer.score(p["reference"], p["answer"])["rougeL"].fmeasure)
        assert p["bleu"] == pytest.approx(sacrebleu.sentence_bleu(p["answer"], [p["reference"]]).score)
        assert p["exact"] == float(" ".join(p["answer"].split()) == " ".join(p["reference"].split()))
    assert printed["bleu"] == pytest.approx(sacrebleu.corpus_bleu(answers, [references]).score)
    assert printed["rouge_l"] == pytest.approx(sum(p["rouge_l"] for p in predictions) / 2)

    result = run_python(LOSSES, str(MODELS_CACHE / "SmolLM2-135M-Instruct"), json.dumps(QUESTIONS[:2]))
    assert result.returncode == 0, result.stderr[-2000:]
    expected = json.loads(result.stdout.strip().splitlines()[-1])
    for p, (loss, tokens) in zip(predictions, expected):
        assert (p["loss"], p["tokens"]) == (pytest.approx(loss, rel=1e-4), tokens)
    mean_nll = sum(loss * tokens for loss, tokens in expected) / sum(tokens for _, tokens in expected)
    assert printed["perplexity"] == pytest.approx(math.exp(mean_nll), rel=1e-4)
    stored = Store().eval_result(printed["job_id"])
    assert stored.metrics["perplexity"] == printed["perplexity"] and stored.status is RunStatus.COMPLETED


def test_predictions_grow_while_the_eval_runs_and_stop_keeps_them(studio, tmp_path):
    data = tmp_path / "test.jsonl"
    write_test_file(data, QUESTIONS)
    job_id, baseline = studio.start_eval(EvalSpec(source=ModelSource(model=BUNDLED_MODEL), data=str(data),
                                                  max_new_tokens=8, batch_size=1, metrics=["exact", "rouge"]))
    assert baseline is None
    lines = lambda: evals.read_predictions(job_id)  # noqa: E731
    # Stop as soon as the first prediction is on disk: the worker ends before the next sample is scored.
    wait_until(lambda: len(lines()) >= 1, timeout=300, what="the first prediction")
    first = len(lines())
    assert not studio.get_run(job_id).status.is_terminal()  # the file grew while the job was still running
    studio.stop(job_id)
    snap = studio.wait(job_id, timeout=300)
    assert snap.status is RunStatus.STOPPED, snap.error
    final = lines()
    assert first <= len(final) < len(QUESTIONS)
    assert [p["index"] for p in final] == list(range(len(final)))
    result = studio.eval_result(job_id)
    assert result.metrics["partial"] is True and result.metrics["samples"] == len(final)
    assert studio.eval_samples(job_id)["answer"].tolist() == [p["answer"] for p in final]
    assert json.loads((paths.run_dir(job_id) / "results.json").read_text())["metrics"] == result.metrics


TASK = """\
task: tiny_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_lm_eval_runs_a_local_task_offline(studio, tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = tmp_path / "tiny_qa.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in [
        {"question": "What color is a clear sky?", "choices": ["blue", "green"], "answer": 0},
        {"question": "How many legs does a cat have?", "choices": ["three", "four"], "answer": 1},
        {"question": "Which is a fruit?", "choices": ["apple", "chair"], "answer": 0}]))
    task = tmp_path / "tiny_qa.yaml"
    task.write_text(TASK.format(data=rows))
    job_id, _ = studio.start_eval(EvalSpec(source=ModelSource(model=str(tiny_model)), data="",
                                           lm_eval_tasks=[str(task)]))
    snap = studio.wait(job_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id)}"
    scores = studio.eval_result(job_id).metrics["lm_eval"]["tiny_qa"]
    assert scores["acc,none"] in (0.0, 1 / 3, 2 / 3, 1.0) and "acc_stderr,none" in scores
