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
from trainer_core.config.limits import BUNDLED_DATASET, BUNDLED_PAIRS, BUNDLED_TOOLS, BUNDLED_TOOLS_EVAL
from trainer_core.data import DatasetError

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".csv", ".parquet")


# name -> file beside this module: the demo chat (SFT), and the same questions as preference pairs
BUNDLED_FILES = {BUNDLED_DATASET: "demo_chat.jsonl", BUNDLED_PAIRS: "demo_pairs.jsonl",
                 BUNDLED_TOOLS: "demo_tools.jsonl", BUNDLED_TOOLS_EVAL: "demo_tools_eval.jsonl"}


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
# (first bytes, what the file is): an upload is what its bytes say, not what its name says (a PNG named rows.csv
# would otherwise sit in the datasets folder, where a row may name it as an image)
SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF87a", "a GIF image"),
              (b"GIF89a", "a GIF image"), (b"OggS", "an Ogg clip"), (b"fLaC", "a FLAC clip"),
              (b"PK\x03\x04", "a ZIP archive"), (b"%PDF-", "a PDF document"), (b"\x7fELF", "a program"),
              (b"\x1f\x8b", "a gzip archive"), (b"PAR1", "a Parquet file"))
RIFF_KINDS = {b"WAVE": "a WAV clip", b"WEBP": "a WebP image", b"AVI ": "a video"}


def content_problem(name: str, suffix: str, head: bytes) -> str | None:
    """Why the first bytes of an upload named ``name`` are not a ``suffix`` dataset file, or None: a Parquet file
    starts with PAR1; .jsonl/.json/.csv are text (no NUL bytes, none of the binary formats' signatures)."""
    what = next((kind for magic, kind in SIGNATURES if head.startswith(magic)), None)
    if head.startswith(b"RIFF"):
        what = RIFF_KINDS.get(head[8:12], "a RIFF media file")
    if suffix == ".parquet":
        what = None if head.startswith(b"PAR1") else what or ("binary data" if b"\x00" in head else "text")
    elif what is None and b"\x00" in head:
        what = "binary data"
    if what is None:
        return None
    return (f"{name} is {what}, not a {suffix[1:]} dataset file: upload the rows themselves (.jsonl, .json, .csv "
            "or .parquet); images and clips a dataset names go in its folder, next to it")


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
                problem = None if size else content_problem(name, suffix, chunk)
                if problem:
                    raise DatasetError("local_datasets", problem)
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
