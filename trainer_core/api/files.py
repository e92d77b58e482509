"""Uploaded fine-tuning files, in the datasets folder (a sandboxed worker reads that folder, read-only).

``openai-files/<id>.jsonl`` is the upload as sent (what ``/content`` returns), ``<id>.json`` its record, and for
OpenAI's preference rows ``<id>.pairs.jsonl`` the same examples in the studio's ``{prompt, chosen, rejected}``
shape (for reinforcement rows with ``developer`` turns, ``<id>.prompts.jsonl`` with ``system`` turns), which the run
trains on. The record is written last: a file is listed only once it is whole.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer_core.api import datafile
from trainer_core.api.errors import invalid, not_found
from trainer_core.protocol import paths

FOLDER = "openai-files"
PURPOSE = "fine-tune"
MAX_MB_ENV = "FINETUNE_STUDIO_API_MAX_FILE_MB"
CONVERTED = ("pairs", "prompts")  # <id>.<shape>.jsonl: the upload in the studio's shape
DEFAULT_MAX_MB = 200  # nginx's own cap on an upload in the shared mode (gateway/nginx.py)
_ID_RE = re.compile(r"^file-[0-9a-f]{24}$")


@dataclass
class StoredFile:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    owner: str
    shape: str  # datafile.SHAPES
    format: str
    rows: int
    columns: list[str] | None = None  # the fields every row gives a GRPO run's rewards (None: unknown, or none)

    def public(self) -> dict:
        """OpenAI's file object."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}

    @property
    def path(self) -> Path:
        return folder() / f"{self.id}.jsonl"

    @property
    def training_path(self) -> Path:
        """The file a run reads: the studio's pairs for OpenAI's preference rows, else the upload itself."""
        for converted in (folder() / f"{self.id}.{suffix}.jsonl" for suffix in CONVERTED):
            if converted.exists():
                return converted
        return self.path


def folder() -> Path:
    path = paths.datasets_dir() / FOLDER
    path.mkdir(parents=True, exist_ok=True)
    return path


def max_bytes() -> int:
    try:
        return int(float(os.environ.get(MAX_MB_ENV, DEFAULT_MAX_MB)) * 2**20)
    except ValueError:
        return DEFAULT_MAX_MB * 2**20


def save(data: bytes, filename: str, purpose: str, owner: str) -> StoredFile:
    """Check and store an upload; ApiError names what is wrong (the purpose, the size, the line)."""
    if purpose != PURPOSE:
        raise invalid(f"purpose {purpose!r} is not supported here: this server stores files for fine-tuning "
                      f"(purpose '{PURPOSE}')", "purpose", "unsupported")
    limit = max_bytes()
    if len(data) > limit:
        raise invalid(f"{filename} is {len(data) / 2**20:.1f} MiB; files are limited to {limit / 2**20:.0f} MiB",
                      "file", "file_too_large")
    name = re.split(r"[\\/]", filename or "")[-1].strip()[:200] or "upload.jsonl"
    checked = datafile.check(data, name)
    file_id = "file-" + secrets.token_hex(12)
    _write(folder() / f"{file_id}.jsonl", data)
    if checked.training_rows is not None:
        _write(folder() / f"{file_id}.{checked.shape}.jsonl", datafile.jsonl(checked.training_rows))
    record = StoredFile(file_id, len(data), int(time.time()), name, purpose, owner, checked.shape, checked.format,
                        checked.rows, checked.columns)
    _write(folder() / f"{file_id}.json", json.dumps(asdict(record)).encode())
    return record


def _write(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    partial.write_bytes(data)
    os.replace(partial, path)  # readers never see half a file


def get(file_id: str, param: str = "file_id") -> StoredFile:
    record = folder() / f"{file_id}.json" if isinstance(file_id, str) and _ID_RE.match(file_id) else None
    try:
        return StoredFile(**json.loads(record.read_text())) if record is not None else _missing(file_id, param)
    except FileNotFoundError:
        return _missing(file_id, param)


def _missing(file_id: object, param: str) -> StoredFile:
    raise not_found("file", str(file_id)[:100], param)


def list_files(purpose: str | None = None) -> list[StoredFile]:
    """Every stored file, newest first."""
    found = []
    for record in folder().glob("file-*.json"):
        try:
            found.append(StoredFile(**json.loads(record.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # deleted meanwhile, or not ours
    found = [f for f in found if purpose in (None, f.purpose)]
    return sorted(found, key=lambda f: (f.created_at, f.id), reverse=True)


def delete(stored: StoredFile) -> None:
    (folder() / f"{stored.id}.json").unlink(missing_ok=True)  # first: it is no longer listed
    for suffix in ("", *(f".{shape}" for shape in CONVERTED)):
        (folder() / f"{stored.id}{suffix}.jsonl").unlink(missing_ok=True)
