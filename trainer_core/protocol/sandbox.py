"""Workers and the dashboard's ML children run inside a bubblewrap sandbox (docs/sharing.md, threat model).

Code a job runs (a custom reward, a model repository's ``trust_remote_code`` files, a tokenizer's template) runs as
the same OS user as the dashboard and the sign-in service, so a clean environment alone does not keep it from their
secrets: it could read ``/proc/<pid>/environ`` of any process of that user, the database and the secrets files.
bubblewrap (Debian's ``bubblewrap``) gives each job:

- a PID namespace of its own: no other process's ``/proc``; everything the job leaves behind ends with it;
- the system and the Python installation read-only; ``$HOME`` and ``/tmp`` empty and private;
- none of the data root but the job's own folder (writable), the uploaded datasets, prompt sets and the caches
  (models, tokenized data, codec frames, the hub's), and the inputs the job names (model and data folders, the
  runs it reads), read-only; never ``studio.db``, another run's folder it does not name, ``.git``, ``.streamlit``
  or the hub's token file;
- no network unless the job needs it (a serve job listens; a hub model or dataset, a judge, a hub push or W&B).

``FINETUNE_STUDIO_SANDBOX=off`` runs jobs unsandboxed on a single-user host only, with a warning in each job's
log; shared mode (``FINETUNE_STUDIO_SHARED=1``) never does, and refuses jobs when the sandbox cannot start.

Kept whole: it is one rule, what a job may see, and a review of that rule reads all of it at once.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

from trainer_core.protocol import files, paths

SANDBOX_ENV = "FINETUNE_STUDIO_SANDBOX"  # "on" (default) | "off": single-user hosts only
SHARED_ENV = "FINETUNE_STUDIO_SHARED"  # set by the gateway (ui/auth.py reads it too)
UNSANDBOXED_WARNING = ("WARNING: this job runs WITHOUT the sandbox (FINETUNE_STUDIO_SANDBOX=off): code it runs "
                       "(rewards, remote model code) can read every file and process of this user")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow")  # readable by root, who runs CI and many single-user hosts
HIDDEN_DIRS = ("/etc/ssl/private",)  # TLS keys (the gateway's may live there)
# Never shown, whatever a config names (a free-text field may hold any path): the database, secrets, history.
NEVER_SHOWN = frozenset({".git", ".streamlit", "secrets.toml", ".secrets.json"})
HIDDEN_NAMES = (".git", ".streamlit")  # in the checkout and the working directory: history, secrets.toml
HUB_TOKEN_FILES = ("token", "stored_tokens")
# Job fields whose non-empty value reaches out of this host (a job naming none of them runs offline).
# A recipe's models: an external endpoint (url) or the studio's serve job (served_by: it listens on this host).
NETWORK_FIELDS = ("judge_url", "push_repo_id", "hf_dataset", "lm_eval_tasks", "enable_wandb", "url", "served_by",
                  "seed_hub_dataset")
MODEL_FIELDS = ("model_name", "model", "data")  # a value that is no local path (nor bundled) is a hub name
RUN_FILES = ("config.yaml", "job.json")
STOP_SIGNALS = "TERM,INT"
WAITER = '"$@"; status=$?; exit $status'  # not `exec`: the shell stays bubblewrap's parent


_run = subprocess.run  # the probe's own handle: a test that plays a child by replacing subprocess.run plays no probe


class SandboxError(OSError):
    """The sandbox cannot start and the job may not run without it; the message says why and what to do."""


def shared_mode() -> bool:
    return os.environ.get(SHARED_ENV) == "1"


@functools.lru_cache(maxsize=1)
def _probe() -> str:
    """'' when bubblewrap starts a process in fresh PID and network namespaces here, else why not (cached)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    try:
        done = _run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--proc", "/proc",
                               "--dev", "/dev", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not start: {exc}"
    if done.returncode != 0:
        return f"bubblewrap cannot create namespaces here (user namespaces disabled?): {done.stderr.strip()[:300]}"
    return ""


def unavailable() -> str:
    """Why jobs cannot run sandboxed on this host ('' when they can)."""
    return _probe()


def enabled() -> bool:
    """Whether jobs start sandboxed. Raises SandboxError when they must be and cannot."""
    off = os.environ.get(SANDBOX_ENV, "on").strip().lower() in ("off", "0", "false", "no")
    if off and not shared_mode():
        return False
    problem = unavailable()
    if problem and shared_mode():
        raise SandboxError(f"the worker sandbox cannot start ({problem}); shared mode runs no job outside it, "
                           "because code a job runs could read the server's secrets. Install bubblewrap on the host")
    if problem:
        raise SandboxError(f"the worker sandbox cannot start ({problem}). Install bubblewrap, or set {SANDBOX_ENV}=off "
                           "to run jobs unsandboxed on this single-user host (every such job says so in its log)")
    return True


# ---- what a job may see


def _strings(value: Any) -> Iterable[tuple[str, str]]:
    """(key, string) pairs anywhere in a job's config (nested dicts and lists)."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        key, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((str(k), v) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((key, v) for v in item)
        elif isinstance(item, str) and item and "\x00" not in item and len(item) < paths.PATH_MAX:
            yield key, item
        elif item is True:
            yield key, ""  # a switch that is on (enable_wandb)


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _run_config(run_dir: Path) -> list:
    """The values of a run's job.json and config.yaml, as (key, value) pairs. The YAML is read line by line
    (``key: value`` and ``- value`` items): this layer reads no YAML, and a value is all a sandbox needs of it."""
    found: list = []
    for name in RUN_FILES:
        try:
            text = files.read_regular(run_dir / name, 4 << 20)
        except OSError:
            continue
        if name.endswith(".json"):
            try:
                found.append(json.loads(text))
            except ValueError:
                pass
            continue
        key = ""
        for line in text.splitlines():
            item = line.strip()
            if item.startswith("- "):
                found.append({key: item[2:].strip().strip("'\"")})
            elif ":" in item:
                key, _, value = item.partition(":")
                if value.strip():
                    found.append({key.strip(): value.strip().strip("'\"")})
    return found


def job_inputs(config: dict, own_run: str = "") -> tuple[list[Path], list[Path], bool]:
    """What a job's config names: (folders and files to show read-only, run folders it reads, whether it needs the
    network). Paths count only under the allowed roots (validation refuses others anyway); a run id counts when its
    folder exists, and the configs of the runs it reads are followed (an eval of a run reads that run's base model)."""
    roots = [r.resolve() for r in paths.allowed_data_roots()]
    runs_root = paths.runs_dir().resolve()
    data = paths.data_root()
    inputs: list[Path] = []
    runs: list[Path] = []
    network = False
    pending, seen = [config], {own_run}
    while pending:
        for key, text in _strings(pending.pop()):
            if key in NETWORK_FIELDS:
                network = True
            if not text:
                continue
            if text.startswith("run:"):  # a model source's key (run:<id> or run:<id>@<step>)
                text = text[4:].split("@", 1)[0]
            if paths.RUN_ID_RE.fullmatch(text) and text not in seen and (runs_root / text).is_dir():
                seen.add(text)
                runs.append(runs_root / text)
                pending.append(_run_config(runs_root / text))
                continue
            found = _local_path(text)
            if found is not None and not _showable(found, data, runs_root):
                continue
            if found is not None and _inside(found, roots) and not _inside(found, [runs_root]):
                # a file's folder (a dataset names its images and clips relative to it; a task file its data): a
                # folder that holds the data root is shown too, and the data root is hidden in it (wrap's masks)
                inputs.append(found if found.is_dir() else found.parent)
            elif found is not None and _inside(found, [runs_root]):
                inputs.append(found)  # a checkpoint of a run (resume): read-only like the run
            elif key in MODEL_FIELDS and found is None and _hub_name(text):
                network = True
    return inputs, runs, network


def _showable(path: Path, data: Path, runs_root: Path) -> bool:
    """Whether a path a config names may be shown: never the database, a secrets file or a repository's history,
    and in the data root only the uploads, prompt sets, presets, caches and run folders."""
    if NEVER_SHOWN & set(path.parts) or path.name.startswith(("studio.db", ".secrets")):
        return False
    if not _inside(path, [data]) or path == data:
        return path != data
    return _inside(path, [paths.datasets_dir(), data / "prompt_sets", data / "presets", paths.models_dir(),
                          data / "cache", runs_root]) and path != runs_root


def _local_path(text: str) -> Path | None:
    if not (text.startswith(("/", "~", "./", "../")) or os.sep in text):
        return None
    try:
        path = Path(text).expanduser().resolve()
        return path if path.exists() else None
    except (OSError, RuntimeError, ValueError):
        return None


def _hub_name(text: str) -> bool:
    """A hub repo id (org/name, or a bare name): what a worker downloads. Bundled models are local."""
    return not text.startswith(("bundled:", "/", "~", ".")) and " " not in text and len(text) <= 200


# ---- the command


def wrap(command: list[str], *, writable: Iterable[Path] = (), readable: Iterable[Path] = (),
         network: bool = False, share_pids: bool = False, chdir: Path | None = None,
         env: dict[str, str] | None = None) -> list[str]:
    """``command`` inside bubblewrap (see the module's docstring for what it sees). ``env`` is the environment the
    command will get (its HOME, PYTHONPATH and caches are laid out from it)."""
    env = env if env is not None else dict(os.environ)
    args = ["bwrap", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp"]
    if not share_pids:
        args.append("--unshare-pid")
    if not network:
        args.append("--unshare-net")
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    for dev in sorted(Path("/dev").glob("nvidia*")) + sorted(Path("/dev").glob("dri")):  # GPUs on CUDA hosts
        args += ["--dev-bind", str(dev), str(dev)]
    home = env.get("HOME", "")
    if home and home != "/":
        args += ["--tmpfs", home]
    for path in _python_paths(env):
        args += ["--ro-bind", str(path), str(path)]
    for path in _dedupe(readable):
        args += ["--ro-bind", str(path), str(path)]
    for path in _hub_caches(env):
        args += ["--bind", str(path), str(path)]
    args += _masks(env)
    data = paths.data_root()
    args += ["--tmpfs", str(data)]  # none of the data root but what follows
    for path in (paths.datasets_dir(), data / "prompt_sets", data / "presets"):
        if path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for path in (paths.models_dir(), data / "cache"):  # shared caches: converted models, tokenized data, codec frames
        path.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(path), str(path)]
    for path in _dedupe(readable):
        if _inside(path, [data]) and path != data:  # re-shown over the hidden data root, never the whole of it
            args += ["--ro-bind", str(path), str(path)]
    for path in _dedupe(readable):  # a run read by this job: its staged secrets are not this job's
        for secret in sorted(path.glob(".secrets*")) if path.is_dir() and _inside(path, [paths.runs_dir()]) else []:
            args += ["--ro-bind", "/dev/null", str(secret)]
    writable = list(writable)
    for path in writable:  # made first: _dedupe keeps only paths that exist
        Path(path).mkdir(parents=True, exist_ok=True)
    for path in _dedupe(writable):
        args += ["--bind", str(path), str(path)]
    if chdir is not None:
        args += ["--chdir", str(chdir)]
    # A shell waits for bubblewrap, which dies with it (--die-with-parent), and so does everything inside: a kill -9
    # of the job's recorded process ends the whole sandbox, while a dashboard that exits leaves it running. The shell
    # and bubblewrap ignore TERM and INT (bubblewrap would die of them at once while its command goes on saving, for
    # Stop); the command gets them back at their default, so Stop reaches the worker and the others wait for its end.
    return ["env", f"--ignore-signal={STOP_SIGNALS}", "sh", "-c", WAITER, "sandbox", shutil.which("bwrap") or "bwrap",
            "--die-with-parent", *args[1:], "--", "env", f"--default-signal={STOP_SIGNALS}", *command]


def _dedupe(items: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in items:
        path = Path(path).resolve()
        if path.exists() and path not in out:
            out.append(path)
    return out


def _python_paths(env: dict[str, str]) -> list[Path]:
    """The interpreter, its libraries and the code on the worker's PYTHONPATH (this checkout, for an editable
    install) and the tools beside the venv (llama.cpp's converter, the embeddings venv); outside the system dirs."""
    found = [sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    found += [p for p in sys.path if p]
    found += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    venv_parent = Path(sys.prefix).parent
    found += [str(venv_parent / ".tools"), str(venv_parent / ".venv-embed"), str(venv_parent / ".venv-dd")]
    system = [Path(d) for d in SYSTEM_DIRS]
    out = []
    for path in _dedupe(Path(p) for p in found):
        if path.is_dir() and not _inside(path, system) and not any(_inside(path, [o]) for o in out):
            out = [o for o in out if not _inside(o, [path])] + [path]
    return out


def _hub_caches(env: dict[str, str]) -> list[Path]:
    """The hub's cache (downloads, datasets): writable, created when missing; its token files are hidden below."""
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME", "/root"),
                                                                                         ".cache"), "huggingface")
    out = []
    for text in (home, env.get("HF_HUB_CACHE", ""), env.get("HF_DATASETS_CACHE", "")):
        if text:
            path = Path(text).expanduser()
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            out.append(path.resolve())
    return [p for p in _dedupe(out) if not _inside(p, [paths.data_root()])]


def _masks(env: dict[str, str]) -> list[str]:
    args: list[str] = []
    folders = {Path.cwd(), Path(__file__).resolve().parents[2], Path(sys.prefix).parent}
    for folder in folders:
        for name in HIDDEN_NAMES:
            target = folder / name
            if target.is_dir():
                args += ["--tmpfs", str(target)]
    for cache in _hub_caches(env):
        for name in HUB_TOKEN_FILES:
            if (cache / name).exists():
                args += ["--ro-bind", "/dev/null", str(cache / name)]
    for name in HIDDEN_FILES:
        if os.path.exists(name):
            args += ["--ro-bind", "/dev/null", name]
    for name in HIDDEN_DIRS:
        if os.path.isdir(name):
            args += ["--tmpfs", name]
    return args


def child_command(command: list[str], request: dict, env: dict[str, str], writable: Iterable[Path] = ()) -> list[str]:
    """A dashboard child (preview, prompt renderer, reward check, search, speak) in the sandbox: what its request names
    read-only, the working directory when it lies under an allowed root (relative paths), ``writable`` for its output.
    Unchanged when the sandbox is off; SandboxError when it must run and cannot."""
    if not enabled():
        return command
    readable, runs, network = job_inputs(request)
    cwd = Path.cwd().resolve()
    here = _inside(cwd, [r.resolve() for r in paths.allowed_data_roots()]) and cwd != paths.data_root()
    return wrap(command, readable=readable + runs + ([cwd] if here else []), writable=writable, network=network,
                env=env, chdir=cwd if here else None)


def exit_reason(code: int) -> int:
    """bubblewrap exits with 128+N when its command was killed by signal N: the negative code Popen would report."""
    return -(code - 128) if 128 < code < 128 + 65 else code


def is_wrapped(command: list[str]) -> bool:
    return len(command) > 5 and command[0] == "env" and command[3:5] == ["-c", WAITER]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc; [pid] elsewhere): a sandboxed job's worker is a descendant of the
    process recorded for it (the shell that waits for bubblewrap)."""
    found, pending = [], [pid]
    while pending and len(found) < 4096:
        current = pending.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as fh:
                    pending.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return found


def job_pids(pid: int) -> set[int]:
    """Every pid a process of the job recorded as ``pid`` may report as its own: the host's, and inside the sandbox's
    PID namespace its namespace pid (NSpid in /proc/<pid>/status)."""
    pids: set[int] = set()
    for member in process_tree(pid):
        pids.add(member)
        try:
            with open(f"/proc/{member}/status") as fh:
                for line in fh:
                    if line.startswith("NSpid:"):
                        pids.update(int(p) for p in line.split()[1:])
        except (OSError, ValueError):
            continue
    return pids
