"""The embedding method registered (dashboard side, no ML imports): the loader routes its rows through
data.embedding_pairs, the files are checked against its shapes, the old is_embedding switch and the bundled
embedding model validate, and the memory estimate reads the bundled model's config.json (a BERT encoder)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_core.methods.embedding import EmbeddingSettings
from trainer_core import methods
from trainer_core.planning import memory, model_info
from trainer_core.config import FieldError, TrainConfig
from trainer_core.data import DatasetError, loading
from trainer_core.data import embedding_pairs as pairs
from trainer_core.methods.base import SHAPES
from trainer_core.methods.embedding import BUNDLED_MODEL

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def pairs_rows(count: int = 12) -> list[dict]:
    return [{"question": f"what is item {i}?", "passage": f"Item {i} is a thing numbered {i}."} for i in range(count)]


def config(files: list[str], **values) -> TrainConfig:
    return TrainConfig(method="embedding", adapter="full", model_name=BUNDLED_MODEL, local_datasets=files, **values)


def test_embedding_is_registered_with_both_halves_and_its_shapes_known():
    from trainer_core.worker.methods import WORKER_HALVES

    spec = methods.get("embedding")
    assert spec.loads_own_model and WORKER_HALVES["embedding"] == "trainer_core.worker.methods.embedding"
    assert set(spec.data_shapes) == set(pairs.SHAPES) and all(s in SHAPES for s in spec.data_shapes)
    assert "(anchor, positive) pairs" in spec.shapes_text() and "(sentence, label)" in spec.shapes_text()


def test_a_pairs_file_loads_as_its_shape_with_the_loss_it_implies_and_drops_counted(home, tmp_path):
    rows = pairs_rows() + [{"question": "", "passage": "orphan passage"}]
    cfg = config([write(tmp_path / "pairs.jsonl", rows)])
    assert cfg.validate() == [] and loading.check_data(cfg) == []
    data = loading.load_local(cfg.local_datasets, cfg)
    assert data.format == "anchor_positive"
    assert data.rows[0] == {"anchor": "what is item 0?", "positive": "Item 0 is a thing numbered 0."}
    assert "anchor='question'" in data.reason and "MultipleNegativesRankingLoss" in data.reason
    assert pairs.WHY_LOSS["anchor_positive"] in data.reason
    assert data.dropped == {"'question' is empty or not text": 1}


def test_a_named_loss_is_what_the_reason_says_and_one_that_does_not_fit_is_a_field_error(home, tmp_path):
    scored = [{"sentence1": f"a{i}", "sentence2": f"b{i}", "score": i / 10} for i in range(10)]
    cfg = config([write(tmp_path / "sts.jsonl", scored)], method_settings=EmbeddingSettings(loss="angle"))
    assert loading.check_data(cfg) == []
    data = loading.load_local(cfg.local_datasets, cfg)
    assert data.format == "scored_pair" and "loss AnglELoss (embedding.loss; auto would pick CoSENTLoss)" in data.reason
    [problem] = loading.check_data(config(cfg.local_datasets, method_settings=EmbeddingSettings(loss="triplet")))
    assert problem.field == "embedding.loss" and "choose auto, cosent, angle, contrastive" in problem.message


def test_a_chat_file_is_refused_naming_the_shapes_embedding_trains_on(home, tmp_path):
    [problem] = loading.check_data(config([write(tmp_path / "chat.jsonl", [CHAT] * 3)]))
    assert problem.field == "local_datasets"
    assert "no embedding data shape fits the columns messages" in problem.message
    assert "anchor/positive (optional negative), sentence1/sentence2/score or sentence/label" in problem.message


def test_the_column_mapping_reads_other_names_and_a_wrong_one_names_its_field(home, tmp_path):
    rows = [{"frage": f"q{i}", "antwort": f"a{i}"} for i in range(5)]
    file = write(tmp_path / "de.jsonl", rows)
    cfg = config([file], method_settings=EmbeddingSettings(columns={"anchor": "frage", "positive": "antwort"}))
    assert loading.check_data(cfg) == []
    assert loading.load_local([file], cfg).rows[0] == {"anchor": "q0", "positive": "a0"}
    [problem] = loading.check_data(config([file], method_settings=EmbeddingSettings(
        columns={"anchor": "question", "positive": "antwort"})))
    assert problem.field == "embedding.columns"


def test_chat_settings_on_embedding_rows_say_what_applies_instead(home, tmp_path):
    found = loading.check_data(config([write(tmp_path / "p.jsonl", pairs_rows())], system_prompt="Be brief.",
                                      train_on_completions=True))
    assert [p.field for p in found] == ["system_prompt", "train_on_completions"]
    assert "embedding.query_prompt" in found[0].message


def test_files_of_two_shapes_are_refused(home, tmp_path):
    triplets = [{"anchor": f"q{i}", "positive": f"p{i}", "negative": f"n{i}"} for i in range(5)]
    files = [write(tmp_path / "a.jsonl", pairs_rows()), write(tmp_path / "b.jsonl", triplets)]
    [problem] = loading.check_data(config(files))
    assert problem.field == "local_datasets" and "mix data shapes (anchor_positive, triplet)" in problem.message


def test_all_rows_unusable_is_a_field_error(home, tmp_path):
    with pytest.raises(DatasetError, match="no usable rows"):
        loading.load_local([write(tmp_path / "e.jsonl", [{"query": "", "passage": ""}] * 3)],
                           config([]))


def test_the_bundled_embedding_model_validates_and_gets_an_encoder_estimate(home):
    cfg = TrainConfig(method="embedding", adapter="full", model_name=BUNDLED_MODEL, batch_size=32)
    assert cfg.validate() == [] and cfg.model_label == "all-MiniLM-L6-v2 (bundled)"
    info = model_info.inspect_model(BUNDLED_MODEL)
    assert (info.architecture, info.hidden_size, info.num_layers, info.source) == ("BertModel", 384, 6, "bundled")
    assert 22_000_000 < info.num_parameters < 23_500_000  # counted from the safetensors header
    full = memory.estimate_memory(info, cfg, "cuda", longest_row=64)
    assert full.trainable_params == info.num_parameters
    # no vocabulary logits (bf16 + their fp32 copy) but one fp32 embedding per token; two texts per row
    causal = memory.estimate_memory(info, TrainConfig(adapter="full", batch_size=32), "cuda", longest_row=64)
    tokens = 32 * 64
    layers = causal.activations_gb - tokens * 30522 * (2 + 4) / memory.GB
    assert full.activations_gb == pytest.approx(2 * (layers + tokens * 384 * 4 / memory.GB))
    lora = memory.estimate_memory(info, TrainConfig(method="embedding", adapter="lora", model_name=BUNDLED_MODEL,
                                                    lora_r=8), "cuda", longest_row=64)
    # r x (in + out) over query, key, value and the three dense layers of 6 layers
    assert lora.trainable_params == 8 * (3 * (384 + 384) + (384 + 384) + (384 + 1536) * 2) * 6


def test_the_embedding_settings_section_is_read_from_yaml(home):
    cfg = TrainConfig.from_yaml(f"method: embedding\nmodel_name: {BUNDLED_MODEL}\nadapter: full\n"
                                "embedding:\n  loss: cached_mnrl\n  mini_batch_size: 8\n  query_prompt: 'query: '\n")
    assert cfg.method_settings == EmbeddingSettings(loss="cached_mnrl", mini_batch_size=8, query_prompt="query: ")
    assert TrainConfig.from_dict(cfg.to_public_dict()) == cfg  # written as the embedding: section, read back
    assert cfg.validate() == []
    assert FieldError("adapter", "embedding models train with lora or full (no 4-bit): choose one") in TrainConfig(
        method="embedding", model_name=BUNDLED_MODEL, adapter="qlora").validate()
