"""One run on several processes through torchrun (``num_processes: 2`` on CPU: gloo), for real, through the
dashboard's orchestrator and the CLI: metrics once per step, Stop & save reaching every rank, and a
killed rank failing the run with its rank, reason and log tail. Slow: each run starts two workers."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from tests.support import ROOT
from trainer_core.protocol import paths
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.protocol.status import RunStatus

pytestmark = pytest.mark.train


def tiny_two_process(tiny_model, **values) -> TrainConfig:
    base = dict(model_name=str(tiny_model), num_processes=2, max_steps=6, batch_size=2, max_seq_length=128,
                logging_steps=1, warmup_steps=0)
    return TrainConfig(**{**base, **values})


def wait_for(condition, timeout: float = 240, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the workers torchrun started under the launcher."""
    found = {}
    for proc in psutil.Process(launcher_pid).children(recursive=True):
        try:
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "RANK" in env and "trainer_core.worker" in " ".join(proc.cmdline()):
            found[int(env["RANK"])] = proc.pid
    return found


def test_two_processes_train_one_run_with_one_metrics_row_per_step(studio, tiny_model):
    # Rank 0 alone samples (at steps 3 and 6) while the other rank waits in its next collective.
    run_id = studio.start(tiny_two_process(tiny_model, sample_prompts=["Hi?"], sample_every_steps=3,
                                           sample_max_new_tokens=4))
    snap = studio.wait(run_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, (snap.error, studio.log_tail(run_id))
    frame = studio.metrics(run_id)
    losses = frame.dropna(subset=["loss"])
    assert list(losses["step"]) == [1, 2, 3, 4, 5, 6]  # rank 0 alone reports: one row per step, not two
    run_dir = paths.run_dir(run_id)
    assert (run_dir / "events.jsonl").read_text().count('"kind":"progress"') == 6
    # 300 demo rows, batch 2 on each of 2 processes: 75 steps per epoch, so step 6 is epoch 0.08
    assert losses["epoch"].iloc[-1] == pytest.approx(6 / 75)
    log = studio.log_text(run_id)
    assert "[default0]:" in log and "[default1]:" in log  # both ranks trained, their output tagged
    assert (run_dir / "adapter" / "adapter_config.json").exists()
    assert [(s.step, s.index) for s in studio.samples(run_id)] == [(6, 0), (3, 0)]  # once each, from rank 0


def test_stop_and_save_reaches_every_rank(studio, tiny_model):
    run_id = studio.start(tiny_two_process(tiny_model, max_steps=400))
    wait_for(lambda: (studio.snapshot(run_id).step or 0) >= 2, what="two steps")
    launcher = studio.get_run(run_id).pid
    ranks = rank_pids(launcher)
    assert sorted(ranks) == [0, 1]
    studio.stop(run_id)
    snap = studio.wait(run_id, timeout=180)
    assert snap.status is RunStatus.STOPPED, (snap.error, studio.log_tail(run_id))
    run_dir = paths.run_dir(run_id)
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    assert len(saved) == 1
    assert (run_dir / "adapter" / "adapter_config.json").exists()
    # both ranks stopped at the same step and left on their own (no rank left waiting in a collective)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in ranks.values())
    log = studio.log_text(run_id)
    step = int(saved[0].split("-")[1])
    assert f"[default0]:finished: stopped at step {step}" in log
    assert f"[default1]:finished: stopped at step {step}" in log


def test_a_killed_rank_fails_the_run_with_its_rank_reason_and_log(studio, tiny_model):
    run_id = studio.start(tiny_two_process(tiny_model, max_steps=400))
    wait_for(lambda: (studio.snapshot(run_id).step or 0) >= 1, what="the first step")
    ranks = rank_pids(studio.get_run(run_id).pid)
    psutil.Process(ranks[1]).send_signal(signal.SIGKILL)
    snap = studio.wait(run_id, timeout=180)
    assert snap.status is RunStatus.FAILED
    assert snap.error == "Rank 1 of 2 was killed by SIGKILL (often the out-of-memory killer)"
    assert "---- last lines of rank 1:" in snap.log_tail
    assert "[starting] loading model" in snap.log_tail.split("---- last lines of rank 1:")[1]
    assert not psutil.pid_exists(ranks[0]) or psutil.Process(ranks[0]).status() == psutil.STATUS_ZOMBIE


def test_cancel_reaches_every_rank_and_saves_nothing(studio, tiny_model):
    run_id = studio.start(tiny_two_process(tiny_model, max_steps=400))
    wait_for(lambda: (studio.snapshot(run_id).step or 0) >= 1, what="the first step")
    studio.cancel(run_id)
    snap = studio.wait(run_id, timeout=180)
    assert snap.status is RunStatus.CANCELLED, (snap.error, studio.log_tail(run_id))
    run_dir = paths.run_dir(run_id)
    assert not list((run_dir / "checkpoints").glob("*checkpoint-*")) and not (run_dir / "adapter").exists()
    log = studio.log_text(run_id)
    assert "[default0]:finished: cancelled" in log and "[default1]:finished: cancelled" in log


def test_ranks_leave_when_the_launcher_is_killed(studio, tiny_model):
    run_id = studio.start(tiny_two_process(tiny_model, max_steps=400))
    wait_for(lambda: (studio.snapshot(run_id).step or 0) >= 1, what="the first step")
    launcher = studio.get_run(run_id).pid
    ranks = rank_pids(launcher)
    psutil.Process(launcher).send_signal(signal.SIGKILL)  # what the OOM killer does: no chance to stop its ranks
    snap = studio.wait(run_id, timeout=120)
    assert snap.status is RunStatus.FAILED and "was killed by SIGKILL" in snap.error
    wait_for(lambda: not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                             for pid in ranks.values()), timeout=60, what="the orphaned ranks to exit")
    # (a rank leaves either when its next collective or store call fails, or when its launcher watch sees it
    # re-parented, whichever comes first: the watch covers ranks that make no such call, e.g. during a save)


def test_the_cli_trains_the_bundled_model_on_two_processes(tmp_path):
    config = tmp_path / "two.yaml"
    config.write_text(yaml.safe_dump({"model_name": BUNDLED_MODEL, "num_processes": 2, "max_steps": 3,
                                      "batch_size": 1, "max_seq_length": 64, "logging_steps": 1,
                                      "warmup_steps": 0}))
    env = {"FINETUNE_STUDIO_HOME": str(tmp_path / "home"), "FINETUNE_STUDIO_FORCE_CPU": "1",
           "FINETUNE_STUDIO_MODELS": str(ROOT / ".test-cache" / "models"),
           "FINETUNE_STUDIO_ALLOWED_ROOTS": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "trainer_core", "run", "--config", str(config)],
                            capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "final status: completed" in result.stdout
    run_dir = next((tmp_path / "home" / "runs").iterdir())
    events = (run_dir / "events.jsonl").read_text()
    assert events.count('"kind":"progress"') == 3
    assert (run_dir / "adapter" / "adapter_config.json").exists()
