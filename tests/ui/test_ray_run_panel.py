"""A run on the Ray cluster on Live and Run details (issue 23): its Ray job with a link to the Ray dashboard's page
of the job, each rank's node (id, address, GPUs) and the restarts after a lost worker, read from the run folder.
The files are written by nodes on the shared storage: wrong shapes are dropped, a password in the recorded
address is never shown, and the dashboard is linked only at an address this server may use."""
from __future__ import annotations

import json

from db.store import Store
from tests.support.factories import insert_finished_run
from tests.support.apptest import open_page
from trainer_core.launchers import ray_record
from trainer_core.protocol import paths

CLUSTER = "http://head.example:8265"
RANKS = [{"rank": 0, "node_id": "a" * 56, "address": "10.0.0.1", "gpus": []},
         {"rank": 1, "node_id": "b" * 56, "address": "10.0.0.2", "gpus": ["0", "1"]}]


def ray_run(run_id: str, address: str = CLUSTER, ranks=RANKS, restarts: int = 0):
    insert_finished_run(Store(), run_id, "on ray", [2.0, 1.0])
    run_dir = paths.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "ray_job.json").write_text(json.dumps({"address": address, "job_id": f"finetune-studio-{run_id}"}))
    (run_dir / ray_record.PLACEMENT_FILE).write_text(json.dumps(ranks))
    (run_dir / ray_record.RESTARTS_FILE).write_text("".join(json.dumps({"restart": i + 1}) + "\n"
                                                            for i in range(restarts)))


def caption(at) -> str:
    [found] = [c.value for c in at.caption if c.value.startswith("On the Ray cluster")]
    return found


def test_run_details_and_live_show_the_job_its_ranks_nodes_and_a_link_to_the_ray_dashboard(app_home, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", CLUSTER)
    ray_run("run-r", restarts=1)
    for at in (open_page("pages/run.py", detail_run_id="run-r"), open_page("pages/live.py", live_run_id="run-r")):
        assert caption(at) == (f"On the Ray cluster `{CLUSTER}` as job `finetune-studio-run-r` · workers restarted "
                               "1× after a lost worker")
        [link] = at.get("link_button")
        assert link.proto.url == f"{CLUSTER}/#/jobs/finetune-studio-run-r"
        [frame] = [d.value for d in at.dataframe if "GPUs" in d.value.columns]
        assert frame.to_dict("records") == [
            {"rank": 0, "node": "a" * 12, "address": "10.0.0.1", "GPUs": "none"},
            {"rank": 1, "node": "b" * 12, "address": "10.0.0.2", "GPUs": "0, 1"}]


def test_a_run_on_this_host_shows_nothing_of_ray(app_home):
    insert_finished_run(Store(), "run-l", "here", [2.0, 1.0])
    at = open_page("pages/run.py", detail_run_id="run-l")
    assert not [c for c in at.caption if c.value.startswith("On the Ray cluster")] and not at.get("link_button")


def test_what_a_node_wrote_is_read_as_untrusted(app_home, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", CLUSTER)
    hostile = [{"rank": "0"}, {"rank": True}, "x", None, [1], {"rank": 2, "node_id": "<b>n</b>" * 40,
                                                              "address": "[x](http://evil)", "gpus": "all"}]
    ray_run("run-h", address="http://user:secret@elsewhere:8265", ranks=hostile)
    record = ray_record.read_record(paths.run_dir("run-h"))
    assert record.dashboard == ""  # not an address this server may use: no link to it
    assert [r.rank for r in record.ranks] == [2] and record.ranks[0].gpus == () and len(record.ranks[0].node_id) == 64
    at = open_page("pages/run.py", detail_run_id="run-h")
    assert "secret" not in caption(at) and "elsewhere:8265" in caption(at) and not at.get("link_button")
    for bad in ("{", "[" * 100_000, "null", '{"job_id": 5}'):
        (paths.run_dir("run-h") / "ray_job.json").write_text(bad)
        assert ray_record.read_record(paths.run_dir("run-h")) is None
    (paths.run_dir("run-h") / "ray_job.json").write_text(json.dumps({"address": CLUSTER, "job_id": "a) [x](http://e"}))
    assert ray_record.read_record(paths.run_dir("run-h")).dashboard == ""  # an id that is not a submission id
    (paths.run_dir("run-h") / ray_record.PLACEMENT_FILE).write_text("[" * 100_000)
    assert ray_record.ranks_of(paths.run_dir("run-h")) == ()


FIFO_READ = """
import json, sys
from pathlib import Path
from trainer_core.launchers import ray_record
record = ray_record.read_record(Path(sys.argv[1]))
print(json.dumps([record.job_id, len(record.ranks), record.restarts] if record else None))
"""


def test_named_pipes_in_place_of_a_nodes_files_are_not_waited_on(tmp_path):
    """A named pipe at a record file's name (anyone who can write the run folder on the shared storage can make one):
    opening it waited forever for a writer, hanging Live and Run details at every rerun."""
    import os

    from tests.support import run_python

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ray_job.json").write_text(json.dumps({"address": CLUSTER, "job_id": "finetune-studio-x"}))
    for name in (ray_record.PLACEMENT_FILE, ray_record.RESTARTS_FILE):
        os.mkfifo(run_dir / name)
    result = run_python(FIFO_READ, str(run_dir), timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == ["finetune-studio-x", 0, 0]
    os.remove(run_dir / "ray_job.json")
    os.mkfifo(run_dir / "ray_job.json")
    result = run_python(FIFO_READ, str(run_dir), timeout=60)
    assert result.returncode == 0 and json.loads(result.stdout) is None, result.stderr[-2000:]
