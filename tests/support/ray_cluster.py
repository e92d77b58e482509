"""A local Ray cluster for tests and benchmarks: a head and one or more ``ray start --address`` nodes on this
machine, one CPU each, each blocking in a session of its own so that ending it ends exactly the processes it
started (never ``ray stop``, which stops every Ray process of the user). Node k (the head is 0) holds one unit of
the custom resource ``test-node-k``, which is how a test tells Ray's node ids apart and loses a chosen one.

Without a cluster: ``node_summary_server`` stands in for a cluster's dashboard where only its node summary is read,
and the ``shared`` fixture sets up a server whose cluster is ``SERVER``."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import tempfile
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from tests.support.env import wait_until


@dataclass
class LocalCluster:
    address: str  # the dashboard (Ray Jobs) address
    nodes: list[subprocess.Popen]  # the head first

    def lose_node(self, index: int = 1) -> None:
        """Node ``index`` (default: the second) goes away at once, as a crashed machine: every process of its
        session is killed."""
        end_sessions([self.nodes[index]], grace_s=0.0)

    def index_of(self, node_id: str) -> int:
        """Which of ``nodes`` Ray knows as ``node_id`` (by its ``test-node-k`` resource)."""
        from ray.util.state import list_nodes

        state = next(n for n in list_nodes(address=self.address) if n.node_id == node_id)
        return next(int(name.rsplit("-", 1)[1]) for name in state.resources_total if name.startswith("test-node-"))


@contextlib.contextmanager
def local_cluster(cpus_per_node: int = 1, nodes: int = 2) -> Iterator[LocalCluster]:
    """A local cluster of ``nodes`` nodes (the head included), for the time of the ``with``."""
    from ray.util.state import list_nodes

    def alive_nodes() -> int:
        try:
            return sum(1 for n in list_nodes(address=address) if n.state == "ALIVE")
        except Exception:  # noqa: BLE001 - the dashboard is not up yet
            return 0

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    gcs, dashboard = free_port(), free_port()
    address = f"http://127.0.0.1:{dashboard}"
    count, nodes = nodes, [ray_start(cpus_per_node, "--head", f"--port={gcs}", f"--dashboard-port={dashboard}",
                                     "--dashboard-host=127.0.0.1", f"--ray-client-server-port={free_port()}",
                                     f"--temp-dir={temp}", marked=0)]
    try:
        wait_until(lambda: dashboard_up(address), timeout=120, what="the Ray head's dashboard")
        # the head's own raylet registers after its dashboard answers: a one-node cluster checked at once (on a loaded
        # machine) reported no alive node
        wait_until(lambda: alive_nodes() == 1, timeout=120, what="the Ray head's node")
        for k in range(1, count):  # one at a time: two raylets registering at once timed out here
            nodes.append(ray_start(cpus_per_node, f"--address=127.0.0.1:{gcs}", marked=k))
            wait_until(lambda: alive_nodes() == k + 1, timeout=120, what=f"{k + 1} Ray nodes")
        yield LocalCluster(address, nodes)
    finally:
        end_sessions(nodes)
        shutil.rmtree(temp, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_start(cpus: int, *args: str, marked: int | None = None) -> subprocess.Popen:
    """One Ray node, blocking in its own session (with ``marked``, holding the resource ``test-node-<marked>``)."""
    ports = [f"--{name}={free_port()}" for name in ("dashboard-agent-listen-port", "metrics-export-port",
                                                    "runtime-env-agent-port")]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    return subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--block", f"--num-cpus={cpus}",
                             "--node-ip-address=127.0.0.1", "--object-store-memory=80000000",
                             "--disable-usage-stats", *ports, *args,
                             *([f"--resources={json.dumps({f'test-node-{marked}': 1})}"] if marked is not None else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)


def dashboard_up(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def end_sessions(nodes: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, to every process of the sessions the nodes were started in and their
    descendants (Ray's actors and job drivers)."""
    procs = {}
    for node in nodes:
        try:
            found = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            found = []
        procs.update((p.pid, p) for p in found)
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == node.pid:
                    procs[proc.pid] = proc
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                pass
    for proc in procs.values():
        try:
            proc.send_signal(signal.SIGTERM if grace_s else signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s or 1.0)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    for node in nodes:
        node.wait(timeout=30)


@contextlib.contextmanager
def node_summary_server(summary: dict) -> Iterator[str]:
    """A local HTTP server answering Ray's dashboard's GET /nodes?view=summary with ``summary`` (anything else: 404),
    for the time of the ``with``; its address."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            found = self.path == "/nodes?view=summary"
            body = json.dumps(summary if found else {}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


SERVER = "http://head:8265"  # the server's cluster, for tests that fake Ray's Jobs client


@pytest.fixture
def shared(home, tmp_path, monkeypatch):
    """The data root on the "shared storage" and the server's cluster (SERVER) in RAY_ADDRESS, no allow-list."""
    monkeypatch.setenv("FINETUNE_STUDIO_SHARED_STORAGE", str(tmp_path))
    monkeypatch.setenv("RAY_ADDRESS", SERVER)
    monkeypatch.delenv("FINETUNE_STUDIO_RAY_ADDRESSES", raising=False)
    return tmp_path
