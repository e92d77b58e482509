"""The training worker: one process per run, the only place the ML stack is imported.

Started (by the orchestrator) as ``python -m trainer_core.worker RUN_DIR`` for a job of kind train. It reads ``RUN_DIR/config.yaml``
(no secrets; HF_TOKEN and WANDB_API_KEY come through the environment), writes typed events to
``RUN_DIR/events.jsonl`` and reads control requests from ``RUN_DIR/control.json``.

Lifecycle, top to bottom: load config -> load model -> load data -> build trainer -> train -> save -> report.

Kept whole: the training worker's lifecycle is one sequence (config, model, data, trainer, train, save, report) with
its reporting and control around it; the parts that differ by method or engine live in worker/methods/ and
worker/engines/.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import psutil

from trainer_core.specs import checkpoints
from trainer_core.host import parallel
from trainer_core.host import hardware
from trainer_core.protocol import control, events as ev, secrets
from trainer_core.protocol.metrics import open_metrics
from trainer_core.config import TrainConfig, looks_like_path
from trainer_core.data import fingerprint
from trainer_core.worker import ranks, tool_template
from trainer_core.worker.engines import TRANSFORMERS, UnslothCannotLoad, choose_engine
from trainer_core.protocol.status import RunStatus

HEARTBEAT_S = 2.0
OOM_HINT = ("Out of memory. Lower batch_size or max_seq_length, turn on gradient_checkpointing, "
            "or use QLoRA (4-bit) on a GPU.")


class ModelLoadError(RuntimeError):
    """The model (or its tokenizer) could not be loaded; the message names model_name and what to do."""


def _model_load_message(cfg: TrainConfig, exc: OSError) -> str:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if looks_like_path(cfg.model_name) or cfg.model_name.startswith("bundled:"):
        return f"model_name: could not load {cfg.model_name!r}: {reason}"
    return (f"model_name: could not load {cfg.model_name!r} from the Hugging Face hub ({reason}). Check the id and "
            "your network; gated models need an HF token; offline, only models already in the local cache work.")


class Cancelled(Exception):
    """Raised between phases when a cancel arrives before training started."""


class GpuUnusableError(RuntimeError):
    """The run was given GPUs that torch cannot use (a driver too old for the torch build, or none at all)."""


def check_torch_sees_gpus(nvml_gpus: int, torch_cuda: bool, torch_version: str, torch_cuda_version: str | None,
                          driver: str) -> None:
    """Fail fast, naming both versions, when NVML sees GPUs but torch cannot use them: Unsloth would crash
    and the transformers engine would quietly train on the CPU."""
    if nvml_gpus and not torch_cuda:
        build = f"CUDA {torch_cuda_version}" if torch_cuda_version else "a CPU-only build"
        raise GpuUnusableError(
            f"This host has {nvml_gpus} NVIDIA GPU(s) (driver {driver or 'unknown'}), but torch {torch_version} "
            f"({build}) cannot use them. Install a torch build whose CUDA version the driver supports (nvidia-smi "
            "shows the highest CUDA version it supports; see docs/gpu-host.md), or set "
            "FINETUNE_STUDIO_FORCE_CPU=1 to train on the CPU.")


class NoEvents:
    """The event sink of ranks other than 0: only rank 0 reports (one metrics row per step, not one per rank)."""

    def emit(self, event) -> None:
        pass

    def close(self) -> None:
        pass


class Worker:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        # Set by torchrun when the run trains on several processes; absent (0 of 1) otherwise.
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.events = ev.EventWriter(run_dir / "events.jsonl") if self.rank == 0 else NoEvents()
        self.secrets = [s for s in secrets.from_env(os.environ).values() if s]
        self.sigterm = threading.Event()
        self._stop_heartbeat = threading.Event()
        self.engine_name = ""
        self.early_stopping_patience = 0
        self.agreed_action: control.Action | None = None  # what every rank agreed on at the last step

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        if not self.distributed:
            # One process: SIGTERM means cancel. Under torchrun SIGTERM is the launcher stopping this rank
            # because another one died; the default action (exit) is right, and the launcher reports.
            signal.signal(signal.SIGTERM, lambda *_: self.sigterm.set())
        if self.rank == 0:
            threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat").start()
        if self.distributed:
            threading.Thread(target=self._watch_launcher, args=(os.getppid(),), daemon=True,
                             name="launcher-watch").start()
        try:
            cfg = TrainConfig.from_yaml((self.run_dir / "config.yaml").read_text())
            self.early_stopping_patience = cfg.early_stopping_patience
            self.engine_name = choose_engine(self.world_size, vision=_is_vision_model(cfg),
                                             continues_adapter=bool(cfg.init_adapter))
            self.status(RunStatus.STARTING, "loading model")
            # Import the engine only now: unsloth must be imported before transformers when it is used.
            engine = importlib.import_module(f"trainer_core.worker.engines.{self.engine_name}_engine")
            from trainer_core.worker import model_files  # imports transformers; after the engine on purpose
            from trainer_core.worker import samples

            self.check_gpus()
            model_ref = model_files.resolve_model(cfg, log=self.log)
            self.check_cancel()
            try:
                sharded = self.shard_model(cfg, model_ref)
                if cfg.method_spec.loads_own_model:  # e.g. embedding: a SentenceTransformer, not a causal LM
                    from trainer_core.worker import methods as worker_methods

                    model, tokenizer = worker_methods.get(cfg.method).load_model(
                        cfg, model_ref, os.environ.get("HF_TOKEN") or None, warn=self.warn)
                else:
                    try:
                        model, tokenizer = engine.load_model(cfg, model_ref, os.environ.get("HF_TOKEN") or None,
                                                             sharded=sharded)
                    except UnslothCannotLoad as exc:  # a model Unsloth does not patch: the engine that runs everywhere
                        self.warn(str(exc))
                        self.engine_name = TRANSFORMERS  # the next status event carries it to the run's record
                        engine = importlib.import_module(f"trainer_core.worker.engines.{TRANSFORMERS}_engine")
                        model, tokenizer = engine.load_model(cfg, model_ref, os.environ.get("HF_TOKEN") or None,
                                                             sharded=sharded)
            except OSError as exc:  # transformers' way to say "not found / cannot connect / no access"
                raise ModelLoadError(_model_load_message(cfg, exc)) from exc
            self.check_cancel()

            self.status(RunStatus.STARTING, "preparing data")
            train_rows, eval_rows = self.load_data(cfg)
            from trainer_core.worker import vision  # imports transformers: after the engine, like model_files

            # image rows train with the model's processor (rows that would cut an image's tokens left out); a method
            # that loads its own model keeps its processing class (stt: the WhisperProcessor)
            if not cfg.method_spec.loads_own_model:
                tokenizer, train_rows, eval_rows = vision.prepare_run(tokenizer, train_rows, eval_rows, cfg,
                                                                      self.warn, self.log)
                template = tool_template.apply(tokenizer, train_rows + eval_rows, cfg)  # rows with tools: a template
                if template:  # that shows them; saved with the tokenizer beside the adapter
                    self.log(f"Chat template for tool calls: {template}")
            train_ds = engine.to_dataset(train_rows, cfg)  # in the shape the run's method trains on
            eval_ds = engine.to_dataset(eval_rows, cfg) if eval_rows else None
            self.check_cancel()

            output_dir = self.run_dir / "checkpoints"
            callback = make_callback(self)
            chat = rows_are_chat(cfg, train_rows, tokenizer)  # samples are rendered like the training rows
            generates = not cfg.method_spec.loads_own_model and cfg.method_spec.model_class == "causal_lm"
            if generates:
                sampling = samples.make_callback(cfg, vision.text_tokenizer(tokenizer), chat, eval_ds is not None,
                                                 sharded, self)
            elif cfg.method_spec.output == "audio":  # spoken samples: WAV clips in the run folder
                from trainer_core.worker import methods as worker_methods

                sampling = worker_methods.get(cfg.method).make_sampler(cfg, tokenizer, train_rows, eval_rows, self)
            else:  # samples are for language models and speakers (not embedders, reward heads, transcribers)
                sampling = None
            trainer = engine.build_trainer(cfg, model, tokenizer, train_ds, eval_ds, output_dir, self.run_dir,
                                           [callback, *([sampling] if sampling else [])], sharded=sharded)
            self.status(RunStatus.RUNNING, "training")
            trainer.train(resume_from_checkpoint=checkpoints.resume_point(self.run_dir, cfg.resume_from_checkpoint,
                                                                          os.environ))
            callback.log_peak_memory()

            # Ranks must agree (a rank that saves while another leaves deadlocks): under torchrun the
            # decision is the one all ranks took together at the last step.
            action = self.agreed_action if self.distributed else self.requested()
            if action is control.Action.CANCEL:
                if self.rank == 0:
                    checkpoints.remove_partial_checkpoints(output_dir, self.run_dir)
                self.complete(RunStatus.CANCELLED, trainer)
                return 0
            self.status(RunStatus.STOPPING if action else RunStatus.RUNNING, "saving")
            final_dir = self.run_dir / ("adapter" if cfg.effective_use_lora else "model")
            trainer.save_model(str(final_dir))  # every rank calls it (FSDP gathers); only rank 0 writes
            if self.rank == 0:
                tokenizer.save_pretrained(str(final_dir))
            self.complete(RunStatus.STOPPED if action else RunStatus.COMPLETED, trainer, final_dir)
            return 0
        except Cancelled:
            checkpoints.remove_partial_checkpoints(self.run_dir / "checkpoints", self.run_dir)
            self.events.emit(ev.CompleteEvent(status=RunStatus.CANCELLED.value))
            return 0
        except BaseException as exc:  # process boundary: report every failure, then exit non-zero
            self.fail(exc)
            return 1
        finally:
            self._stop_heartbeat.set()
            self.events.close()

    def shard_model(self, cfg: TrainConfig, model_ref: str) -> bool:
        """FSDP instead of DDP when the memory estimate says one GPU cannot hold a data-parallel copy."""
        if not self.distributed or not hardware.cuda_available():
            return False
        from trainer_core.planning import memory, model_info

        try:
            need = memory.estimate_memory(model_info.inspect_model(model_ref), cfg, "cuda",
                                          engine=self.engine_name).total_gb
        except model_info.ModelInfoError as exc:
            self.warn(f"No memory estimate for {cfg.model_name} ({exc}); training data-parallel (DDP) without sharding.")
            return False
        free = memory.device_memory(cfg).free_gb
        sharded = parallel.use_fsdp(cfg, self.world_size, need, free)
        self.log(f"{self.world_size} processes, {'FSDP (sharded)' if sharded else 'DDP'}: the estimate is "
                 f"{need:.1f} GB per copy, {free:.1f} GB free on one GPU")
        return sharded

    def load_data(self, cfg: TrainConfig) -> tuple[list[dict], list[dict]]:
        data, loaded = fingerprint.load_with_fingerprint(cfg)  # rows chosen as the preview chooses them
        self.log(f"Dataset: {len(data.train.rows)} rows, format {data.train.format} ({data.train.reason})")
        # Resume checks the files against what was loaded here, not against what was checked before the model loaded
        self.events.emit(ev.DataEvent(fingerprint=loaded.digest, rows=len(data.rows), eval_rows=len(data.eval_rows)))
        changed = fingerprint.change_warning(fingerprint.read_checked(self.run_dir), loaded)
        if changed:
            self.warn(changed)
        dropped = data.train.drop_warning()
        if dropped:
            self.warn(dropped)  # one warning, however many rows and reasons
        return data.rows, data.eval_rows

    # ------------------------------------------------------------------ reporting
    def status(self, status: RunStatus, phase: str, message: str = "") -> None:
        self.log(f"[{status.value}] {phase} {message}".rstrip())
        self.events.emit(ev.StatusEvent(status=status.value, phase=phase, message=message, engine=self.engine_name))

    def warn(self, message: str) -> None:
        self.log(f"warning: {message}")
        self.events.emit(ev.WarningEvent(message=message))

    def complete(self, status: RunStatus, trainer, output: Path | None = None) -> None:
        history = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        self.events.emit(ev.CompleteEvent(status=status.value, output_dir=str(output or ""),
                                          steps=trainer.state.global_step,
                                          final_loss=history[-1] if history else None))
        self.log(f"finished: {status.value} at step {trainer.state.global_step}")

    def fail(self, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"
        if _is_oom(exc):
            message = f"{OOM_HINT} ({message})"
        tb = "".join(traceback.format_exception(exc))
        message, tb = self.redact(message), self.redact(tb)
        print(tb, file=sys.stderr, flush=True)
        if self.distributed:
            # The launcher reports the rank that failed first (a rank whose peer died fails too, later):
            # leave it this rank's account, with the time it failed.
            path = ranks.rank_error_path(self.run_dir, self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"message": message, "exc_type": type(exc).__name__, "ts": time.time()}))
            return
        self.events.emit(ev.ErrorEvent(message=message, exc_type=type(exc).__name__, traceback=tb[-8000:]))

    def log(self, message: str) -> None:
        print(self.redact(message), flush=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    # ------------------------------------------------------------------ control
    def requested(self) -> control.Action | None:
        if self.sigterm.is_set():
            return control.Action.CANCEL
        return control.read(self.run_dir)

    def check_cancel(self) -> None:
        # Under torchrun a rank leaving on its own would leave the others waiting in a collective: there,
        # Stop/Cancel take effect at the first step, decided by all ranks together (make_callback).
        if not self.distributed and self.requested() is not None:  # stop before training: nothing to save
            raise Cancelled()

    def check_gpus(self) -> None:
        """The GPUs NVML sees must be usable by torch (worker-only: imports torch)."""
        import torch

        if not hardware.cuda_available():
            return
        check_torch_sees_gpus(hardware.gpu_count(), torch.cuda.is_available(), torch.__version__,
                              torch.version.cuda, hardware.driver_version())

    def _watch_launcher(self, launcher_pid: int) -> None:
        """torchrun starts each rank in a session of its own, so a launcher killed outright (the OOM killer)
        would leave its ranks training, holding GPUs, for a run already marked failed: leave with it."""
        while not self._stop_heartbeat.wait(HEARTBEAT_S):
            if os.getppid() != launcher_pid:  # re-parented: the launcher is gone
                self.log(f"rank {self.rank}: the launcher (pid {launcher_pid}) is gone; exiting")
                os._exit(1)

    def _heartbeat(self) -> None:
        pid = os.getpid()
        while not self._stop_heartbeat.wait(HEARTBEAT_S):
            self.events.emit(ev.HeartbeatEvent(pid=pid))


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    # CUDA says "out of memory"; torch's CPU allocator says "DefaultCPUAllocator: can't allocate memory" (or
    # "not enough memory"): the same fix applies, so the same hint.
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text
            or "defaultcpuallocator" in text or "can't allocate memory" in text)


def make_callback(worker: Worker):
    """The Trainer callback that turns trainer logs into events and honours control requests."""
    from transformers import TrainerCallback  # the worker imports the ML stack only after choosing the engine

    class StudioCallback(TrainerCallback):
        def __init__(self):
            self.started = time.time()
            self.last = (self.started, 0)
            self.timed_from: tuple[float, int] | None = None  # (time, step) of the first logged step
            self.peak_mb = 0.0
            self.stopping = False
            self.best_eval: float | None = None
            self.evals_without_gain = 0
            self.refused_keys: set[str] = set()  # open metric keys whose name cannot be stored: warned once each
            # A method's own callbacks (GRPO's completion samples) report through the run's event log and warnings
            self.emit, self.warn = worker.events.emit, worker.warn

        def on_train_begin(self, args, state, control_, **kwargs):
            self.started = time.time()
            self.last = (self.started, state.num_input_tokens_seen or 0)

        def on_step_end(self, args, state, control_, **kwargs):
            action = worker.requested()
            if worker.distributed:
                action = agree(action, args.device)  # every rank, every step: all stop at the same step
                worker.agreed_action = action
            if action is None or self.stopping:
                return
            self.stopping = True
            control_.should_training_stop = True
            control_.should_save = action is control.Action.STOP
            worker.status(RunStatus.STOPPING, "saving checkpoint" if control_.should_save else "cancelling")

        def on_log(self, args, state, control_, logs=None, **kwargs):
            logs = logs or {}
            # Every numeric key the trainer logs is recorded, whatever the method: the fixed fields as their
            # own, the rest (eval_runtime, rewards/chosen, rewards/<function>/mean...) as open metrics.
            evaluated = {k: v for k, v in logs.items() if k.startswith("eval_")}
            if evaluated:
                worker.events.emit(ev.EvalEvent(step=state.global_step, eval_loss=logs.get("eval_loss"),
                                                metrics=self.open_metrics(evaluated)))
            if "loss" not in logs:
                return
            now = time.time()
            tokens = int(logs.get("num_tokens") or state.num_input_tokens_seen or 0)
            last_time, last_tokens = self.last
            rate = (tokens - last_tokens) / (now - last_time) if tokens and now > last_time else None
            self.last = (now, tokens)
            elapsed = now - self.started
            step, total = state.global_step, state.max_steps
            # The ETA is timed from the first logged step on: the first step also pays for compilation,
            # CUDA kernel autotuning and allocator warm-up, which later steps never repeat.
            if self.timed_from is None:
                self.timed_from = (now, step)
            since, from_step = self.timed_from
            done = step - from_step
            eta = (now - since) / done * (total - step) if done > 0 else None
            worker.events.emit(ev.ProgressEvent(
                step=step, total_steps=total, epoch=logs.get("epoch", state.epoch), loss=logs.get("loss"),
                learning_rate=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"),
                tokens_seen=tokens or None, tokens_per_s=rate, memory_mb=self.memory_mb(), elapsed_s=elapsed,
                eta_s=eta, metrics=self.open_metrics({k: v for k, v in logs.items() if k not in evaluated},
                                                     skip=("num_tokens",))))  # num_tokens is tokens_seen

        def open_metrics(self, logs: dict, skip: tuple[str, ...] = ()) -> dict[str, float]:
            values, refused = open_metrics(logs, skip)
            for key, problem in refused.items():
                if key not in self.refused_keys:
                    self.refused_keys.add(key)
                    worker.warn(f"The trainer logged a metric {key!r} that is not recorded: its name {problem}.")
            return values

        def on_evaluate(self, args, state, control_, metrics=None, **kwargs):
            patience = worker.early_stopping_patience
            loss = (metrics or {}).get("eval_loss")
            if not patience or loss is None or loss != loss:  # NaN never counts as an improvement
                self.evals_without_gain += bool(patience)
            elif self.best_eval is None or loss < self.best_eval:
                self.best_eval, self.evals_without_gain = loss, 0
            else:
                self.evals_without_gain += 1
            if patience and self.evals_without_gain >= patience and not control_.should_training_stop:
                control_.should_training_stop = True
                worker.warn(f"Early stopping at step {state.global_step}: eval loss has not improved for "
                            f"{patience} evaluation(s) (best {self.best_eval:.4f})." if self.best_eval is not None
                            else f"Early stopping at step {state.global_step}: eval loss is not finite.")

        def on_save(self, args, state, control_, **kwargs):
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            worker.events.emit(ev.CheckpointEvent(step=state.global_step, path=str(path)))

        def memory_mb(self) -> float:
            """Peak memory so far: on a GPU what the caching allocator reserved (what an OOM is about, and
            what nvidia-smi shows), not only what live tensors hold; on a CPU the process's resident set."""
            import torch

            if torch.cuda.is_available():
                current = torch.cuda.max_memory_reserved() / 2**20
            else:
                current = psutil.Process().memory_info().rss / 2**20
            self.peak_mb = max(self.peak_mb, current)
            return self.peak_mb

        def log_peak_memory(self) -> None:
            import torch

            if torch.cuda.is_available():
                worker.log(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB allocated, "
                           f"{torch.cuda.max_memory_reserved() / 2**20:.0f} MiB reserved")

    return StudioCallback()


def agree(action: control.Action | None, device) -> control.Action | None:
    """The strongest request any rank saw (cancel > stop > none), the same on every rank.

    Each rank reads control.json itself and may see a request one step before another: a tiny all-reduce
    per step makes them stop together (on GPUs the tensor lives on the rank's GPU, as NCCL needs)."""
    import torch
    import torch.distributed as dist

    codes = [None, control.Action.STOP, control.Action.CANCEL]
    flag = torch.tensor([codes.index(action)], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return codes[int(flag.item())]


def main(run_dir: Path) -> int:
    """The entry point of a training job (``python -m trainer_core.worker RUN_DIR`` picks it by kind)."""
    return Worker(run_dir).run()


def rows_are_chat(cfg: TrainConfig, rows: list[dict], tokenizer) -> bool:
    """Whether the run trains on conversations, so its sample prompts are rendered with the chat template: chat
    rows, message-list prompts, or text prompts that the method's worker half turns into a user turn (the
    preference methods' ``as_conversational``). Rendering those raw made DPO's samples look empty."""
    if not rows:
        return False
    if "messages" in rows[0] or isinstance(rows[0].get("prompt"), list):
        return True
    from trainer_core.worker import methods as worker_methods

    text_as_chat = getattr(worker_methods.get(cfg.method), "TEXT_PROMPTS_AS_CHAT", False)
    return isinstance(rows[0].get("prompt"), str) and text_as_chat and bool(getattr(tokenizer, "chat_template", None))


def _is_vision_model(cfg: TrainConfig) -> bool:
    """Whether the run's model is a vision-language model, from its config files (no weights); a model whose
    config cannot be read here is taken as text (loading it reports the real problem)."""
    from trainer_core.planning import model_info, modality

    try:
        return modality.detect_modality(cfg.model_name, os.environ.get("HF_TOKEN") or None).kind == modality.VISION
    except (model_info.ModelInfoError, OSError):
        return False
