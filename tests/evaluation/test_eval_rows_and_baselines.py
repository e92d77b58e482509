"""What an eval job scores and compares: hub:<id> is a hub dataset id and nothing on disk, test files stay under the
allowed folders, rows without an answer are reported with count and reason, an eval where no row fits is a failure
with the fix, a baseline is reused and compared only on the rows it scored, the CLI cancels the baseline it queued,
Stop while the model loads is Stopped, and a predictions file deleted mid-run is noticed."""
from __future__ import annotations

import json
import signal
import time
from types import SimpleNamespace

import pytest

from db.entities import RunRecord
from db.store import Store
from trainer_core.specs import jobspec
from trainer_core.config import BUNDLED_MODEL, FieldError
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation.samples import Sample
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobs import evals
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.worker import evaluate
from trainer_core.worker.evaluate import Evaluator, NothingToScore, Predictions

BASE = ModelSource(model=BUNDLED_MODEL)
# ====================================================================== hub:<id> is a hub id
@pytest.mark.parametrize("data, message", [
    ("hub:/etc", "a hub dataset id looks like org/name"),
    ("hub:.", "a hub dataset id looks like org/name"),
    ("hub:../../x", "a hub dataset id looks like org/name"),
    ("hub:owner/..", "a hub dataset id looks like org/name"),
    ("hub:owner/.", "a hub dataset id looks like org/name"),
    ("hub:json", "'json' is a builtin loader of the datasets library, not a hub dataset: give your file or folder "
                 "as data, without hub:, instead"),
    ("hub:parquet", "'parquet' is a builtin loader of the datasets library, not a hub dataset: give your file or "
                    "folder as data, without hub:, instead"),
    ("hub:imagefolder", "'imagefolder' is a builtin loader of the datasets library, not a hub dataset: give your "
                        "file or folder as data, without hub:, instead"),
])
def test_hub_data_must_be_a_hub_dataset_id(home, data, message):
    assert [e for e in EvalSpec(source=BASE, data=data).validate() if e.field == "data"] == [FieldError("data", message)]
    with pytest.raises(eval_samples.DatasetError, match="hub"):  # the worker checks again before reading
        eval_samples.load_rows(EvalSpec(source=BASE, data=data))


def test_a_local_folder_given_as_a_hub_id_is_refused(home, tmp_path, monkeypatch):
    (tmp_path / "outside").mkdir()
    monkeypatch.chdir(tmp_path)  # a relative name datasets would read from the working folder
    assert [e.message for e in EvalSpec(source=BASE, data="hub:outside").validate() if e.field == "data"] == [
        "'outside' is a local file or folder, not a hub dataset: give the path as data, without hub:, instead"]
    assert [e for e in EvalSpec(source=BASE, data="hub:tatsu-lab/alpaca").validate() if e.field == "data"] == []


def test_a_test_file_linked_from_outside_the_allowed_folders_is_refused(home, tmp_path_factory, tmp_path):
    outside = tmp_path_factory.mktemp("outside") / "secret.jsonl"
    outside.write_text(json.dumps({"instruction": "q", "output": "a"}) + "\n")
    (tmp_path / "link.jsonl").symlink_to(outside)
    errors = [e for e in EvalSpec(source=BASE, data=str(tmp_path / "link.jsonl")).validate() if e.field == "data"]
    assert len(errors) == 1 and "outside the allowed folders" in errors[0].message


# ====================================================================== dropped rows are said
def test_rows_without_an_answer_are_reported_with_count_and_reason(home, tmp_path):
    rows = [{"instruction": "Add 2 and 3.", "output": "5"}, {"instruction": "Name a colour."},
            {"instruction": "Say hi", "output": "Hello"}, {"instruction": "Count", "input": "1 2"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples, warning = eval_samples.load_samples(EvalSpec(source=BASE, data=str(tmp_path / "t.jsonl")))
    assert [s.reference for s in samples] == ["5", "Hello"]
    assert warning == "Left out 2 of 4 test rows: missing output: 2"
    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    _, warning = eval_samples.load_samples(EvalSpec(source=BASE, data=str(tmp_path / "c.jsonl")))
    assert warning == "Left out 1 of 2 test rows: no assistant turn: 1"


# ====================================================================== 0 samples, same rows
class WordTokenizer:
    """One token per word of every turn, plus two for the generation prompt."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False, **_):
        ids = list(range(sum(len(m["content"].split()) for m in messages) + 2))
        return {"input_ids": ids} if return_dict else ids


def test_an_eval_where_no_row_fits_the_context_fails_with_the_fix(tmp_path):
    worker = Evaluator(tmp_path)
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=20))
    rows = [Sample(0, [{"role": "user", "content": "word " * 30}], "a")]
    with pytest.raises(NothingToScore) as raised:
        worker.fitting(rows, model, WordTokenizer(), EvalSpec(max_new_tokens=16))
    worker.events.close()
    assert str(raised.value) == ("none of the 1 test row(s) fits the model's context of 20 tokens with max_new_tokens "
                                 "16: shorten the rows, lower max_new_tokens, or evaluate a model with a longer "
                                 "context")


def add_eval(store: Store, job_id: str, source_key: str, metrics: dict | None, indices=(),
             status: RunStatus = RunStatus.COMPLETED) -> None:
    store.create_run(RunRecord(id=job_id, name=job_id, kind=JobKind.EVAL, status=RunStatus.QUEUED, model=source_key,
                               method="Evaluation", created_at=time.time()))
    store.save_eval_result(job_id, source_key=source_key, source_run_id="", base_model=BUNDLED_MODEL,
                           data_fingerprint="fp", settings_hash="sh", data_label="t.jsonl", metrics=metrics,
                           created_at=time.time())
    for index in indices:
        store.save_eval_sample(job_id, index, prompt="p", reference="r", answer="a")
    if status.is_terminal():
        store.finish_run(job_id, status)
    elif status is not RunStatus.QUEUED:
        store.update_run(job_id, status=status.value)


BASE_KEY = f"base:{BUNDLED_MODEL}"


@pytest.mark.parametrize("metrics, status, reusable", [
    ({"samples": 3, "partial": False}, RunStatus.COMPLETED, True),
    ({"samples": 0, "partial": False}, RunStatus.COMPLETED, False),  # from before 0 samples was a failure
    ({"partial": False}, RunStatus.COMPLETED, False),
    (None, RunStatus.QUEUED, True), (None, RunStatus.STARTING, True), (None, RunStatus.RUNNING, True),
    (None, RunStatus.STOPPING, False)])  # it ends stopped or cancelled, which never counts
def test_which_baselines_are_reused(home, metrics, status, reusable):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, metrics, status=status)
    assert evals.reusable(store.find_eval(BASE_KEY, "fp", "sh")) is reusable


def test_a_baseline_is_compared_only_on_the_rows_it_scored(home):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, {"samples": 2, "exact": 0.5}, indices=[0, 2])
    add_eval(store, "eval-same", "run:r", {"samples": 2, "exact": 1.0}, indices=[0, 2])
    add_eval(store, "eval-other", "run:r", {"samples": 2, "exact": 1.0}, indices=[0, 1])
    add_eval(store, "eval-more", "run:r", {"samples": 3, "exact": 1.0}, indices=[0, 1, 2])
    assert evals.baseline_of(store, store.eval_result("eval-same")).job_id == "base-1"
    assert evals.baseline_of(store, store.eval_result("eval-other")) is None
    assert evals.baseline_of(store, store.eval_result("eval-more")) is None


# ====================================================================== Ctrl-C cancels what it started
class CancellingOrch:
    """What ``evals.cancel`` uses of the orchestrator: its store and cancel (a queued job is removed)."""

    def __init__(self, store: Store):
        self.store = store

    def cancel(self, job_id, actor=None):
        self.store.finish_run(job_id, RunStatus.CANCELLED)


def test_cancelling_an_eval_cancels_the_baseline_it_queued(home):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, None, status=RunStatus.RUNNING)
    add_eval(store, "eval-1", "run:r", None, status=RunStatus.QUEUED)
    assert evals.cancel(CancellingOrch(store), evals.Started("eval-1", "base-1", True), None) == ["eval-1", "base-1"]
    assert [store.get_run(j).status for j in ("eval-1", "base-1")] == [RunStatus.CANCELLED] * 2


def test_a_baseline_another_eval_waits_for_or_not_ours_stays(home):
    store = Store()
    add_eval(store, "base-1", BASE_KEY, None, status=RunStatus.RUNNING)
    add_eval(store, "eval-1", "run:r", None, status=RunStatus.QUEUED)
    add_eval(store, "eval-2", "run:r2", None, status=RunStatus.QUEUED)  # submitted later, found base-1: waits for it
    assert evals.cancel(CancellingOrch(store), evals.Started("eval-1", "base-1", True), None) == ["eval-1"]
    assert store.get_run("base-1").status is RunStatus.RUNNING
    add_eval(store, "eval-3", "run:r3", None, status=RunStatus.QUEUED)
    assert evals.cancel(CancellingOrch(store), evals.Started("eval-3", "base-1", False), None) == ["eval-3"]
    assert store.get_run("base-1").status is RunStatus.RUNNING


# ======================================================================  truths
def test_the_cli_prints_the_rows_evaluated_and_the_baselines_progress(capsys):
    from trainer_core.cli import evaluate as cli

    def snap(status, step=0, total=200):
        return SimpleNamespace(status=status, step=step, total_steps=total, error="")

    class Orch:
        def snapshot(self, job_id):
            return snap(RunStatus.RUNNING, 4, 10)

        def wait(self, job_id, on_tick):
            for s in (snap(RunStatus.QUEUED), snap(RunStatus.STARTING), snap(RunStatus.RUNNING, 0, 200),
                      snap(RunStatus.RUNNING, 1, 3), snap(RunStatus.RUNNING, 1, 3), snap(RunStatus.RUNNING, 3, 3)):
                on_tick(s)
            return snap(RunStatus.FAILED)

        def eval_result(self, job_id):
            return None

    before = signal.getsignal(signal.SIGINT)
    assert cli._follow(Orch(), evals.Started("e", "b", True), None, False) == 1
    assert capsys.readouterr().err.splitlines() == ["baseline: 4/10 samples", "1/3 samples", "3/3 samples",
                                                    "eval failed"]
    # its Ctrl-C handler is put back: left installed, it answered a later test's SIGINT with this eval's cancel
    assert signal.getsignal(signal.SIGINT) is before


def run_worker_until_loaded(tmp_path, monkeypatch, action: control.Action) -> list:
    tmp_path.mkdir()
    (tmp_path / "t.jsonl").write_text(json.dumps({"instruction": "q", "output": "a"}) + "\n")
    folder = tmp_path / "job"
    folder.mkdir()
    jobspec.write_spec(folder, EvalSpec(source=BASE, data=str(tmp_path / "t.jsonl")))
    write_kind(folder, JobKind.EVAL)

    def load(self, resolved):
        control.request(folder, action)  # the request arrives while the model loads
        return SimpleNamespace(config=SimpleNamespace()), WordTokenizer(), "cpu"

    monkeypatch.setattr(Evaluator, "begin", lambda self: None)  # no SIGTERM handler in the test process
    monkeypatch.setattr(Evaluator, "load", load)
    monkeypatch.setattr(evaluate.model_source, "resolve", lambda source: SimpleNamespace(label="m", base_model="m"))
    assert Evaluator(folder).run() == 0
    events, _ = ev.read_new(folder / ev.LOG_NAME, 0)
    return events


def test_stop_while_the_model_loads_is_stopped_and_cancel_is_cancelled(home, tmp_path, monkeypatch):
    stopped = run_worker_until_loaded(tmp_path / "a", monkeypatch, control.Action.STOP)
    assert [e.status for e in stopped if e.kind == "complete"] == ["stopped"]
    cancelled = run_worker_until_loaded(tmp_path / "b", monkeypatch, control.Action.CANCEL)
    assert [e.status for e in cancelled if e.kind == "complete"] == ["cancelled"]


def test_a_predictions_file_deleted_mid_run_is_noticed(tmp_path):
    warnings = []
    path = tmp_path / "predictions.jsonl"
    with Predictions(path, warnings.append) as out:
        out.write('{"index": 0}\n', 0)
        path.unlink()
        out.write('{"index": 1}\n', 1)
        out.write('{"index": 2}\n', 2)
    assert warnings == ["predictions.jsonl was deleted or replaced while the eval ran: started it again; the 1 "
                        "sample(s) scored before are in the job's events and the Evaluation tab, not in the new file"]
    assert path.read_text() == '{"index": 1}\n{"index": 2}\n'
