"""The Ray cluster Settings saves: what the two fields must be before anything is asked (``field_errors``) and
the check a save must pass (``check_before_saving``): the cluster answers and every alive node writes and reads a
file under the shared path, which this host then finds (``ray.inspect_cluster``). The values are stored by
db/settings_store.py and read back through trainer_core/protocol/cluster_settings.py."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from trainer_core.config import RAY_ADDRESS_ENV, RAY_ADDRESSES_ENV, FieldError
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import paths

ADDRESS, SHARED = "ray_address", "shared_storage"  # the fields' names in errors
ADDRESS_MAX, PATH_MAX = 500, 4096  # characters


def field_errors(address: str, shared: str) -> list[FieldError]:
    """Every problem of the two fields, naming the field and the fix ([] when both may be checked on the cluster)."""
    return [FieldError(ADDRESS, m) for m in address_problems(address)] + \
        [FieldError(SHARED, m) for m in shared_problems(shared)]


def address_problems(address: str) -> list[str]:
    address = address.strip()
    if not address:
        return ["enter the cluster's dashboard address (Ray Jobs), e.g. http://head:8265"]
    if len(address) > ADDRESS_MAX:
        return [f"at most {ADDRESS_MAX} characters (got {len(address)}): enter the dashboard's address, e.g. "
                "http://head:8265"]
    if any(ord(c) < 32 or c.isspace() for c in address):
        return ["remove the spaces and control characters: an address is one word, e.g. http://head:8265"]
    try:
        parts = urlsplit(address)  # ValueError: a bracket left open, characters NFKC would turn into a ':' or '/'
    except ValueError as exc:
        return [f"not an address that can be read ({exc}): enter the dashboard's address, e.g. http://head:8265"]
    if parts.scheme not in ("http", "https"):
        return [f"use the dashboard's http:// or https:// address, e.g. http://head:8265 (not {ray_jobs.shown_address(address)[:80]!r}: "
                "ray:// and the head's GCS port 6379 are not the Jobs API)"]
    if "@" in parts.netloc:
        return [f"remove the user and password: Settings are stored in the database, which never holds a secret. "
                f"Enter the address without them (http://head:8265), or keep an address that needs them in the "
                f"server's environment ({RAY_ADDRESS_ENV})"]
    try:
        port = parts.port
    except ValueError:
        return ["the port must be a number from 1 to 65535, e.g. http://head:8265"]
    problems = []
    if not parts.hostname or port == 0:
        problems.append("name the head's host (and port), e.g. http://head:8265")
    if parts.query or parts.fragment:
        problems.append("remove the ?query and #fragment: the address is the dashboard's base URL, e.g. http://head:8265")
    return problems


def shared_problems(shared: str) -> list[str]:
    if not shared.strip():
        return ["enter the path every node of the cluster mounts, e.g. /mnt/shared"]
    if len(shared) > PATH_MAX:
        return [f"at most {PATH_MAX} characters (got {len(shared)}): enter the mount point, e.g. /mnt/shared"]
    if any(ord(c) < 32 for c in shared):
        return ["remove the control characters: enter the mount point, e.g. /mnt/shared"]
    path = Path(shared.strip())
    if not path.is_absolute():
        return [f"use an absolute path (every node mounts the storage at the same path), e.g. /mnt/shared, not {shared[:200]!r}"]
    if not path.is_dir():
        return [f"{path} is not a folder on this host: mount the shared storage here at the same path as on the "
                "nodes (the dashboard reads the run folders there), then save"]
    root = paths.data_root().resolve()
    if not root.is_relative_to(path.resolve()):
        return [f"the data root {root} (FINETUNE_STUDIO_HOME) is not under {path}: run folders live in the data root "
                "and the cluster's nodes see only the shared storage, so the data root must be inside it. Enter the "
                "mount point that holds the data root, or restart the dashboard with FINETUNE_STUDIO_HOME under "
                f"{path}"]
    if not os.access(path, os.W_OK | os.X_OK):
        return [f"this host cannot write in {path} (the check writes a probe file there): give the dashboard's user "
                "write access"]
    return []


def check_before_saving(address: str, shared: str, timeout_s: float = 120.0) -> ray_jobs.ClusterCheck:
    """The real check of a cluster and a shared path, before they are saved (no problems: they may be saved)."""
    return ray_jobs.inspect_cluster(address.strip().rstrip("/"), timeout_s, shared=str(Path(shared.strip())))


def normalized(address: str, shared: str) -> tuple[str, str]:
    """The values as they are saved (and compared with a run's ray_address)."""
    return address.strip().rstrip("/"), str(Path(shared.strip()))


def runs_held_by(store, address: str) -> str:
    """Why the saved cluster ``address`` may not be cleared or replaced now ("" when it may): runs not over whose Ray
    job went there, which the dashboard follows and stops only while it may use that address (the launcher re-checks
    a run's recorded address when it adopts one), unless the server's environment allows it too."""
    env = [os.environ.get(RAY_ADDRESS_ENV, ""), *os.environ.get(RAY_ADDRESSES_ENV, "").split(",")]
    if not address or address in {a.strip().rstrip("/") for a in env}:
        return ""
    held = [run.name or run.id for run in store.active_runs()
            if str(ray_jobs.read_job(paths.run_dir(run.id)).get("address", "")).strip().rstrip("/") == address]
    if not held:
        return ""
    names = ", ".join(repr(name[:80]) for name in held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    one = len(held) == 1
    return (f"{len(held)} run{'' if one else 's'} on the saved cluster {address} {'is' if one else 'are'} not over "
            f"({names}): the dashboard follows and stops a run there only while it may use that cluster. Stop "
            f"{'it' if one else 'them'} or wait until {'it ends' if one else 'they end'}, then change the saved "
            f"cluster (or allow the address in the server's {RAY_ADDRESSES_ENV})")
