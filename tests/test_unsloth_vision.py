"""The Unsloth engine's vision path on a CPU machine: the engine choice on a (faked) CUDA host, and, in worker-side
subprocesses with a stand-in unsloth package that records its calls, what the engine passes to FastVisionModel,
UnslothVisionDataCollator and TRL's SFTTrainer (built for real on the tiny LLaVA, not trained), and the worker's fall
back to the transformers engine when Unsloth cannot load the model. What only a GPU can show (Unsloth training the
model) is bench/gpu_smoke.py's unsloth-vision-llava case."""
from __future__ import annotations

import json
import os
import textwrap

import pytest

from tests.support import ROOT, run_python
from tests.support.vision import build_tiny_vlm, shape_rows
from trainer_core.host import hardware
from trainer_core.worker import engines


@pytest.fixture
def cuda_host(monkeypatch):
    """A CUDA host with the gpu extra installed, as far as the engine choice can tell."""
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    real = hardware.has_module
    monkeypatch.setattr(hardware, "has_module", lambda name: name == "unsloth" or real(name))
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)


def test_a_one_process_vision_run_on_cuda_with_unsloth_gets_the_unsloth_engine(cuda_host, monkeypatch):
    assert engines.choose_engine(1, vision=True) == engines.choose_engine(1) == "unsloth"
    assert engines.choose_engine(2, vision=True) == "transformers"  # Unsloth pins its model to one GPU
    monkeypatch.setenv(engines.ENGINE_ENV, "transformers")
    assert engines.choose_engine(1, vision=True) == "transformers"


def test_without_cuda_or_without_unsloth_a_vision_run_gets_transformers(monkeypatch):
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)
    monkeypatch.setattr(hardware, "cuda_available", lambda: False)
    monkeypatch.setattr(hardware, "has_module", lambda name: True)
    assert engines.choose_engine(1, vision=True) == "transformers"
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(hardware, "has_module", lambda name: name != "unsloth")
    assert engines.choose_engine(1, vision=True) == "transformers"


# A stand-in for the unsloth package (CUDA only): records what the engine passes to it; the model and processor are
# the tiny LLaVA's, loaded by transformers. FAIL makes from_pretrained fail as Unsloth does on a model it cannot load.
FAKE_UNSLOTH = textwrap.dedent("""
    import json, os, sys, types
    from transformers import AutoModelForImageTextToText, AutoProcessor
    calls = []

    def record(name, kwargs):
        calls.append([name, {k: v if isinstance(v, (bool, int, float, str, list, dict, type(None))) else repr(v)
                             for k, v in kwargs.items()}])

    class FastVisionModel:
        @staticmethod
        def from_pretrained(**kwargs):
            record("from_pretrained", kwargs)
            if os.environ.get("FAKE_UNSLOTH_FAIL"):
                raise NotImplementedError("Unsloth: llava with a siglip tower is not supported yet")
            return (AutoModelForImageTextToText.from_pretrained(kwargs["model_name"]),
                    AutoProcessor.from_pretrained(kwargs["model_name"]))
        @staticmethod
        def get_peft_model(model, **kwargs):
            record("get_peft_model", kwargs)
            return model
        @staticmethod
        def for_training(model, **kwargs):
            record("for_training", kwargs)

    class UnslothVisionDataCollator:
        def __init__(self, model, processor, **kwargs):
            record("collator", kwargs)
            self.formatting_func = kwargs["formatting_func"]

    class FastLanguageModel:
        pass

    unsloth = types.ModuleType("unsloth")
    unsloth.FastVisionModel, unsloth.FastLanguageModel = FastVisionModel, FastLanguageModel
    unsloth.trainer = types.ModuleType("unsloth.trainer")
    unsloth.trainer.UnslothVisionDataCollator = UnslothVisionDataCollator
    sys.modules.update({"unsloth": unsloth, "unsloth.trainer": unsloth.trainer})
""")

ENGINE = FAKE_UNSLOTH + textwrap.dedent("""
    from pathlib import Path
    from trainer_core.config import TrainConfig
    from trainer_core.worker.engines import UnslothCannotLoad, unsloth_engine, unsloth_vision

    model_ref, rows, out = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    base = dict(model_name=model_ref, max_seq_length=96, random_seed=7)
    lora = TrainConfig(**base, adapter="lora", lora_r=8, lora_alpha=32, lora_dropout=0.05, finetune_vision_layers=True,
                       finetune_mlp_modules=False, target_modules=[], train_on_completions=True, image_max_side=40,
                       gradient_checkpointing=True)
    model, processor = unsloth_engine.load_model(lora, model_ref, None)
    unsloth_engine.load_model(TrainConfig(**base, adapter="qlora", target_modules=["q_proj", "v_proj"]), model_ref, None)
    unsloth_engine.load_model(TrainConfig(**base, adapter="full", gradient_checkpointing=False), model_ref, None)

    train_ds = unsloth_engine.to_dataset(rows, lora)
    trainer = unsloth_engine.build_trainer(lora, model, processor, train_ds, None, out / "checkpoints", out, [])
    row = trainer.data_collator.formatting_func(train_ds[0])
    prompt_images = [part["image"].size for m in row["prompt"] for part in m["content"] if part["type"] == "image"]
    args = trainer.args
    import torch
    batch = {"input_ids": torch.tensor([[5, 2, 7, 2, 2]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 0]]),
             "labels": torch.tensor([[-100, -100, 7, -100, -100]])}  # prompt 5 EOS, answer 7 EOS, one pad (= EOS)
    unsloth_vision.train_eos(batch, eos_id=2)
    result = {"calls": calls, "trainer": type(trainer).__name__,
              "collator": [c.__name__ for c in type(trainer.data_collator).__mro__[:2]],
              "eos_as_pad": trainer.data_collator.eos_as_pad == processor.tokenizer.eos_token_id,
              "eos_labels": batch["labels"].tolist(),
              "processing_class": type(trainer.processing_class).__name__,
              "args": [args.remove_unused_columns, args.dataset_text_field, args.dataset_kwargs, args.max_length,
                       args.dataset_num_proc],
              "row_images": [image.size for image in row["images"]], "prompt_images": prompt_images,
              "columns": train_ds.column_names}
    os.environ["FAKE_UNSLOTH_FAIL"] = "1"
    try:
        unsloth_engine.load_model(lora, model_ref, None)
    except UnslothCannotLoad as exc:
        result["cannot_load"] = str(exc)
    print(json.dumps(result))
""")


def vision_rows(folder, count: int) -> list[dict]:
    """Rows in the studio's one vision shape (trainer_core.data.images), images as absolute paths."""
    return [{"messages": [{"role": "user", "content": [{"type": "image", "text": None},
                                                       {"type": "text", "text": row["question"]}]},
                          {"role": "assistant", "content": [{"type": "text", "text": row["answer"]}]}],
             "images": [str(folder / row["image"])]} for row in shape_rows(folder, count, seed=5)]


@pytest.mark.subprocess  # starts a transformers subprocess
def test_the_unsloth_engine_passes_the_switches_the_adapter_and_the_vision_trainer_settings(tmp_path):
    vlm = build_tiny_vlm()
    result = run_python(ENGINE, str(vlm), json.dumps(vision_rows(tmp_path, 2)), str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    calls = out["calls"]
    assert [name for name, _ in calls] == ["from_pretrained", "get_peft_model", "from_pretrained", "get_peft_model",
                                           "from_pretrained", "for_training", "collator", "from_pretrained"]
    (_, lora_load), (_, peft), (_, qlora_load), (_, qlora_peft), (_, full_load) = calls[:5]
    assert {k: lora_load[k] for k in ("load_in_4bit", "full_finetuning", "max_seq_length", "use_exact_model_name",
                                      "use_gradient_checkpointing", "float32_mixed_precision")} == {
        "load_in_4bit": False, "full_finetuning": False, "max_seq_length": 96, "use_exact_model_name": True,
        "use_gradient_checkpointing": "unsloth", "float32_mixed_precision": None}
    assert {k: peft[k] for k in ("finetune_vision_layers", "finetune_language_layers", "finetune_attention_modules",
                                 "finetune_mlp_modules", "r", "lora_alpha", "lora_dropout", "target_modules",
                                 "random_state", "bias", "init_lora_weights")} == {
        "finetune_vision_layers": True, "finetune_language_layers": True, "finetune_attention_modules": True,
        "finetune_mlp_modules": False, "r": 8, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": None,
        "random_state": 7, "bias": "none", "init_lora_weights": True}
    # QLoRA loads in 4 bit; an explicit module list goes along (Unsloth keeps it where the switches also select)
    assert qlora_load["load_in_4bit"] is True and qlora_peft["target_modules"] == ["q_proj", "v_proj"]
    assert qlora_peft["finetune_vision_layers"] is False  # the studio's default: the language model only
    # full fine-tuning: Unsloth's own switch, fp32 master weights, no adapter
    assert (full_load["full_finetuning"], full_load["load_in_4bit"], full_load["float32_mixed_precision"],
            full_load["use_gradient_checkpointing"]) == (True, False, True, False)
    assert calls[5][1] == {"use_gradient_checkpointing": True}  # for_training, right before the trainer
    collator = calls[6][1]
    assert {k: collator[k] for k in ("max_seq_length", "resize", "resize_dimension", "completion_only_loss")} == {
        "max_seq_length": 96, "resize": 40, "resize_dimension": "max", "completion_only_loss": True}
    assert (out["trainer"], out["collator"], out["processing_class"]) == (
        "SFTTrainer", ["StudioVisionCollator", "UnslothVisionDataCollator"], "LlavaProcessor")
    # the tiny LLaVA pads with its EOS token: Unsloth's collator masks padding by id, the studio puts the answer's EOS
    # back in the loss (not the prompt's, not a pad)
    assert out["eos_as_pad"] is True and out["eos_labels"] == [[-100, -100, 7, 2, -100]]
    assert out["args"] == [False, "", {"skip_prepare_dataset": True}, 96, 1]
    # completions-only rows: the collator's formatting opens the 48 px image, scales it to 40 px and puts it in the
    # prompt's placeholder, where Unsloth's prompt/completion path looks for it
    assert out["columns"] == ["prompt", "completion", "images"]
    assert out["row_images"] == out["prompt_images"] == [[40, 40]]
    assert out["cannot_load"] == (
        f"Unsloth cannot load {vlm} as a vision-language model (Unsloth: llava with a siglip tower is not supported "
        "yet): training with the transformers engine instead.")


WORKER = FAKE_UNSLOTH + textwrap.dedent("""
    from pathlib import Path
    from trainer_core.host import hardware
    from trainer_core.worker import train
    hardware.unsloth_usable = lambda: True  # a CUDA host with the gpu extra, to the engine choice
    os.environ["FAKE_UNSLOTH_FAIL"] = "1"
    train.Worker(Path(sys.argv[1])).run()
    print(json.dumps(calls))
""")


@pytest.mark.subprocess  # starts a transformers subprocess (the worker; no training)
def test_a_model_unsloth_cannot_load_trains_with_transformers_and_the_timeline_says_so(tmp_path):
    from trainer_core.config import TrainConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    vlm = build_tiny_vlm()
    # the data is missing on purpose: the run stops right after the model is loaded, before any training
    (run_dir / "config.yaml").write_text(TrainConfig(
        model_name=str(vlm), local_datasets=[str(tmp_path / "missing.jsonl")], max_steps=1).to_yaml())
    env = {"FINETUNE_STUDIO_HOME": str(tmp_path / "home"),
           "FINETUNE_STUDIO_ALLOWED_ROOTS": os.pathsep.join([str(tmp_path), str(ROOT / ".test-cache")])}
    result = run_python(WORKER, str(run_dir), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [name for name, _ in json.loads(result.stdout.strip().splitlines()[-1])] == ["from_pretrained"]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    timeline = [(e["kind"], e.get("engine") or e.get("message")) for e in events if e["kind"] != "heartbeat"]
    assert timeline[:3] == [
        ("status", "unsloth"),
        ("warning", f"Unsloth cannot load {vlm} as a vision-language model (Unsloth: llava with a siglip tower is not "
                    "supported yet): training with the transformers engine instead."),
        ("status", "transformers")]  # "preparing data": the model came from the transformers engine
    assert timeline[-1][0] == "error" and "missing.jsonl" in events[-1]["message"]
