"""Settings' "Check cluster" against a real local Ray cluster of two nodes, the second of which does NOT share
the storage: it runs in a mount namespace of its own (``unshare``) with an empty tmpfs over the shared path, as a
node that never mounted the share. The check must list both nodes with their CPUs, and name the second as not
seeing the path (its own write error), while the head sees it. Skips without ray or without user namespaces."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.ray_cluster import dashboard_up, end_sessions, free_port
from tests.support import wait_until
from tests.support.apptest import APP
from trainer_core.launchers import ray as ray_jobs

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
from ray.util.state import list_nodes  # noqa: E402 - after the skip

pytestmark = [pytest.mark.ray]

UNSHARE = shutil.which("unshare")


def namespaces_work() -> bool:
    """Whether this machine lets an unprivileged user mount a tmpfs in a namespace of its own."""
    if UNSHARE is None:
        return False
    probe = subprocess.run([UNSHARE, "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs none /mnt"],
                           capture_output=True)
    return probe.returncode == 0


def node(cpus: int, *args: str, hide: Path | None = None) -> subprocess.Popen:
    """One Ray node blocking in its own session (as tests/support/ray_cluster.py ``ray_start``); with ``hide``, in a
    mount namespace where an empty tmpfs covers that folder."""
    ports = [f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "metrics-export-port",
                                                    "runtime-env-agent-port")]
    command = [str(Path(sys.executable).with_name("ray")), "start", "--block", f"--num-cpus={cpus}",
               "--node-ip-address=127.0.0.1", "--object-store-memory=80000000", "--disable-usage-stats", *ports, *args]
    if hide is not None:
        command = [UNSHARE, "--user", "--map-root-user", "--mount", "sh", "-c",
                   f'mount -t tmpfs none "{hide}" && exec "$@"', "sh", *command]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))


@pytest.mark.skipif(not namespaces_work(), reason="needs unshare with user and mount namespaces")
def test_the_settings_check_names_the_node_that_does_not_share_the_storage(app_home, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    gcs, dashboard = free_port(), free_port()
    address = f"http://127.0.0.1:{dashboard}"
    nodes = [node(1, "--head", f"--port={gcs}", f"--dashboard-port={dashboard}", "--dashboard-host=127.0.0.1",
                  f"--ray-client-server-port={free_port()}", f"--temp-dir={temp}")]
    try:
        wait_until(lambda: dashboard_up(address), timeout=120, what="the Ray head's dashboard")
        nodes.append(node(1, f"--address=127.0.0.1:{gcs}", hide=shared))
        wait_until(lambda: sum(n.state == "ALIVE" for n in list_nodes(address=address)) == 2, timeout=120,
                   what="two Ray nodes")
        head, second = sorted(list_nodes(address=address), key=lambda n: not n.is_head_node)
        monkeypatch.setenv("RAY_ADDRESS", address)
        monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(shared))

        # What New run shows: both nodes, one CPU each, free (nothing runs yet).
        info = ray_jobs.cluster_info(address)
        assert info.problem == ""
        assert [(n.node_id, n.head, n.cpus, n.gpus) for n in info.nodes] == [(head.node_id, True, 1.0, 0.0),
                                                                               (second.node_id, False, 1.0, 0.0)]
        wait_until(lambda: all(n.free_cpus == 1.0 for n in ray_jobs.cluster_info(address).nodes), timeout=30,
                   what="each node's free CPU in the dashboard's usage")

        at = AppTest.from_file(APP, default_timeout=180).run()
        at.switch_page("pages/settings.py").run()
        next(b for b in at.button if b.label == "Check cluster").click().run()
        assert not at.exception, at.exception
        [table] = [d.value for d in at.dataframe if "shared storage" in d.value.columns]
        rows = table.to_dict("records")
        assert [(r["node"], r["address"]) for r in rows] == [(head.node_id[:12] + " (head)", head.node_ip),
                                                              (second.node_id[:12], second.node_ip)]
        assert [r["CPUs free"] for r in rows] == ["1 of 1", "1 of 1"]
        assert rows[0]["shared storage"] == "sees it"
        assert rows[1]["shared storage"].startswith("cannot see it: FileNotFoundError: [Errno 2] No such file or "
                                                    f"directory: '{shared}/.ray-probe-")
        [error] = [e.value.replace("\\", "") for e in at.error]
        assert error.startswith(f"node {second.node_ip} ({second.node_id[:12]}) cannot share files with this host under "
                                f"{shared}: its probe file is missing here (FileNotFoundError")
        assert not list(shared.iterdir())  # the probe cleans up after itself
    finally:
        end_sessions(nodes)
        shutil.rmtree(temp, ignore_errors=True)
