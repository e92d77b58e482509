"""Embedding method, dashboard half and data: shapes, detection, loss choice, retrieval sets, validation."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from trainer_core.config import ConfigError, TrainConfig
from trainer_core.data import embedding_pairs as pairs
from trainer_core.methods import embedding
from trainer_core.methods.embedding import EmbeddingSettings
from trainer_core.methods.settings import check_settings


def test_detects_each_shape_with_its_loss_and_says_why():
    found = pairs.detect([{"query": "q", "passage": "p"}])
    assert (found.shape, found.columns, found.loss) == ("anchor_positive", {"anchor": "query", "positive": "passage"}, "mnrl")
    assert "MultipleNegativesRankingLoss" in found.reason and "in-batch negatives" in found.reason
    assert pairs.detect([{"anchor": "a", "positive": "p", "negative": "n"}]).shape == "triplet"
    scored = pairs.detect([{"sentence1": "a", "sentence2": "b", "score": 0.3}])
    assert (scored.shape, scored.loss) == ("scored_pair", "cosent")
    labelled = pairs.detect([{"text": "a", "label": "sports"}])
    assert (labelled.shape, labelled.loss) == ("labelled", "batch_all_triplet")


def test_a_mapping_names_other_columns_and_unknown_columns_are_refused_with_the_fix():
    found = pairs.detect([{"frage": "q", "antwort": "p"}], {"anchor": "frage", "positive": "antwort"})
    assert found.columns == {"anchor": "frage", "positive": "antwort"}
    with pytest.raises(ValueError, match=r"columns frage, antwort: .*embedding.columns"):
        pairs.detect([{"frage": "q", "antwort": "p"}])


def test_normalize_orders_columns_and_counts_dropped_rows():
    rows = [{"passage": "p1", "query": "q1"}, {"query": "", "passage": "p2"}, {"query": "q3", "passage": 5}]
    shaped, dropped = pairs.normalize(rows, pairs.detect(rows))
    assert [list(r) for r in shaped] == [["anchor", "positive"]] and shaped[0] == {"anchor": "q1", "positive": "p1"}
    assert dropped == {"'query' is empty or not text": 1, "'passage' is empty or not text": 1}


def test_a_loss_that_does_not_fit_the_shape_is_refused_naming_the_choices():
    [problem] = pairs.loss_problems("triplet", "anchor_positive", [])
    assert problem.field == "embedding.loss" and "choose auto, mnrl, cached_mnrl" in problem.message
    [problem] = pairs.loss_problems("contrastive", "scored_pair", [{"score": 0.4}])
    assert "0/1 labels" in problem.message
    assert pairs.loss_problems("contrastive", "scored_pair", [{"score": 1.0}, {"score": 0.0}]) == []
    assert pairs.chosen_loss("auto", "scored_pair") == "cosent" and pairs.chosen_loss("angle", "scored_pair") == "angle"


def test_pairs_become_a_retrieval_set_with_every_passage_in_the_corpus():
    ir = pairs.ir_from_pairs([{"anchor": "q1", "positive": "p1"}, {"anchor": "q2", "positive": "p2", "negative": "n2"}],
                             [{"anchor": "t", "positive": "p1"}, {"anchor": "u", "positive": "p3"}])
    assert ir.queries == {"q0": "q1", "q1": "q2"}
    assert ir.corpus == {"d0": "p1", "d1": "p2", "d2": "n2", "d3": "p3"}
    assert ir.relevant == {"q0": {"d0"}, "q1": {"d1"}}


def test_held_out_queries_leave_training_but_their_passages_still_train():
    rows = [{"anchor": f"q{i}", "positive": f"p{i % 5}"} for i in range(20)]  # four queries per passage
    train, held = pairs.carve_eval(rows, 0.1, seed=3)
    assert (len(held), len(train)) == (2, 18)  # all rows but the held-out queries
    assert {r["anchor"] for r in train}.isdisjoint(r["anchor"] for r in held)
    assert {r["positive"] for r in held} <= {r["positive"] for r in train}
    assert sorted(map(str, train + held)) == sorted(map(str, rows))


def test_a_held_out_query_text_asked_again_in_another_row_is_not_trained_on():
    rows = [{"anchor": f"q{i // 2}", "positive": f"p{i}"} for i in range(20)]  # each query has two passages
    train, held = pairs.carve_eval(rows, 0.1, seed=3)
    asked = {r["anchor"] for r in held}
    assert len(held) == 2 and not any(r["anchor"] in asked for r in train)
    assert len(train) == 20 - len(held) - sum(r["anchor"] in asked for r in rows if r not in held)


def test_the_holdout_note_says_exactly_what_is_held_out_and_what_still_trains():
    rows = [{"anchor": f"q{i}", "positive": f"p{i % 5}"} for i in range(20)]
    train, held = pairs.carve_eval(rows, 0.1, seed=3)
    assert pairs.holdout_note(rows, train, held, 0.1) == (
        "no eval set: 2 of the 20 pairs are held out as the evaluator's queries (embedding.ir_holdout 0.1); "
        "their passages stay in training, so 18 pairs train")
    asked_twice = [{"anchor": f"q{i // 2}", "positive": f"p{i}"} for i in range(20)]
    train, held = pairs.carve_eval(asked_twice, 0.1, seed=3)
    assert pairs.holdout_note(asked_twice, train, held, 0.1) == (
        "no eval set: 2 of the 20 pairs are held out as the evaluator's queries (embedding.ir_holdout 0.1); "
        "their passages stay in training, and 2 more pairs that ask a held-out query again are left out, "
        "so 16 pairs train")


def test_beir_files_are_read_with_tsv_or_jsonl_qrels(tmp_path):
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "T", "text": "body"}) + "\n"
                                           + json.dumps({"_id": "d2", "text": "other"}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "ask"}) + "\n"
                                            + json.dumps({"_id": "q2", "text": "unjudged"}) + "\n")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\nq9\td1\t1\n")
    ir = pairs.read_beir(tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv")
    assert (ir.queries, ir.corpus, ir.relevant) == ({"q1": "ask"}, {"d1": "T body", "d2": "other"}, {"q1": {"d1"}})
    (tmp_path / "qrels.jsonl").write_text(json.dumps({"query-id": "q2", "corpus-id": "d2", "score": 2}) + "\n")
    assert pairs.read_beir(tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl",
                           tmp_path / "qrels.jsonl").relevant == {"q2": {"d2"}}
    (tmp_path / "none.tsv").write_text("q7\td7\t1\n")
    with pytest.raises(ValueError, match="embedding.eval_qrels: no judgement"):
        pairs.read_beir(tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "none.tsv")


def test_preview_shows_prompts_and_counts_in_batch_duplicates():
    rows = [{"anchor": "a", "positive": "p"}, {"anchor": "b", "positive": "p"}, {"anchor": "c", "positive": "p"}]
    assert pairs.preview_rows(rows[:1], "query: ", "passage: ") == [{"anchor": "query: a", "positive": "passage: p"}]
    assert pairs.batch_duplicates(rows, 2) == 1 and pairs.batch_duplicates(rows, 3) == 2


def _cfg(**section):
    return SimpleNamespace(method_settings=EmbeddingSettings(**section), packing=False, adapter="full")


def test_settings_are_refused_when_read_and_checked_with_the_rest(tmp_path):
    with pytest.raises(ConfigError) as info:  # what the settings object cannot hold: where the config is read
        TrainConfig.from_dict({"method": "embedding", "embedding": {"scal": 3, "mini_batch_size": "8"}})
    assert [e.field for e in info.value.errors] == ["embedding.scal", "embedding.mini_batch_size"]
    assert "did you mean 'scale'" in info.value.errors[0].message
    cfg = _cfg(loss="softmax", matryoshka_dims=[256, 0], eval_corpus=str(tmp_path / "missing.jsonl"))
    cfg.packing, cfg.adapter = True, "qlora"
    problems = check_settings(cfg.method_settings, "embedding") + embedding.validate(cfg)
    fields = [p.field for p in problems]
    assert fields == ["embedding.loss", "embedding.matryoshka_dims", "embedding.eval_queries",
                      "embedding.eval_corpus", "packing", "adapter"]
    assert embedding.validate(_cfg(loss="cached_mnrl", matryoshka_dims=[384, 128], query_prompt="query: ")) == []


def test_settings_defaults_and_headline_metrics():
    s = EmbeddingSettings()
    assert (s.loss, s.batch_sampler, s.eval_on_start, s.matryoshka_dims) == ("auto", "no_duplicates", True, [])
    keys = [m.key for m in embedding.SPEC.metric_specs if m.tile]
    assert keys[:6] == ["eval_ir_cosine_ndcg@10", "eval_ir_cosine_mrr@10", "eval_ir_cosine_recall@1",
                        "eval_ir_cosine_recall@10", "eval_ir_cosine_accuracy@1", "eval_sts_spearman_cosine"]
    assert embedding.SPEC.adapters == ("lora", "full") and embedding.SPEC.loads_own_model
