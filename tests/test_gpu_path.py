"""The GPU path on a CPU machine: validation of GPU options, how a run is launched and numbered on a GPU
host, which rank is blamed when one dies, and (in worker-side subprocesses, with CUDA, Unsloth and
bitsandbytes faked) what the engines pass to the libraries. What only a GPU can show is in
bench/gpu_smoke.py."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import FakeLauncher, run_python
from trainer_core.host import parallel
from trainer_core.host import hardware
from trainer_core.jobs import queue as scheduling
from trainer_core.worker import engines, ranks, train
from trainer_core.protocol import paths
from trainer_core.config import FieldError, TrainConfig


def errors(**values) -> list[FieldError]:
    return TrainConfig(**values).validate()


# ====================================================================== validation (items 2-5)
def test_full_finetuning_cannot_load_in_4bit(home, fake_gpu_host):
    assert errors(adapter="full", load_in_4bit=True) == [FieldError(
        "load_in_4bit", "full fine-tuning trains every weight and cannot train 4-bit weights: turn 4-bit loading "
        "off, or choose QLoRA")]


def test_loftq_needs_a_16_bit_base(home, fake_gpu_host):
    message = ("LoftQ quantizes a 16-bit base itself and cannot start from a 4-bit one: turn LoftQ off, or turn "
               "4-bit loading off (adapter lora)")
    assert errors(adapter="qlora", use_loftq=True) == [FieldError("use_loftq", message)]
    assert errors(adapter="lora", load_in_4bit=True, use_loftq=True) == [FieldError("use_loftq", message)]
    assert errors(adapter="lora", use_loftq=True) == []
    assert "not with 4-bit loading" in TrainConfig.help("use_loftq") and "Unsloth only" not in TrainConfig.help("use_loftq")


def test_cuda_without_bitsandbytes_is_refused_early(home, monkeypatch):
    monkeypatch.setattr(hardware, "cuda_available", lambda: True)
    monkeypatch.setattr(hardware, "gpu_count", lambda: 1)
    real = hardware.has_module
    monkeypatch.setattr(hardware, "has_module", lambda name: name != "bitsandbytes" and real(name))
    hint = "install the gpu extra"
    got = errors(adapter="qlora", optim="adamw_8bit") + errors(adapter="lora", use_loftq=True)
    assert [e.field for e in got] == ["adapter", "optim", "use_loftq"]
    assert all("bitsandbytes" in e.message and hint in e.message for e in got)


def test_gpu_ids_are_checked_against_the_host(home, fake_gpu_host):
    assert errors(gpu_ids=[0, 1]) == []
    assert errors(gpu_ids=[1, 2, 3]) == [FieldError(
        "gpu_ids", "this host has 2 GPU(s), numbered 0 to 1 (nvidia-smi order): remove 2, 3")]
    assert errors(gpu_ids=[0, 0]) == [FieldError("gpu_ids", "list each GPU once")]


def test_num_processes_against_the_run_gpus(home, fake_gpu_host):
    assert errors(num_processes=3) == [FieldError(
        "num_processes", "3 processes need as many GPUs, but the run has 2: list more gpu_ids, or lower "
        "num_processes (0: one per GPU)")]
    assert errors(gpu_ids=[0, 1], num_processes=1) == [FieldError(
        "num_processes", "gpu_ids lists 2 GPUs but num_processes is 1: list only the GPUs the run should use "
        "(each process trains on one), or set num_processes to 0")]
    assert errors(num_processes=-1) == [FieldError(
        "num_processes", "use 0 (automatic) or a positive number of processes, got -1")]
    assert errors(gpu_ids=[1], num_processes=1) == errors(num_processes=2) == []


def test_num_processes_on_cpu(home):
    assert errors(num_processes=2) == []
    assert errors(num_processes=65) == [FieldError(
        "num_processes", "at most 64 processes on CPU (each one holds a full copy of the model)")]


# ====================================================================== processes, devices, batch (item 6)
def test_process_count_devices_and_global_batch():
    cfg = TrainConfig(batch_size=4, gradient_accumulation_steps=2)
    assert parallel.process_count(cfg, cuda=False) == 1
    assert parallel.process_count(dataclasses.replace(cfg, num_processes=2), cuda=False) == 2
    assert parallel.process_count(cfg, cuda=True, count=4) == 4  # one per visible GPU
    assert parallel.process_count(dataclasses.replace(cfg, gpu_ids=[2, 3]), cuda=True, count=4) == 2
    assert parallel.global_batch(cfg, 4) == 32
    # one process on a several-GPU host is pinned to GPU 0 and reserves only it (no nn.DataParallel)
    single = dataclasses.replace(cfg, num_processes=1)
    assert parallel.run_gpus(single, cuda=True) == [0]
    assert scheduling.devices_of(single, cuda=True) == "gpu0"
    assert scheduling.devices_of(cfg, cuda=True) == "gpu*"


def test_steps_per_epoch_under_data_parallelism():
    # 270 rows in batches of 4: 68 batches, dealt to 2 processes: 34 each; accumulation 4: 9 updates
    assert parallel.steps_per_epoch(270, 4, 4, processes=2) == 9
    assert parallel.steps_per_epoch(270, 4, 1, processes=2) == 34
    assert parallel.steps_per_epoch(300, 2, 1, processes=2) == 75
    assert parallel.steps_per_epoch(270, 4, 1) == 68 and parallel.steps_per_epoch(0, 4, 1, 2) == 0


def test_unsloth_trains_only_single_process_runs(monkeypatch):
    monkeypatch.setattr(hardware, "unsloth_usable", lambda: True)
    monkeypatch.delenv(engines.ENGINE_ENV, raising=False)
    assert engines.choose_engine(1) == "unsloth"
    assert engines.choose_engine(2) == "transformers"
    # a vision-language model too: FastVisionModel (tests/test_unsloth_vision.py)
    assert engines.choose_engine(1, vision=True) == "unsloth"
    # a run continuing a saved adapter (init_adapter): peft loads it trainable, Unsloth starts new adapters only
    assert engines.choose_engine(1, continues_adapter=True) == "transformers"


def test_fsdp_only_when_a_copy_does_not_fit():
    full = TrainConfig(adapter="full")
    assert parallel.use_fsdp(full, 2, need_gb=90.0, gpu_free_gb=80.0) is True
    assert parallel.use_fsdp(full, 2, need_gb=60.0, gpu_free_gb=80.0) is False
    assert parallel.use_fsdp(full, 1, need_gb=90.0, gpu_free_gb=80.0) is False
    assert parallel.use_fsdp(TrainConfig(adapter="qlora"), 2, need_gb=90.0, gpu_free_gb=80.0) is False


# ====================================================================== launch environment (items 6, 7, 14)
# The stand-in worker reports where it runs and with which environment, then exits.
REPORT_SPAWN = "import json, os, sys; print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ)}))"


@pytest.fixture
def spawn_args(home):
    """The command the launcher would run for a config, and the cwd and environment the process got."""
    launcher = FakeLauncher(REPORT_SPAWN)

    def spawn(cfg: TrainConfig) -> tuple[Path, list[str], dict]:
        run_dir = paths.run_dir(f"spawn-{len(launcher.commands)}")
        run_dir.mkdir(parents=True)
        assert launcher.spawn(run_dir, cfg).wait(timeout=60) == 0
        got = json.loads((run_dir / "worker.log").read_text().strip().splitlines()[-1])
        return run_dir, launcher.commands[-1], {"cwd": Path(got["cwd"]), "env": got["env"]}

    yield spawn
    launcher.kill_all()


def test_a_single_gpu_run_starts_the_worker_in_its_folder_in_pci_order(spawn_args, fake_gpu_host):
    run_dir, args, kwargs = spawn_args(TrainConfig(gpu_ids=[1]))
    assert args == [sys.executable, "-m", "trainer_core.worker", str(run_dir)]  # exactly as before
    env = kwargs["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA ordinals = NVML indices = gpu_ids
    assert env[parallel.NPROC_ENV] == "1"
    # Unsloth's compiled modules land in the run folder, which is also the worker's cwd (not the repository)
    assert kwargs["cwd"] == run_dir and env["UNSLOTH_COMPILE_LOCATION"] == str(run_dir / "unsloth_compiled_cache")
    # relative to the dashboard's cwd, not the run folder's: the allowed roots are pinned
    assert env["FINETUNE_STUDIO_ALLOWED_ROOTS"] == os.pathsep.join(str(r) for r in paths.allowed_data_roots())


def test_a_two_gpu_run_starts_torchrun(spawn_args, fake_gpu_host):
    run_dir, args, kwargs = spawn_args(TrainConfig(gpu_ids=[0, 1]))
    assert args == [sys.executable, "-m", "trainer_core.worker.launch", str(run_dir)]
    assert kwargs["env"][parallel.NPROC_ENV] == "2" and kwargs["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    _, _, pinned = spawn_args(TrainConfig(num_processes=1))
    assert pinned["env"]["CUDA_VISIBLE_DEVICES"] == "0"  # one process never sees (and wraps) a second GPU


def test_two_cpu_processes_use_the_same_launcher(spawn_args):
    run_dir, args, kwargs = spawn_args(TrainConfig(num_processes=2))
    assert args == [sys.executable, "-m", "trainer_core.worker.launch", str(run_dir)]
    assert "CUDA_VISIBLE_DEVICES" not in kwargs["env"] or kwargs["env"]["CUDA_VISIBLE_DEVICES"] == \
        os.environ.get("CUDA_VISIBLE_DEVICES")


# ====================================================================== a failed rank
def failures(**exits: int) -> dict:
    return {int(rank[1:]): SimpleNamespace(exitcode=code) for rank, code in exits.items()}


def write_error(run_dir: Path, rank: int, message: str, ts: float) -> None:
    path = ranks.rank_error_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"message": message, "exc_type": "RuntimeError", "ts": ts}))


def test_the_rank_killed_by_a_signal_is_blamed_not_the_ranks_stopped_after_it(tmp_path):
    # rank 1 was killed; rank 0 then failed in its collective, rank 2 was stopped by torchrun
    write_error(tmp_path, 0, "RuntimeError: Connection closed by peer", ts=10.0)
    got = ranks.root_cause(failures(r0=1, r1=-signal.SIGKILL, r2=-signal.SIGTERM), tmp_path)
    assert got == (1, "was killed by SIGKILL (often the out-of-memory killer)", "RankKilled")


def test_the_earliest_reported_error_is_blamed(tmp_path):
    write_error(tmp_path, 0, "RuntimeError: peer gone", ts=12.0)
    write_error(tmp_path, 1, "OutOfMemoryError: CUDA out of memory", ts=11.0)
    got = ranks.root_cause(failures(r0=1, r1=1), tmp_path)
    assert got == (1, "failed: OutOfMemoryError: CUDA out of memory", "RuntimeError")
    assert ranks.root_cause(failures(r0=-signal.SIGTERM, r1=3), tmp_path / "none") == \
        (1, "exited with code 3", "RankFailed")


def test_rank_log_tail_reads_torchruns_per_rank_files(tmp_path):
    folder = tmp_path / "ranks" / "abc_x" / "attempt_0" / "1"
    folder.mkdir(parents=True)
    (folder / "stdout.log").write_text("".join(f"line {i}\n" for i in range(100)))
    (folder / "stderr.log").write_text("Traceback\nValueError: boom\n")
    tail = ranks.rank_log_tail(tmp_path, 1, lines=5)
    assert tail.splitlines() == ["line 97", "line 98", "line 99", "Traceback", "ValueError: boom"]


# ====================================================================== torch must see the GPUs (item 5)
def test_a_driver_too_old_for_torch_fails_fast_with_both_versions():
    with pytest.raises(train.GpuUnusableError) as info:
        train.check_torch_sees_gpus(2, False, "2.14.1+cu130", "13.0", "550.54")
    assert str(info.value).startswith("This host has 2 NVIDIA GPU(s) (driver 550.54), but torch 2.14.1+cu130 (CUDA "
                                      "13.0) cannot use them. Install a torch build whose CUDA version the driver "
                                      "supports")
    with pytest.raises(train.GpuUnusableError, match=r"torch 2.13.0\+cpu \(a CPU-only build\)"):
        train.check_torch_sees_gpus(1, False, "2.13.0+cpu", None, "")
    train.check_torch_sees_gpus(2, True, "2.14.1+cu128", "12.8", "570.1")  # usable: no error
    train.check_torch_sees_gpus(0, False, "2.13.0+cpu", None, "")  # no GPU at all: CPU training


# ====================================================================== engines, worker side (items 10-13, 15)
UNSLOTH_STUB = textwrap.dedent("""
    import json, sys, types
    # A stand-in for the unsloth package (CUDA only): records what the engine passes to it.
    calls = []
    class Tokenizer:
        pad_token, eos_token = None, "<|im_end|>"
    class FastLanguageModel:
        @staticmethod
        def from_pretrained(**kwargs):
            calls.append(["from_pretrained", kwargs])
            return "model", Tokenizer()
        @staticmethod
        def get_peft_model(model, **kwargs):
            calls.append(["get_peft_model", kwargs])
            return model
    # the vision path's collator, subclassed at import (tests/test_unsloth_vision.py fakes what it does)
    trainer = types.SimpleNamespace(UnslothVisionDataCollator=type("UnslothVisionDataCollator", (), {}))
    sys.modules["unsloth"] = types.SimpleNamespace(FastLanguageModel=FastLanguageModel, FastVisionModel=None,
                                                   trainer=trainer)
    sys.modules["unsloth.trainer"] = trainer
    from trainer_core.config import TrainConfig
    from trainer_core.worker import model_resolver
    from trainer_core.worker.engines import unsloth_engine
    model_resolver.resolve = lambda *args: model_resolver.Resolved("text", None, "llama")  # /models/m: a text model

    for values in json.loads(sys.argv[1]):
        unsloth_engine.load_model(TrainConfig(**values), "/models/m", None)
    print(json.dumps(calls, default=str))
""")


@pytest.mark.subprocess  # starts a transformers subprocess
def test_unsloth_gets_exact_name_checkpointing_and_fp32_master_weights():
    cases = [{"adapter": "full", "gradient_checkpointing": True},
             {"method": "cpt", "embedding_learning_rate": 5e-5, "gradient_checkpointing": False}]
    result = run_python(UNSLOTH_STUB, json.dumps(cases))
    assert result.returncode == 0, result.stderr[-3000:]
    calls = json.loads(result.stdout.strip().splitlines()[-1])
    assert [name for name, _ in calls] == ["from_pretrained", "from_pretrained", "get_peft_model"]
    full, cpt, peft = calls[0][1], calls[1][1], calls[2][1]
    assert full["full_finetuning"] is True and full["use_gradient_checkpointing"] == "unsloth"
    assert full["use_exact_model_name"] is True and full["float32_mixed_precision"] is True
    assert cpt["use_exact_model_name"] is True and cpt["float32_mixed_precision"] is None
    assert cpt["use_gradient_checkpointing"] is False and peft["use_gradient_checkpointing"] is False
    assert peft["target_modules"][-2:] == ["embed_tokens", "lm_head"]  # trained in full (modules_to_save)


FAKE_CUDA = textwrap.dedent("""
    import json, os, sys
    import torch, peft
    # A CUDA host with an fp16-only GPU (a T4, a V100), faked: nothing here reaches a GPU.
    torch.cuda.is_available = lambda: True
    torch.cuda.is_bf16_supported = lambda *a, **k: False
    seen = {}
    class Recorder:
        def __init__(self, **kwargs):
            seen["bnb"] = {k: str(v) for k, v in kwargs.items()}
    from trainer_core.worker.engines import transformers_engine as te
    # the real one needs bitsandbytes; `from transformers import` reads sys.modules' entry, which
    # transformers swaps for another lazy module object while importing
    sys.modules["transformers"].BitsAndBytesConfig = Recorder
    def from_pretrained(ref, **kwargs):
        seen["load"] = {k: str(v) for k, v in kwargs.items() if k != "quantization_config"}
        return "model"
    from trainer_core.worker import model_resolver  # the engine loads the class the resolver picks
    model_resolver.AutoModelForCausalLM = type("Auto", (), {"from_pretrained": staticmethod(from_pretrained)})
    peft.prepare_model_for_kbit_training = lambda model, **kwargs: model
    from trainer_core.config import TrainConfig
    os.environ["LOCAL_RANK"] = "1"
    te.load_model(TrainConfig(adapter="qlora"), sys.argv[1], None)
    qlora = dict(seen)
    te.load_model(TrainConfig(adapter="full"), sys.argv[1], None)
    print(json.dumps({"qlora": qlora, "full": seen["load"], "compute": str(te.compute_dtype())}))
""")


@pytest.mark.subprocess  # starts a transformers subprocess
def test_qlora_computes_in_the_gpus_dtype_and_full_finetuning_keeps_fp32(tiny_model):
    result = run_python(FAKE_CUDA, str(tiny_model))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["compute"] == "torch.float16"
    assert out["qlora"]["bnb"]["bnb_4bit_compute_dtype"] == "torch.float16"  # not bf16 on a GPU without it
    assert out["qlora"]["load"]["dtype"] == "torch.float16"
    assert out["full"]["dtype"] == "torch.float32"  # fp32 master weights; autocast computes in fp16
    assert out["qlora"]["load"]["device_map"] == "{'': 1}"  # torchrun's LOCAL_RANK picks the process's GPU


OPTIMIZER = textwrap.dedent("""
    import json, sys
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig
    from trainer_core.worker.methods import cpt

    model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    out = {}
    for optim in ("adamw_torch", "adafactor", "sgd"):
        args = SFTConfig(output_dir=sys.argv[2], optim=optim, learning_rate=2e-4, weight_decay=0.01, use_cpu=True,
                         report_to=[])
        opt = cpt.embedding_aware_optimizer(model, args, 5e-5)
        out[optim] = [type(opt).__name__, [g["lr"] for g in opt.param_groups],
                      [len(g["params"]) for g in opt.param_groups]]
    print(json.dumps(out))
""")


@pytest.mark.subprocess  # starts a transformers subprocess
def test_the_embedding_learning_rate_optimizer_is_the_one_optim_names(tiny_model, tmp_path):
    result = run_python(OPTIMIZER, str(tiny_model), str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert {name: got[0] for name, got in out.items()} == {"adamw_torch": "AdamW", "adafactor": "Adafactor",
                                                           "sgd": "SGD"}
    # tiny Llama (tied embeddings): 1 embedding tensor at 5e-5, the other 19 tensors at 2e-4
    assert out["sgd"][1:] == [[2e-4, 5e-5], [19, 1]]


ETA = textwrap.dedent("""
    import json, types
    from trainer_core.worker import train
    clock = [0.0]
    train.time = types.SimpleNamespace(time=lambda: clock[0])
    emitted = []
    warnings = []
    fake = types.SimpleNamespace(events=types.SimpleNamespace(emit=emitted.append), requested=lambda: None,
                                 distributed=False, warn=warnings.append)
    callback = train.make_callback(fake)
    callback.memory_mb = lambda: 0.0
    state = types.SimpleNamespace(global_step=0, max_steps=10, num_input_tokens_seen=0, epoch=0.0)
    callback.on_train_begin(None, state, None)
    for step, now in ((1, 90.0), (2, 91.0), (3, 92.0)):  # step 1 paid 90 s of compilation
        clock[0], state.global_step = now, step
        callback.on_log(None, state, None, logs={"loss": 1.0})
    print(json.dumps([e.eta_s for e in emitted]))
""")


@pytest.mark.subprocess  # starts a transformers subprocess
def test_eta_leaves_out_the_first_steps_warm_up():
    result = run_python(ETA)
    assert result.returncode == 0, result.stderr[-3000:]
    # timed from step 1 on: 1 s per step; the 90 s of the first step would have said 30 s per step
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [None, 8.0, 7.0]


WATCH = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    os.environ.update(RANK="1", WORLD_SIZE="2")
    from trainer_core.worker import train
    w = train.Worker(Path(sys.argv[1]))
    train.HEARTBEAT_S = 0.01
    w._watch_launcher(os.getppid() + 1)  # as if re-parented: the launcher that started this rank is gone
    print("still here")
""")


def test_a_rank_leaves_when_its_launcher_is_gone(tmp_path):
    result = run_python(WATCH, str(tmp_path))
    assert result.returncode == 1
    # the child's parent is this test process: it watched for pid os.getpid() + 1 and found itself re-parented
    assert result.stdout.strip() == f"rank 1: the launcher (pid {os.getpid() + 1}) is gone; exiting"
