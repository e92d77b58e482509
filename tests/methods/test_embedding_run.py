"""The embedding method end to end, as a user runs it: the New run preview (a subprocess), a run through the
orchestrator, the worker process, the event log and the store, the CLI on a YAML file, and the output folder
loaded by SentenceTransformer. The data is test_embedding_train's invented jargon: the base model cannot know
the words, so held-out phrasings retrieve their meaning poorly at step 0 and well after 20 steps."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.data_rows import jargon
from tests.support import ROOT, run_python
from trainer_core.methods.embedding import EmbeddingSettings
from trainer_core.config import TrainConfig
from trainer_core.data import loading
from trainer_core.methods.embedding import BUNDLED_MODEL
from trainer_core.data.preview import build_preview
from trainer_core.protocol.status import RunStatus

NDCG = "eval_ir_cosine_ndcg@10"
ACC1 = "eval_ir_cosine_accuracy@1"


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def jargon_files(tmp_path: Path) -> tuple[str, str]:
    train, held_out = jargon()
    return write(tmp_path / "pairs.jsonl", train), write(tmp_path / "held_out.jsonl", held_out)


def run_config(train: str, held_out: str, **values) -> TrainConfig:
    fields = dict(run_name="jargon retriever", method="embedding", adapter="full", model_name=BUNDLED_MODEL,
                  local_datasets=[train], local_eval_datasets=[held_out], max_steps=20, batch_size=16,
                  eval_steps=20, learning_rate=1e-4, warmup_steps=0, logging_steps=5, save_steps=0,
                  max_seq_length=128, random_seed=1, method_settings=EmbeddingSettings(ir_holdout=0.0))
    return TrainConfig(**{**fields, **values})


@pytest.mark.subprocess
def test_the_preview_shows_texts_as_the_model_sees_them_with_lengths_and_batch_duplicates(studio, tmp_path):
    train, held_out = jargon_files(tmp_path)
    cfg = run_config(train, held_out, method_settings=EmbeddingSettings(query_prompt="query: ", document_prompt="passage: "),
                     max_seq_length=512)
    preview = build_preview(cfg, rows_shown=2)
    assert preview.format == "anchor_positive" and "MultipleNegativesRankingLoss" in preview.format_reason
    assert [r.label for r in preview.rows] == ["anchor", "positive", "anchor", "positive"]
    first, passage = preview.rows[0], preview.rows[1]
    # BERT's uncased tokenizer, its special tokens and the prompts: what the encoder reads
    assert first.text.startswith("[CLS] query : what is a ") and first.text.endswith("? [SEP]")
    assert passage.text.startswith("[CLS] passage : a ") and not first.truncated
    assert preview.max_seq_length == 256  # all-MiniLM-L6-v2's own maximum (sentence_bert_config), below 512
    assert preview.total_rows == 120 and len(preview.lengths) == 120 and preview.eval_rows == 40
    assert all(8 < n < 40 for n in preview.lengths)
    # each passage is the positive of three consecutive rows: in file order a batch of 16 repeats many of them
    assert "texts repeat within a batch of 16 in file order (the no_duplicates sampler keeps them apart)" in \
        preview.format_reason


@pytest.mark.subprocess
def test_the_preview_says_which_queries_are_held_out_when_no_eval_set_is_given(studio, tmp_path):
    train, _ = jargon_files(tmp_path)
    cfg = run_config(train, "", local_eval_datasets=[], method_settings=EmbeddingSettings(ir_holdout=0.1))
    preview = build_preview(cfg, rows_shown=1)
    # three questions per passage: the 12 held-out questions leave training, their passages do not
    assert (preview.total_rows, preview.eval_rows, len(preview.lengths)) == (108, 12, 108)
    assert ("no eval set: 12 of the 120 pairs are held out as the evaluator's queries (embedding.ir_holdout 0.1); "
            "their passages stay in training, so 108 pairs train") in preview.format_reason


@pytest.mark.train
def test_a_run_through_the_orchestrator_lifts_retrieval_far_above_step0_and_saves_a_loadable_model(studio, tmp_path):
    train, held_out = jargon_files(tmp_path)
    cfg = run_config(train, held_out)
    assert cfg.validate() == [] and loading.check_data(cfg) == []
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"
    run = studio.get_run(run_id)
    assert run.steps_done == 20
    frame = studio.metrics(run_id, keys=[NDCG, ACC1]).dropna(subset=[NDCG])
    scores = {int(step): (ndcg, acc) for step, ndcg, acc in zip(frame["step"], frame[NDCG], frame[ACC1])}
    assert sorted(scores) == [0, 20], scores  # the base model's score (step 0), then the tuned one's
    (before, before_acc), (after, after_acc) = scores[0], scores[20]
    print(f"held-out NDCG@10 {before:.3f} -> {after:.3f}, accuracy@1 {before_acc:.3f} -> {after_acc:.3f}")
    assert before < 0.3 and after > before + 0.5
    assert after_acc > before_acc + 0.5

    output = Path(run.output_dir)
    assert output.name == "model" and (output / "modules.json").is_file()  # a sentence-transformers folder
    code = ("import sys\nfrom sentence_transformers import SentenceTransformer\n"
            "model = SentenceTransformer(sys.argv[1], device='cpu')\n"
            "query, right, wrong = model.encode([sys.argv[2], sys.argv[3], sys.argv[4]], normalize_embeddings=True)\n"
            "print(model.get_sentence_embedding_dimension(), float(query @ right) > float(query @ wrong))\n")
    _, held = jargon()
    loaded = run_python(code, str(output), held[0]["question"], held[0]["passage"], held[1]["passage"], timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == ["384", "True"]


def test_the_cli_validates_an_embedding_yaml(home, tmp_path):
    train, held_out = jargon_files(tmp_path)
    config = tmp_path / "embedding.yaml"
    config.write_text(f"method: embedding\nadapter: full\nmodel_name: \"{BUNDLED_MODEL}\"\n"
                      f"local_datasets: [\"{train}\"]\nlocal_eval_datasets: [\"{held_out}\"]\n"
                      "embedding:\n  loss: mnrl\n  query_prompt: 'query: '\n")
    ok = subprocess.run([sys.executable, "-m", "trainer_core", "validate", "--config", str(config)],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    config.write_text(config.read_text().replace("loss: mnrl", "loss: cosent"))
    refused = subprocess.run([sys.executable, "-m", "trainer_core", "validate", "--config", str(config)],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert refused.returncode != 0 and "embedding.loss" in refused.stdout + refused.stderr
