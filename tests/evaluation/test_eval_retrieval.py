"""The ``retrieval`` eval metric (issue 21): an embedding model's InformationRetrievalEvaluator scores on a BEIR-like
folder or a pairs file, with the base model as the baseline. Validation names the field and the fix; the end-to-end
test trains the bundled all-MiniLM-L6-v2 on invented jargon (tests/support/data_rows.py: jargon; the base model
cannot know the words) through the orchestrator, evaluates the run through the CLI and checks the tuned model beats
its base-model baseline on held-out queries, with a row per query and the Evaluation tab's deltas."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from db.store import Store
from tests.evaluation.test_eval_pages import BASE_KEY, add_eval, samples_table
from tests.support.data_rows import jargon
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.methods.embedding import EmbeddingSettings
from trainer_core.__main__ import main as cli
from trainer_core.config import BUNDLED_MODEL as CHAT_MODEL
from trainer_core.config import FieldError, TrainConfig
from trainer_core.data import DatasetError, embedding_pairs
from trainer_core.evaluation import retrieval
from trainer_core.evaluation import samples as eval_samples
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.jobs import evals
from trainer_core.specs.model_source import ModelSource
from trainer_core.methods.embedding import BUNDLED_MODEL
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from ui.evaluation import metric_rows, worst_first

EMBEDDING = ModelSource(model=BUNDLED_MODEL)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def beir_folder(folder: Path, qrels: str = "qrels/test.tsv") -> Path:
    folder.mkdir(parents=True)
    write_jsonl(folder / "corpus.jsonl", [{"_id": "d1", "title": "Bread", "text": "A valve for dough."},
                                          {"_id": "d2", "text": "A tax on violins."},
                                          {"_id": "d3", "text": "A knot for canoes."}])
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "dough valve?"}, {"_id": "q2", "text": "violin tax?"},
                                           {"_id": "q3", "text": "no judgement names me"}])
    (folder / qrels).parent.mkdir(parents=True, exist_ok=True)
    (folder / qrels).write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq2\td3\t0\n")
    return folder


def embedding_run(run_id: str, **values) -> str:
    """A finished embedding run's folder: its config and a saved model folder (what resolve() looks for)."""
    folder = paths.run_dir(run_id)
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text("{}")
    cfg = TrainConfig(**{"run_name": "retriever", "method": "embedding", "adapter": "full",
                         "model_name": BUNDLED_MODEL, **values})
    (folder / "config.yaml").write_text(cfg.to_yaml())
    return run_id


def test_a_beir_folder_and_a_pairs_file_become_the_retrieval_set_training_reads(home, tmp_path):
    folder = beir_folder(tmp_path / "beir")
    ir = retrieval.load_set(EvalSpec(source=EMBEDDING, data=str(folder), metrics=["retrieval"]))
    # read_beir: a title joins its text, non-positive judgements and queries without one are left out
    assert ir.corpus == {"d1": "Bread A valve for dough.", "d2": "A tax on violins.", "d3": "A knot for canoes."}
    assert ir.queries == {"q1": "dough valve?", "q2": "violin tax?"} and ir.relevant == {"q1": {"d1"}, "q2": {"d2"}}

    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"q": "a?", "doc": "A."}, {"q": "b?", "doc": "B."},
                                                   {"q": "c?", "doc": "A."}])
    spec = EvalSpec(source=EMBEDDING, data=pairs, metrics=["retrieval"], custom_format_mapping={"anchor": "q",
                                                                                                 "positive": "doc"})
    ir = retrieval.load_set(spec)
    assert ir.queries == {"q0": "a?", "q1": "b?", "q2": "c?"} and ir.corpus == {"d0": "A.", "d1": "B."}
    assert ir.relevant == {"q0": {"d0"}, "q1": {"d1"}, "q2": {"d0"}}
    assert retrieval.capped(ir, 2).queries == {"q0": "a?", "q1": "b?"} and retrieval.capped(ir, 2).corpus == ir.corpus
    # the fingerprint is the set's: the same pairs under other column names are the same test data
    renamed = write_jsonl(tmp_path / "renamed.jsonl", [{"anchor": "a?", "positive": "A."}, {"anchor": "b?", "positive": "B."},
                                                       {"anchor": "c?", "positive": "A."}])
    same = EvalSpec(source=EMBEDDING, data=renamed, metrics=["retrieval"])
    assert eval_samples.fingerprint(same) == eval_samples.fingerprint(spec)
    # prompts change an embedding model's scores, so they key the cached baseline
    assert eval_samples.settings_hash(same) != eval_samples.settings_hash(EvalSpec(
        source=EMBEDDING, data=renamed, metrics=["retrieval"], query_prompt="query: "))
    assert retrieval.first_rank(["d3", "d1", "d2"], {"d2", "d1"}) == 2 and retrieval.first_rank(["d3"], {"d1"}) is None


def test_retrieval_is_refused_for_a_text_model_and_text_metrics_for_an_embedding_model(home, tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"anchor": "a?", "positive": "A."}, {"anchor": "b?", "positive": "B."}])
    assert EvalSpec(source=EMBEDDING, data=pairs, metrics=["retrieval"]).validate() == []
    assert EvalSpec(source=ModelSource(model=CHAT_MODEL), data=pairs, metrics=["retrieval"]).validate() == [
        FieldError("metrics", f"retrieval scores an embedding model, and {CHAT_MODEL} is not one: evaluate a run "
                              "trained with method embedding (or a sentence-transformers base model such as the "
                              "bundled all-MiniLM-L6-v2), or drop 'retrieval'")]
    run = embedding_run("20260101-000000-e1e1e1")
    text = EvalSpec(source=ModelSource(run_id=run), data=pairs, metrics=["rouge", "exact"]).validate()
    assert text[0] == FieldError("metrics", f"run {run} (method embedding) is an embedding model: it generates no "
                                            "text, so rouge, exact cannot score it; choose metrics [retrieval]")
    tasks = EvalSpec(source=ModelSource(run_id=run), data=pairs, metrics=["retrieval"], lm_eval_tasks=["hellaswag"])
    assert [e.field for e in tasks.validate()] == ["lm_eval_tasks"]

    folder = tmp_path / "my-embedder"  # a sentence-transformers folder as a base model
    folder.mkdir()
    (folder / "modules.json").write_text("[]")
    assert retrieval.is_embedding_model(str(folder)) is True
    first = EvalSpec(source=ModelSource(model=str(folder)), data=pairs, metrics=["exact"]).validate()[0]
    assert first.field == "metrics" and first.message.endswith("cannot score it; choose metrics [retrieval]")

    sft = paths.run_dir("20260101-000000-5f5f5f")
    (sft / "adapter").mkdir(parents=True)
    (sft / "adapter" / "adapter_config.json").write_text("{}")
    (sft / "config.yaml").write_text(TrainConfig(model_name=CHAT_MODEL, run_name="chat").to_yaml())
    refused = EvalSpec(source=ModelSource(run_id=sft.name), data=pairs, metrics=["retrieval"]).validate()
    assert refused == [FieldError("metrics", f"retrieval scores an embedding model, and run {sft.name} (method sft) "
                                             "is not one: evaluate a run trained with method embedding (or a "
                                             "sentence-transformers base model such as the bundled all-MiniLM-L6-v2), "
                                             "or drop 'retrieval'")]


def test_retrieval_data_that_cannot_be_scored_names_data_and_the_fix(home, tmp_path):
    def errors(data: str, **values) -> list[FieldError]:
        return EvalSpec(source=EMBEDDING, data=data, metrics=["retrieval"], **values).validate()

    empty = tmp_path / "empty"
    empty.mkdir()
    [missing] = errors(str(empty))
    assert missing.field == "data" and "lacks corpus.jsonl, queries.jsonl, qrels.tsv or qrels.jsonl" in missing.message
    bad = beir_folder(tmp_path / "bad", qrels="qrels.tsv")
    (bad / "qrels.tsv").write_text("q9\td9\t1\n")
    assert errors(str(bad)) == [FieldError("data", f"{bad}: qrels.tsv: no judgement names a query and a document of the given "
                                                   "files (query-id and corpus-id must match their _id)")]
    (bad / "queries.jsonl").write_text('{"_id": "q1"}\n')
    assert errors(str(bad)) == [FieldError("data", f"{bad}: queries.jsonl: every line needs _id and text")]
    (bad / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\nnot json\n')
    assert errors(str(bad)) == [FieldError("data", f"{bad}: queries.jsonl line 2 is not JSON (Expecting value)")]
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"  # not under the allowed roots (tmp_path)
    outside.write_text('{"_id": "d1", "text": "secret"}\n')
    linked = beir_folder(tmp_path / "linked")
    (linked / "corpus.jsonl").unlink()
    (linked / "corpus.jsonl").symlink_to(outside)
    [escape] = errors(str(linked))
    assert escape.field == "data" and "outside the allowed folders" in escape.message
    outside.unlink()
    scored = write_jsonl(tmp_path / "scored.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 0.5}] * 2)
    [shape] = errors(scored)
    assert shape.field == "data" and shape.message.startswith("retrieval needs (anchor, positive) pairs, and "
                                                              "scored.jsonl holds (sentence1, sentence2, score)")
    assert errors("hub:org/set")[0].field == "data"
    assert [e.field for e in errors(scored, max_seq_length=-1)] == ["max_seq_length", "data"]


def test_the_cli_defaults_an_embedding_run_to_retrieval_and_names_what_is_wrong(orch, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", orch.store.url)  # the CLI's own orchestrator, on the same database
    run = embedding_run("20260101-000000-e5e5e5")
    insert_finished_run(orch.store, run, "retriever", [1.0])
    scored = write_jsonl(tmp_path / "scored.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 0.5}] * 2)
    assert cli(["eval", run, "--data", scored]) == 2  # no --metrics: retrieval, which needs pairs
    assert "error: data: retrieval needs (anchor, positive) pairs" in capsys.readouterr().err
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"anchor": "a?", "positive": "A."}])
    assert cli(["eval", run, "--data", pairs, "--metrics", "rouge"]) == 2
    assert "error: metrics: run 20260101-000000-e5e5e5 (method embedding) is an embedding model: it generates no text, " \
           "so rouge cannot score it; choose metrics [retrieval]" in capsys.readouterr().err
    assert [r.id for r in orch.list_runs()] == [run]  # nothing submitted


def test_an_eval_of_an_embedding_run_takes_its_prompts_length_and_columns(home, tmp_path):
    run = embedding_run("20260101-000000-e2e2e2", max_seq_length=128,
                        method_settings=EmbeddingSettings(query_prompt="query: ", document_prompt="passage: ",
                                                          columns={"anchor": "q", "positive": "doc"}))
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"q": "a?", "doc": "A."}, {"q": "b?", "doc": "B."}])
    ready = evals.prepared(EvalSpec(source=ModelSource(run_id=run), data=pairs, metrics=["retrieval"]))
    assert (ready.query_prompt, ready.document_prompt, ready.max_seq_length) == ("query: ", "passage: ", 128)
    assert ready.custom_format_mapping == {"anchor": "q", "positive": "doc"} and ready.validate() == []
    own = evals.prepared(EvalSpec(source=ModelSource(run_id=run), data=pairs, metrics=["retrieval"],
                                  query_prompt="q: ", custom_format_mapping={"anchor": "q", "positive": "doc"}))
    assert (own.query_prompt, own.document_prompt, own.max_seq_length) == ("q: ", "", 0)


def test_the_eval_split_of_an_embedding_run_is_the_set_its_evaluator_scored(home, tmp_path):
    rows = [{"anchor": f"query {i}?", "positive": f"Passage {i}."} for i in range(10)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    carved = embedding_run("20260101-000000-e3e3e3", local_datasets=[train], random_seed=3,
                           method_settings=EmbeddingSettings(ir_holdout=0.2))
    ir = retrieval.load_set(EvalSpec(source=EMBEDDING, data=f"eval_split:{carved}", metrics=["retrieval"]))
    kept, held = embedding_pairs.carve_eval(rows, 0.2, 3)  # what build_trainer holds out, with the run's seed
    assert sorted(ir.queries.values()) == sorted(r["anchor"] for r in held) and len(held) == 2
    assert sorted(ir.corpus.values()) == sorted(r["positive"] for r in held + kept)
    held_file = write_jsonl(tmp_path / "held.jsonl", [{"anchor": "new?", "positive": "New."}])
    named = embedding_run("20260101-000000-e4e4e4", local_datasets=[train], local_eval_datasets=[held_file])
    ir = retrieval.load_set(EvalSpec(source=EMBEDDING, data=f"eval_split:{named}", metrics=["retrieval"]))
    assert ir.queries == {"q0": "new?"} and len(ir.corpus) == 11  # the training passages are distractors
    sft = paths.run_dir("20260101-000000-5f5f5e")
    sft.mkdir(parents=True)
    (sft / "config.yaml").write_text(TrainConfig(model_name=CHAT_MODEL, run_name="chat").to_yaml())
    [error] = EvalSpec(source=EMBEDDING, data=f"eval_split:{sft.name}", metrics=["retrieval"]).validate()
    assert error.field == "data" and "is not an embedding run" in error.message


def test_the_evaluation_tab_shows_retrieval_with_deltas_and_ranks_worst_first():
    rows = metric_rows({"ndcg@10": 0.9, "accuracy@1": 0.8, "samples": 40}, {"ndcg@10": 0.2, "accuracy@1": 0.1})
    assert [(r["metric"], r["higher"]) for r in rows] == [("NDCG@10", True), ("Accuracy@1", True)]
    assert rows[0]["delta"] == pytest.approx(0.7)
    import pandas as pd

    ranked = worst_first(pd.DataFrame({"index": [0, 1, 2, 3], "rank": [1, None, 7, 2]}), "rank")
    assert list(ranked["index"]) == [1, 2, 3, 0]  # not in the top 100 first, then the lowest ranks


def test_run_details_shows_retrieval_against_the_base_and_queries_by_rank(app_home):
    store = Store()
    insert_finished_run(store, "run-e", "retriever", [2.0, 1.0])
    add_eval(store, "eval-base", BASE_KEY, "", {"samples": 3, "ndcg@10": 0.25, "accuracy@1": 0.0},
             created=time.time() - 100)
    queries = [{"index": i, "prompt": f"query {i}", "reference": f"passage {i}", "answer": f"hit {i}"} for i in range(3)]
    add_eval(store, "eval-e", "run:run-e", "run-e", {"samples": 3, "ndcg@10": 0.75, "accuracy@1": 2 / 3}, queries)
    folder = paths.run_dir("eval-e")
    folder.mkdir(parents=True)
    hits = [{"id": "d7", "score": 0.5, "relevant": False, "text": "hit 1"},
            {"id": "d1", "score": 0.4, "relevant": True, "text": "passage 1"}]
    write_jsonl(folder / evals.PREDICTIONS, [{**q, "rank": rank, "hits": hits}
                                             for q, rank in zip(queries, [1, None, 4])])
    at = open_page("pages/run.py", detail_run_id="run-e")
    shown = {m.label: (m.value, m.proto.delta) for m in at.metric if m.label in ("NDCG@10", "Accuracy@1")}
    assert shown == {"NDCG@10": ("0.75", "+0.5000"), "Accuracy@1": ("0.6667", "+0.6667")}
    table = samples_table(at)
    assert table["index"].tolist() == [1, 2, 0]  # the query whose passage is not in the top 100, then rank 4
    assert at.selectbox(key="evaltab_detail_done").label == "Relevant passage vs top hit"
    shown_hits = next(d.value for d in at.dataframe if "relevant" in d.value.columns)
    assert shown_hits[["rank", "relevant", "id"]].values.tolist() == [[1, False, "d7"], [2, True, "d1"]]


@pytest.mark.train
@pytest.mark.subprocess
def test_a_tuned_embedding_run_beats_its_base_model_on_held_out_queries(studio, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two OpenMP threads stall on a shared 2-core machine
    train, held_out = jargon()
    train_file = write_jsonl(tmp_path / "pairs.jsonl", train)
    held_file = write_jsonl(tmp_path / "held_out.jsonl", held_out)
    # no evaluator while training (nothing held out): the eval job is what scores it
    cfg = TrainConfig(run_name="jargon retriever", method="embedding", adapter="full", model_name=BUNDLED_MODEL,
                      local_datasets=[train_file], max_steps=20, batch_size=16, learning_rate=1e-4, warmup_steps=0,
                      logging_steps=5, save_steps=20, max_seq_length=64, random_seed=1,
                      method_settings=EmbeddingSettings(ir_holdout=0.0, eval_on_start=False,
                                                        columns={"anchor": "question", "positive": "passage"}))
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    code = cli(["eval", run_id, "--data", held_file, "--json"])  # an embedding run: retrieval by default
    captured = capsys.readouterr()
    assert code == 0, captured.err
    printed = json.loads(captured.out.strip().splitlines()[-1])
    base = printed["baseline"]
    print({k: (base[k], printed[k]) for k in retrieval.RESULT_KEYS})
    assert printed["samples"] == base["samples"] == 40 and printed["similarity"] == "cosine"
    assert printed["ndcg@10"] > base["ndcg@10"] + 0.3 and printed["accuracy@1"] > base["accuracy@1"] + 0.3
    assert base["ndcg@10"] < 0.5  # the base model cannot know the invented words

    job = printed["job_id"]
    result = studio.eval_result(job)
    baseline = studio.eval_baseline(result)
    assert baseline is not None and baseline.source_key == f"base:{BUNDLED_MODEL}"
    assert baseline.metrics["ndcg@10"] == base["ndcg@10"]
    deltas = {r["key"]: r["delta"] for r in metric_rows(result.metrics, baseline.metrics)}
    assert deltas["ndcg@10"] == pytest.approx(printed["ndcg@10"] - base["ndcg@10"])
    # a row per query: stored (query, its relevant passage, the top hit) and, in predictions.jsonl, the rank
    stored = studio.eval_samples(job)
    lines = [json.loads(line) for line in evals.predictions_path(job).read_text().splitlines()]
    assert len(stored) == len(lines) == 40 and list(stored["prompt"]) == [h["question"] for h in held_out]
    assert list(stored["reference"]) == [h["passage"] for h in held_out]
    ranks = [line["rank"] for line in lines]
    assert sum(rank == 1 for rank in ranks) / 40 == pytest.approx(printed["accuracy@1"])
    assert sum(1 / rank for rank in ranks if rank and rank <= 10) / 40 == pytest.approx(printed["mrr@10"])
    first = lines[0]
    assert first["hits"][0]["text"] == first["answer"] and first["hits"][0]["relevant"] == (first["rank"] == 1)

    # a checkpoint (sentence-transformers' own checkpoint folder) is evaluated the same way, against the same
    # cached baseline: step 20 is the final model, so its scores are the final model's
    assert cli(["eval", run_id, "--checkpoint", "20", "--data", held_file, "--json"]) == 0
    step20 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert step20["ndcg@10"] == pytest.approx(printed["ndcg@10"], abs=1e-6) and step20["baseline"] == base
    baselines = [r for r in studio.list_runs() if r.name.startswith("Baseline")]
    assert len(baselines) == 1


def test_retrieval_files_linked_from_outside_the_allowed_folders_are_refused(home, tmp_path, monkeypatch):
    """Hostile review: an embedding run's embedding.eval_corpus/queries/qrels were read as given, so a link inside
    an allowed folder to a file outside it reached the eval (its passages shown as top hits) and the training
    evaluator; the same folder given as data was refused."""
    allowed = tmp_path / "allowed"
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(allowed))
    secret = beir_folder(tmp_path / "secret")
    allowed.mkdir()
    for name in ("corpus.jsonl", "queries.jsonl"):
        (allowed / name).symlink_to(secret / name)
    (allowed / "qrels.tsv").symlink_to(secret / "qrels" / "test.tsv")
    links = {"eval_corpus": str(allowed / "corpus.jsonl"), "eval_queries": str(allowed / "queries.jsonl"),
             "eval_qrels": str(allowed / "qrels.tsv")}
    problems = {e.field: e.message for e in TrainConfig(method="embedding", adapter="full", model_name=BUNDLED_MODEL,
                                                        method_settings=EmbeddingSettings(**links)).validate()}
    assert {"embedding.eval_corpus", "embedding.eval_queries", "embedding.eval_qrels"} <= set(problems), problems
    assert "allowed folder" in problems["embedding.eval_corpus"]
    # a config.yaml edited after validation
    run = embedding_run("20260101-000000-e5e5e5", method_settings=EmbeddingSettings(**links))
    with pytest.raises(DatasetError) as refused:
        retrieval.load_set(EvalSpec(source=EMBEDDING, data=f"eval_split:{run}", metrics=["retrieval"]))
    assert refused.value.field == "data" and "retrieval files" in refused.value.message
