"""``python -m gateway --port 8443`` (``make share SHARE_PORT=8443``): the shared mode.

Starts four processes and stops all of them when one ends or on Ctrl-C/SIGTERM:
the sign-in service, Streamlit and the fine-tuning API (gateway/api.py, under /v1/) on loopback ports, and nginx on
the public port in front of them.
Authentication settings are checked first; a bad one starts nothing (exit code 2).
Streamlit and the API get an environment without the password, OIDC client secret, session key or API token,
so neither they nor any worker they start can read them.

Shutdown runs once and cannot be cut short: the first SIGINT, SIGTERM or SIGHUP starts it and the rest are
ignored. On Linux each child is also given a parent-death signal (SIGTERM), so the four die with the
supervisor even when it is SIGKILLed (the jobs the dashboard started are in sessions of their own and go on).
"""
from __future__ import annotations

import argparse
import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import ssl
import time
from pathlib import Path
from urllib.parse import urlsplit

from gateway import nginx, settings
from trainer_core.protocol import paths
from trainer_core.auth import access
from trainer_core.auth.access import SERVER_SECRET_ENV

ROOT = Path(__file__).resolve().parents[1]
NGINX_ENV = "FINETUNE_STUDIO_NGINX"  # path of the nginx binary (default: nginx on PATH, then /usr/sbin/nginx)
SHUTDOWN_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Loaded before any fork: the child between fork and exec may only make the one call.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with(parent: int):
    """A preexec_fn: the child gets SIGTERM when the thread that started it ends (the supervisor's main
    thread: its death, SIGKILL included). None where prctl does not exist."""
    if _LIBC is None:
        return None

    def set_death_signal() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the supervisor died before the call took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return set_death_signal


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nginx_binary() -> str:
    found = os.environ.get(NGINX_ENV) or shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise SystemExit(f"nginx not found: install it (Debian/Ubuntu: apt-get install nginx-light or nginx) or set "
                         f"{NGINX_ENV} to its path")
    return found


class Share:
    """The four processes of the shared mode (tests drive it too)."""

    def __init__(self, port: int, host: str = "0.0.0.0", env: dict[str, str] | None = None):
        self.env = dict(os.environ if env is None else env)
        self.port, self.host = port, host
        self.settings = settings.load(self.env)  # SettingsError: nothing starts
        self.run_dir = Path(self.env.get("FINETUNE_STUDIO_HOME", "studio_data")).expanduser().resolve() / "share"
        self.procs: dict[str, subprocess.Popen] = {}
        self.streamlit_port, self.signin_port, self.api_port = free_port(), free_port(), free_port()
        self.scheme = "https" if self.settings.tls_cert else "http"
        self.secure = self.scheme == "https" or self.settings.public_url.startswith("https://")

    def start(self, timeout: float = 60) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.run_dir / "tmp" / kind).mkdir(parents=True, exist_ok=True)
        conf = self.run_dir / "nginx.conf"
        conf.write_text(nginx.render(nginx.Layout(self.host, self.port, self.streamlit_port, self.signin_port,
                                                  self.api_port, self.run_dir, self.settings.tls_cert,
                                                  self.settings.tls_key,
                                                  self.settings.public_url)))
        public = {k: v for k, v in self.env.items() if k not in SERVER_SECRET_ENV}
        nginx_cmd = [nginx_binary(), "-p", str(self.run_dir), "-c", str(conf), "-e", str(self.run_dir / "nginx-error.log")]
        check = subprocess.run([*nginx_cmd, "-t", "-q"], env=public, capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx rejected {conf}:\n{check.stderr}")
        signin_env = access.signin_env(self.env)  # auth secrets and the database; no HF_TOKEN, no CLI token
        signin_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH", "")]))
        self._spawn("sign-in", [sys.executable, "-m", "gateway.signin", "--port", str(self.signin_port)]
                    + (["--secure"] if self.secure else []), signin_env)
        # The sign-in service opens the database (adding any new column) before it answers; the dashboard
        # starts after that, so the two never race to migrate one SQLite file.
        self._wait_http(f"http://127.0.0.1:{self.signin_port}/auth/check", "sign-in", timeout, ok=(401,))
        streamlit_env = {**public, "FINETUNE_STUDIO_SHARED": "1"}
        self._spawn("streamlit", [sys.executable, "-m", "ui.serve",  # streamlit run, orchestrator built at start
                                  "--server.address", "127.0.0.1", "--server.port", str(self.streamlit_port),
                                  "--server.headless", "true", "--browser.gatherUsageStats", "false",
                                  "--server.enableXsrfProtection", "true",
                                  "--server.maxUploadSize", str(nginx.UPLOAD_LIMIT_MB),
                                  # Streamlit would read secrets.toml (the password) and copy its keys into its
                                  # environment; the dashboard needs none of it in shared mode
                                  "--secrets.files", str(self.run_dir / "no-secrets-for-streamlit.toml")],
                    streamlit_env)
        self._wait_http(f"http://127.0.0.1:{self.streamlit_port}/_stcore/health", "streamlit", timeout)
        self._spawn("api", [sys.executable, "-m", "gateway.api", "--host", "127.0.0.1", "--port", str(self.api_port)],
                    public)
        self._wait_http(f"http://127.0.0.1:{self.api_port}/v1/models", "api", timeout, ok=(401,))  # wants a token
        self._spawn("nginx", nginx_cmd, public)
        self._wait_http(f"{self.scheme}://127.0.0.1:{self.port}/", "nginx", timeout, ok=(302,))  # to sign-in

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        log = open(self.run_dir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with(os.getpid()))
        log.close()

    def _wait_http(self, url: str, name: str, timeout: float, ok: tuple[int, ...] = (200,)) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.run_dir / (name + '.log')}:\n"
                                   + self.log_tail(name))
            try:
                if _status(url) in ok:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not answer on {url} within {timeout:.0f} s:\n{self.log_tail(name)}")

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.run_dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def first_exited(self) -> str | None:
        return next((name for name, proc in self.procs.items() if proc.poll() is not None), None)

    def stop(self) -> None:
        """Stop all four; safe to call again, and signals wait until it is done (they cannot cut it short)."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
        try:
            for name in ("nginx", "api", "streamlit", "sign-in"):
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is None:
                    _killpg(proc.pid, signal.SIGTERM)  # its own process group: nothing else is signalled
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    _killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=5)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # it ended between the check and the signal
        pass


def _local_tls() -> ssl.SSLContext:
    """Our own nginx on loopback, whose certificate names the public host, not 127.0.0.1."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _status(url: str) -> int:
    """The status of one GET, redirects not followed (a local self-signed certificate is fine here)."""
    parts = urlsplit(url)
    conn = (http.client.HTTPSConnection(parts.netloc, timeout=2, context=_local_tls())
            if parts.scheme == "https" else http.client.HTTPConnection(parts.netloc, timeout=2))
    try:
        conn.request("GET", parts.path or "/", headers={"Accept": "text/html"})
        return conn.getresponse().status
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Finetune Studio, shared: nginx + sign-in service + dashboard")
    parser.add_argument("--port", type=int, default=8443, help="public port nginx listens on")
    parser.add_argument("--host", default="0.0.0.0", help="address nginx listens on")
    args = parser.parse_args(argv)
    paths.data_root()
    try:
        share = Share(args.port, args.host)
    except settings.SettingsError as exc:
        print(exc, file=sys.stderr)
        return 2

    interrupted = []

    def interrupt(*_):
        # SIGTERM and SIGHUP like Ctrl-C (also when started with SIGINT ignored, e.g. in background), and only
        # the first of a burst: a second KeyboardInterrupt inside the shutdown would leave the children running.
        if interrupted:
            return
        interrupted.append(True)
        signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
        raise KeyboardInterrupt

    for sig in SHUTDOWN_SIGNALS:
        signal.signal(sig, interrupt)
    try:
        share.start()
        mode = "OIDC via " + share.settings.issuer if share.settings.mode == "oidc" else "shared password"
        print(f"Finetune Studio is shared at {share.scheme}://{args.host}:{args.port} (sign-in: {mode}). "
              f"Logs: {share.run_dir}. Ctrl-C stops it; running trainings continue.", flush=True)
        while True:
            ended = share.first_exited()
            if ended:
                print(f"{ended} exited; stopping the others. Its log:\n{share.log_tail(ended)}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        interrupted.append(True)  # from here on every signal is a no-op: nothing interrupts the shutdown
        signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
        share.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
