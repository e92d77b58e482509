"""Where dataset rows come from: a config entry resolved to files inside the allowed roots, the bundled
demo, and uploads saved under the data root."""
from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
from pathlib import Path
from typing import BinaryIO

from trainer_core.protocol import paths
from trainer_core.config import BUNDLED_DATASET, BUNDLED_PAIRS
from trainer_core.data import DatasetError

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".csv", ".parquet")


# name -> file beside this module: the demo chat (SFT), and the same questions as preference pairs
BUNDLED_FILES = {BUNDLED_DATASET: "demo_chat.jsonl", BUNDLED_PAIRS: "demo_pairs.jsonl"}


def bundled_demo_path(name: str = BUNDLED_DATASET) -> Path:
    return Path(__file__).resolve().parent / BUNDLED_FILES[name]


def resolve_source(source: str, field_name: str = "local_datasets") -> Path:
    """The file or folder a config entry points at, kept inside the allowed roots."""
    source = str(source).strip()
    if not source:
        raise DatasetError(field_name, "an entry is empty: give a file path, or remove the entry")
    if source in BUNDLED_FILES:
        path = bundled_demo_path(source)
        if not path.is_file():
            raise DatasetError(field_name, f"the bundled demo dataset is missing from this install ({path}): "
                                           "reinstall Finetune Studio or run scripts/make_demo_dataset.py")
        return path
    problem = paths.path_problem(source)
    if problem:
        raise DatasetError(field_name, problem)
    candidate = Path(source).expanduser()
    if not candidate.is_absolute() and not candidate.exists() and (paths.datasets_dir() / candidate).exists():
        candidate = paths.datasets_dir() / candidate  # a bare name refers to an uploaded file
    try:
        path = paths.resolve_inside(candidate, paths.allowed_data_roots())
    except paths.UnsafePathError as exc:
        raise DatasetError(field_name, f"{exc}. Upload the file, move it under {paths.data_root()}, "
                                       "or add its folder to FINETUNE_STUDIO_ALLOWED_ROOTS.") from None
    if not path.exists():
        raise DatasetError(field_name, f"{source} does not exist: check the path or upload the file")
    return path


def source_files(path: Path, field_name: str) -> list[Path]:
    """A file stays itself; a folder means every supported file directly inside it, by name."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir()
                   if p.is_file() and p.suffix.lower() in SUPPORTED_EXTENSIONS and not p.name.startswith("."))
    if not files:
        raise DatasetError(field_name, f"folder {path} has no {'/'.join(SUPPORTED_EXTENSIONS)} files")
    try:  # a symlink inside an allowed folder must not lead out of it
        return [paths.resolve_inside(p, paths.allowed_data_roots()) for p in files]
    except paths.UnsafePathError as exc:
        raise DatasetError(field_name, f"{exc}. Remove the link or copy the file into the folder.") from None


# ---------------------------------------------------------------------- uploads
UPLOAD_CHUNK = 1 << 20  # bytes copied at a time: an upload is never held twice in the server's memory


def save_upload(filename: str, data: bytes | BinaryIO, max_bytes: int = 200 * 2**20) -> Path:
    """Store an uploaded file under the datasets folder with a safe, content-addressed name.

    ``data`` is the upload itself (a file object, read in chunks while it is hashed and written) or bytes."""
    name = re.split(r"[\\/]", str(filename))[-1].strip()
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    suffix = f".{ext.lower()}" if ext else ""
    if suffix not in SUPPORTED_EXTENSIONS:
        raise DatasetError("local_datasets", f"{name or 'the file'}: unsupported file type '{suffix or '(none)'}'; "
                                             f"upload one of {', '.join(SUPPORTED_EXTENSIONS)}")
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    if stream.seekable():
        total = stream.seek(0, os.SEEK_END)
        stream.seek(0)
        if total > max_bytes:
            raise DatasetError("local_datasets", f"{name} is {total / 2**20:.1f} MiB; uploads are limited to "
                                                 f"{max_bytes / 2**20:.0f} MiB. Put larger files under the data root "
                                                 "and enter their path instead.")
    safe_stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:60] or "dataset"
    partial = paths.datasets_dir() / f".{safe_stem}{suffix}.{os.getpid()}.{secrets.token_hex(4)}.part"
    digest, size = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out:
            while chunk := stream.read(UPLOAD_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise DatasetError("local_datasets", f"{name} is over {max_bytes / 2**20:.0f} MiB; uploads are "
                                                         f"limited to {max_bytes / 2**20:.0f} MiB. Put larger files "
                                                         "under the data root and enter their path instead.")
                digest.update(chunk)
                out.write(chunk)
        if size == 0:
            raise DatasetError("local_datasets", f"{name} is empty")
        target = paths.datasets_dir() / f"{safe_stem}-{digest.hexdigest()[:10]}{suffix}"
        if target.is_file() and target.stat().st_size == size:
            return target  # the same content was uploaded before
        os.replace(partial, target)  # readers never see a half-written file
        return target
    finally:
        partial.unlink(missing_ok=True)
