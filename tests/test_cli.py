"""The headless CLI's `runs` commands against a real store under an isolated data root."""
from __future__ import annotations

import io
import json
import os

import pandas as pd
import psutil
import pytest
import yaml

from db.entities import RunRecord
from db.store import Store
from tests.support import fake
from tests.support.factories import insert_finished_run
from trainer_core.__main__ import main
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus


@pytest.fixture
def runs(home):
    store = Store()
    insert_finished_run(store, "20260101-000000-aaaaaa", "first run", [2.0, 1.5, float("nan"), 1.0],
                        eval_losses={2: 1.7})
    store.add_event("20260101-000000-aaaaaa", "alert", "Grad norm 84.2 at step 3 is 21x its recent median (4.0).")
    insert_finished_run(store, "20260101-000000-bbbbbb", "second run", [3.0, 2.0], status=RunStatus.FAILED,
                        error="RuntimeError: boom")
    yield store
    store.engine.dispose()


def test_runs_show_prints_no_stale_phase_of_a_finished_run(runs, capsys):
    # rows finished before finish_run cleared the phase still say "saving"
    runs.create_run(RunRecord(id="20260101-000000-cccccc", name="old row", status=RunStatus.COMPLETED.value,
                        phase="saving"))
    paths.run_dir("20260101-000000-dddddd").mkdir(parents=True)  # under way: its worker is alive (this process)
    runs.create_run(RunRecord(id="20260101-000000-dddddd", name="training", status=RunStatus.RUNNING.value,
                        phase="saving", pid=os.getpid(), pid_started_at=psutil.Process().create_time()))
    assert main(["runs", "show", "20260101-000000-cccccc"]) == 0
    assert "status          Completed\n" in capsys.readouterr().out
    assert main(["runs", "show", "20260101-000000-dddddd"]) == 0  # under way: the phase is news
    assert "status          Training (saving)\n" in capsys.readouterr().out
    runs.finish_run("20260101-000000-dddddd", RunStatus.STOPPED)
    assert runs.get_run("20260101-000000-dddddd").phase == ""


def test_runs_show_prints_the_summary(runs, capsys):
    assert main(["runs", "show", "20260101-000000-aaaaaa"]) == 0
    out = capsys.readouterr().out
    assert "name            first run" in out
    assert "status          Completed" in out
    assert "steps           4/4" in out
    assert "final loss      1.0000" in out
    assert "best eval loss  —" in out  # the fixture stores eval rows but not the run's best value
    assert "alerts          1" in out
    assert "alert: Grad norm 84.2 at step 3 is 21x its recent median (4.0)." in out


def test_runs_show_accepts_a_unique_prefix_or_name_and_explains_ambiguity(runs, capsys):
    assert main(["runs", "show", "second run"]) == 0
    assert "error: RuntimeError: boom" in capsys.readouterr().out
    assert main(["runs", "show", "20260101"]) == 2
    assert "matches 2 runs" in capsys.readouterr().err
    assert main(["runs", "show", "nothing"]) == 2
    assert "no run matches 'nothing'" in capsys.readouterr().err


def test_runs_export_csv_writes_every_metric_row(runs, tmp_path, capsys):
    target = tmp_path / "m.csv"
    assert main(["runs", "export", "20260101-000000-aaaaaa", "--format", "csv", "-o", str(target)]) == 0
    frame = pd.read_csv(target)
    assert list(frame["step"]) == [1, 2, 3, 4]
    assert list(frame["loss"].fillna(-1)) == [2.0, 1.5, -1, 1.0]  # NaN is stored as an empty value
    assert frame.loc[1, "eval_loss"] == 1.7


def test_runs_export_to_stdout_as_jsonl_and_config_as_yaml(runs, capsys):
    assert main(["runs", "export", "20260101-000000-bbbbbb", "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in io.StringIO(capsys.readouterr().out)]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 3.0), (2, 2.0)]
    assert main(["runs", "export", "20260101-000000-bbbbbb", "--format", "yaml"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["learning_rate"] == 0.0002 and "hf_token" not in config and "wandb_token" not in config


def test_runs_lists_newest_first(runs, capsys):
    assert main(["runs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("id")
    assert [line.split()[0] for line in out[1:]] == ["20260101-000000-bbbbbb", "20260101-000000-aaaaaa"]


def test_runs_show_says_resumed_only_for_a_resumed_training_run(runs, capsys):
    # an eval/export/serve job's parent is the run it works on, not a run it resumed ("at step None")
    for kind, run_id in (("eval", "20260101-000000-eeeeee"), ("export", "20260101-000000-ffffff"),
                         ("serve", "20260101-000000-gggggg")):
        runs.create_run(RunRecord(id=run_id, name=f"{kind} job", kind=kind, parent_run_id="20260101-000000-aaaaaa",
                                  status=RunStatus.COMPLETED.value))
        assert main(["runs", "show", run_id]) == 0
        assert "resumed from" not in capsys.readouterr().out
    runs.create_run(RunRecord(id="20260101-000000-hhhhhh", name="resumed", parent_run_id="20260101-000000-aaaaaa",
                              resumed_from_step=2, status=RunStatus.COMPLETED.value))
    assert main(["runs", "show", "20260101-000000-hhhhhh"]) == 0
    assert "resumed from    20260101-000000-aaaaaa at step 2\n" in capsys.readouterr().out


# ---------------------------------------------------------------------- runs nobody follows
def started_then_left(store, fake_worker, monkeypatch, steps: int = 3) -> str:
    """A run whose `run` command died at once: its worker goes on, and no dashboard or CLI reads its log."""
    first = Orchestrator(store=store, launcher=fake_worker, start_pump=False)
    run_id = first.start(fake(monkeypatch, steps=steps))
    first.close()
    monkeypatch.setenv("DATABASE_URL", store.url)  # the CLI's commands, on the same database
    return run_id


def test_runs_follow_follows_a_run_again_after_its_run_command_died(home, store, fake_worker, monkeypatch, capsys):
    run_id = started_then_left(store, fake_worker, monkeypatch)
    assert main(["runs", "follow", run_id]) == 0
    out = capsys.readouterr().out
    assert "final status: completed" in out and "[" + "█" * 30 + "] 3/3" in out
    assert store.get_run(run_id).status is RunStatus.COMPLETED


@pytest.mark.parametrize("command", ["runs", "runs show"])
def test_runs_read_the_log_of_a_run_that_ended_while_nobody_followed_it(home, store, fake_worker, monkeypatch,
                                                                        capsys, command):
    run_id = started_then_left(store, fake_worker, monkeypatch)
    fake_worker.spawned[-1].wait(timeout=60)  # its worker finished; nobody has read its log
    assert not store.get_run(run_id).status.is_terminal()
    assert main(command.split() + ([run_id] if command == "runs show" else [])) == 0
    out = capsys.readouterr().out
    if command == "runs":
        assert [line.split()[1] for line in out.splitlines() if line.startswith(run_id)] == ["completed"]
    else:
        assert "status          Completed\n" in out
    run = store.get_run(run_id)
    assert run.status is RunStatus.COMPLETED and run.steps_done == 3
