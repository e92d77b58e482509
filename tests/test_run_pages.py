"""History (queue, resume, delete, compare), Run details (timeline, log filter, downloads) and Live
(alerts, resources, chart options) through AppTest, against a real store and data root."""
from __future__ import annotations

import os
import time

import psutil
import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus


def buttons(at, label: str):
    return [b for b in at.button if b.label == label]


def busy(store: Store) -> str:
    """A run 'training' in this very process (alive pid), so queued runs stay queued."""
    run_id = "20251231-000000-000000"
    store.create_run(RunRecord(id=run_id, name="busy", status=RunStatus.RUNNING.value, created_at=time.time(),
                         pid=os.getpid(), pid_started_at=psutil.Process().create_time(), devices="cpu"))
    paths.run_dir(run_id).mkdir(parents=True)
    return run_id


def queued(store: Store, run_id: str, name: str, position: float) -> None:
    store.create_run(RunRecord(id=run_id, name=name, status=RunStatus.QUEUED.value, model="m", method="LoRA",
                         created_at=time.time(), queue_position=position, devices="cpu"))


@pytest.fixture
def pages_store(app_home):
    store = Store()
    yield store
    store.engine.dispose()


# ---------------------------------------------------------------------- History: queue
def test_history_lists_the_queue_and_reorders_and_removes(pages_store):
    insert_finished_run(pages_store, "20260101-000000-aaaaaa", "done", [2.0, 1.0])
    busy(pages_store)
    queued(pages_store, "20260101-000001-bbbbbb", "first in line", 1.0)
    queued(pages_store, "20260101-000002-cccccc", "second in line", 2.0)
    at = open_page("pages/history.py")
    assert [s.value for s in at.subheader] == ["Queue (2)"]
    assert any(m.value.startswith("**1.** first in line") for m in at.markdown)
    at.button(key="q_up_20260101-000002-cccccc").click().run()
    assert [r.name for r in pages_store.queued_runs()] == ["second in line", "first in line"]
    at.button(key="q_remove_20260101-000001-bbbbbb").click().run()
    assert [r.name for r in pages_store.queued_runs()] == ["second in line"]
    removed = pages_store.get_run("20260101-000001-bbbbbb")
    assert (removed.status, removed.phase) == ("cancelled", "removed from the queue")
    assert [s.value for s in at.subheader] == ["Queue (1)"]


# ---------------------------------------------------------------------- History: delete
@pytest.mark.parametrize("with_files", [False, True])
def test_delete_asks_first_and_can_remove_the_folder(pages_store, with_files):
    run_id = "20260101-000000-dddddd"
    insert_finished_run(pages_store, run_id, "to delete", [2.0, 1.0])
    folder = paths.run_dir(run_id)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "worker.log").write_text("log\n")
    at = open_page("pages/history.py")
    buttons(at, "Delete")[0].click().run()
    assert pages_store.get_run(run_id) is not None  # nothing happens before the confirmation
    assert any("Delete **to delete** from History?" in w.value for w in at.warning)
    buttons(at, "Keep it")[0].click().run()
    assert pages_store.get_run(run_id) is not None and not at.warning

    buttons(at, "Delete")[0].click().run()
    if with_files:
        at.checkbox(key="history_delete_files").check().run()
    buttons(at, "Yes, delete")[0].click().run()
    assert not at.exception
    assert pages_store.get_run(run_id) is None
    assert folder.exists() is not with_files


def test_delete_is_disabled_for_active_runs_and_refused_by_the_orchestrator(pages_store):
    from ui.state import get_orchestrator
    from trainer_core.jobs.orchestrator import RunRefused

    run_id = busy(pages_store)
    at = open_page("pages/history.py")
    assert buttons(at, "Delete")[0].disabled
    with pytest.raises(RunRefused, match="stop it, or remove it from the queue"):
        get_orchestrator().delete_run(run_id)


def test_delete_never_leaves_the_runs_root(pages_store, tmp_path):
    from ui.state import get_orchestrator

    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    run_id = "20260101-000000-ffffff"
    insert_finished_run(pages_store, run_id, "linked", [1.0])
    paths.runs_dir().mkdir(parents=True, exist_ok=True)
    paths.run_dir(run_id).symlink_to(outside)  # the run folder is a link leading out of the data root
    get_orchestrator().delete_run(run_id, delete_files=True)
    assert (outside / "keep.txt").read_text() == "keep"


# ---------------------------------------------------------------------- History: resume and compare
def test_resume_without_a_checkpoint_explains_why(pages_store):
    insert_finished_run(pages_store, "20260101-000000-gggggg", "stopped early", [2.0, 1.5], status=RunStatus.STOPPED)
    at = open_page("pages/history.py")
    buttons(at, "Resume")[0].click().run()
    buttons(at, "Resume now")[0].click().run()
    assert [e.value for e in at.error] == [
        "Run 'stopped early' has no completed checkpoint to resume from (it saves one on Stop & save, "
        "or every save_steps steps)."]
    assert len(pages_store.list_runs()) == 1


def test_resume_is_disabled_for_completed_runs(pages_store):
    insert_finished_run(pages_store, "20260101-000000-hhhhhh", "finished", [2.0, 1.0])
    at = open_page("pages/history.py")
    assert buttons(at, "Resume")[0].disabled


def test_compare_needs_two_runs_and_opens_the_compare_page(pages_store):
    for i, losses in enumerate(([2.0, 1.0], [3.0, 1.5], [2.5, 2.0])):
        insert_finished_run(pages_store, f"20260101-00000{i}-iiiiii", f"run {i}", losses)
    at = open_page("pages/history.py")
    assert buttons(at, "Compare")[0].disabled
    at.multiselect(key="history_compare").select("20260101-000000-iiiiii").select("20260101-000002-iiiiii").run()
    assert not buttons(at, "Compare")[0].disabled
    buttons(at, "Compare")[0].click().run()
    assert not at.exception
    assert len(at.get("vega_lite_chart")) >= 1
    assert at.session_state["compare_ids"] == ["20260101-000000-iiiiii", "20260101-000002-iiiiii"]


def test_history_shows_alert_counts(pages_store):
    run_id = "20260101-000000-jjjjjj"
    insert_finished_run(pages_store, run_id, "spiky", [2.0, 1.0])
    pages_store.add_event(run_id, "alert", "Grad norm 84.2 at step 3 is 21x its recent median (4.0).")
    pages_store.add_event(run_id, "alert", "Train loss is NaN or inf at step 4.")
    at = open_page("pages/history.py")
    table = at.dataframe[0].value
    assert list(table["alerts"]) == ["⚠️ 2"]


# ---------------------------------------------------------------------- Run details
def test_run_page_filters_the_worker_log_and_offers_downloads(pages_store):
    run_id = "20260101-000000-kkkkkk"
    insert_finished_run(pages_store, run_id, "logged", [2.0, 1.0])
    pages_store.add_event(run_id, "alert", "Train loss is NaN or inf at step 2.")
    folder = paths.run_dir(run_id)
    folder.mkdir(parents=True)
    (folder / "worker.log").write_text("[running] training\nwarning: slow disk\nstep 1\nwarning: low memory\n")
    at = open_page("pages/run.py", detail_run_id=run_id)
    assert not at.exception
    at.text_input(key="run_log_filter").input("WARNING").run()
    logs = [c.value for c in at.code if "warning" in c.value]
    assert logs == ["warning: slow disk\nwarning: low memory"]
    assert "2 of 4 lines" in [c.value for c in at.caption]
    alerts_md = " ".join(m.value for m in at.markdown)
    assert "1 alert" in alerts_md and "Train loss is NaN or inf at step 2." in alerts_md
    labels = [b.proto.label for b in at.get("download_button")]
    assert labels == ["Download metrics (CSV)", "Download worker log", "Download YAML", "Download JSON"]


def test_run_page_timeline_can_show_only_alerts(pages_store):
    run_id = "20260101-000000-llllll"
    insert_finished_run(pages_store, run_id, "timeline", [2.0, 1.0])
    pages_store.add_event(run_id, "alert", "Eval loss rose 3 times in a row.")
    at = open_page("pages/run.py", detail_run_id=run_id)
    pills = at.get("button_group")[0]
    assert sorted(pills.value) == ["alert", "status"]
    pills.set_value(["alert"]).run()
    timeline = next(d.value for d in at.dataframe if "message" in d.value)
    assert list(timeline["kind"]) == ["alert"]
    assert list(timeline["message"]) == ["Eval loss rose 3 times in a row."]


# ---------------------------------------------------------------------- Live
def test_live_view_of_a_finished_run_lists_its_alerts(pages_store):
    run_id = "20260101-000000-mmmmmm"
    pages_store.create_run(RunRecord(id=run_id, name="nan run", status=RunStatus.RUNNING.value, created_at=time.time(),
                          started_at=time.time()))
    pages_store.append_metrics(run_id, [{"step": 1, "loss": 2.0, "nonfinite": ""},  # as the pump stores a NaN loss:
                                   {"step": 2, "loss": None, "nonfinite": "loss"},  # NULL, with its name kept
                                   {"step": 3, "loss": 1.0, "nonfinite": ""}])
    pages_store.finish_run(run_id, RunStatus.COMPLETED)
    at = open_page("pages/live.py", live_run_id=run_id)
    assert not at.exception
    text = " ".join(m.value for m in at.markdown)
    assert "1 alert" in text and "Train loss is NaN or inf at step 2." in text
    assert len(at.get("vega_lite_chart")) >= 1


def test_run_page_reads_only_the_columns_it_draws(pages_store, monkeypatch):
    run_id = "20260101-000000-cccccc"
    pages_store.create_run(RunRecord(id=run_id, name="narrow", status=RunStatus.RUNNING.value, created_at=time.time(),
                               started_at=time.time()))
    pages_store.append_metrics(run_id, [{"step": 1, "loss": 2.0, "memory_mb": 900.0, "wall_time": 1.0},
                                        {"step": 2, "loss": None, "nonfinite": "loss", "memory_mb": 910.0}])
    pages_store.finish_run(run_id, RunStatus.COMPLETED)
    asked = []
    read = Store.metrics_frame

    def spy(self, wanted, from_step=None, columns=None, keys=None):
        if wanted == run_id:
            asked.append((None if columns is None else set(columns), None if keys is None else list(keys)))
        return read(self, wanted, from_step, columns, keys)

    monkeypatch.setattr(Store, "metrics_frame", spy)
    at = open_page("pages/run.py", detail_run_id=run_id)
    # the charts' metrics, the x axis (step) and nonfinite: not memory_mb, wall_time, epoch, ...; no open key
    # (none was picked)
    assert asked == [({"step", "loss", "eval_loss", "learning_rate", "grad_norm", "tokens_per_s", "nonfinite"}, [])]
    assert any("Non-finite values (loss) first at step 2" in w.value for w in at.warning)
    assert len(at.get("vega_lite_chart")) >= 1
