"""Bad inputs through the paths a user takes: the form/preset config, dataset files, uploads, the New run
page, and the headless CLI. Every case checks that the message names the field and says what to do, and
that nothing was left behind: no run rows, no run folders, no partial uploads, and a valid config still
validates afterwards.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from db.store import Store
from tests.support import ROOT, build_tiny_model
from tests.support.apptest import open_page, submit, texts
from trainer_core.host import hardware
from trainer_core.__main__ import main as cli_main
from trainer_core.config import BUNDLED_DATASET, ConfigError, FieldError, TrainConfig
from trainer_core.data import DatasetError, loading, sources
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"


# ====================================================================== helpers
def problems(values: dict) -> list[FieldError]:
    """What the form and the CLI get back: parsing errors first (from_dict), else the field checks and
    the dataset files' check (as the orchestrator composes them)."""
    try:
        cfg = TrainConfig.from_dict(values)
    except ConfigError as exc:
        return exc.errors
    return cfg.validate() + loading.check_data(cfg)


def assert_reported(errors: list[FieldError], field: str, *phrases: str) -> None:
    """Exactly one problem for ``field``, and its message holds every phrase."""
    mine = [e for e in errors if e.field == field]
    assert len(mine) == 1, f"expected one error for {field!r}, got {errors}"
    for phrase in phrases:
        assert phrase in mine[0].message, f"{phrase!r} not in {mine[0].message!r}"


def assert_nothing_left(home: Path, uploads_before: set[str] = frozenset()) -> None:
    """No run rows, no run folders, no half-written uploads, and a valid config still validates."""
    assert Store().list_runs() == []
    assert sorted(p.name for p in paths.runs_dir().iterdir()) == []
    names = {p.name for p in paths.datasets_dir().iterdir()}
    assert [n for n in names if n.endswith(".part") or n.startswith(".")] == []
    assert names == set(uploads_before)
    good = home.parent / "good.jsonl"
    shutil.copy(FIXTURES / "chatml.jsonl", good)
    assert problems({"local_datasets": [str(good)]}) == []
    assert problems({"local_datasets": [BUNDLED_DATASET]}) == []


@pytest.fixture
def outside(tmp_path_factory) -> Path:
    """A folder outside the allowed roots (the ``home`` fixture allows tmp_path only)."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "data.jsonl").write_text('{"text": "secret row"}\n')
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text("{}")
    (folder / "checkpoint-1").mkdir()
    (folder / "checkpoint-1" / "trainer_state.json").write_text("{}")
    return folder


# ====================================================================== typed fields (form and presets)
NAN, INF = math.nan, math.inf

FIELD_CASES = [
    # (id, values, field, phrases)
    ("lr-nan", {"learning_rate": NAN}, "learning_rate", ["must be a finite number, got nan"]),
    ("lr-nan-text", {"learning_rate": "nan"}, "learning_rate", ["must be a finite number, got nan"]),
    ("lr-negative", {"learning_rate": -1e-4}, "learning_rate", ["set a positive learning rate such as 2e-4"]),
    ("lr-zero", {"learning_rate": 0}, "learning_rate", ["set a positive learning rate such as 2e-4 (got 0.0)"]),
    ("lr-text", {"learning_rate": "fast"}, "learning_rate", ["expected a number, got 'fast'"]),
    ("batch-negative", {"batch_size": -1}, "batch_size", ["use a batch size of at least 1 (got -1)"]),
    ("batch-fraction", {"batch_size": 2.5}, "batch_size", ["expected a whole number, got 2.5"]),
    ("batch-bool", {"batch_size": True}, "batch_size", ["expected a whole number, got True"]),
    ("batch-none", {"batch_size": None}, "batch_size", ["a value is required"]),
    ("steps-negative", {"max_steps": -5}, "max_steps", ["must be >= 0 and <= 10000000, got -5"]),
    ("steps-huge", {"max_steps": 10**12}, "max_steps", ["must be >= 0 and <= 10000000"]),
    ("steps-inf", {"max_steps": INF}, "max_steps", ["expected a whole number, got inf"]),
    ("steps-text", {"max_steps": "abc"}, "max_steps", ["expected a whole number, got 'abc'"]),
    ("lora-r-zero", {"lora_r": 0}, "lora_r", ["use a rank such as 8, 16 or 64 (got 0)"]),
    ("lora-r-negative", {"lora_r": -8}, "lora_r", ["use a rank such as 8, 16 or 64 (got -8)"]),
    ("lora-r-nan", {"lora_r": NAN}, "lora_r", ["expected a whole number, got nan"]),
    ("lora-dropout-one", {"lora_dropout": 1.0}, "lora_dropout", ["must be >= 0.0 and < 1.0, got 1.0"]),
    ("eval-fraction-high", {"eval_fraction": 0.9}, "eval_fraction", ["must be >= 0.0 and < 0.5, got 0.9"]),
    ("eval-fraction-negative", {"eval_fraction": -0.1}, "eval_fraction", ["must be >= 0.0 and < 0.5, got -0.1"]),
    ("eval-fraction-inf", {"eval_fraction": "inf"}, "eval_fraction", ["must be a finite number, got inf"]),
    ("seq-len-zero", {"max_seq_length": 0}, "max_seq_length", ["must be >= 16 and <= 131072, got 0"]),
    ("seq-len-huge", {"max_seq_length": 10**9}, "max_seq_length", ["must be >= 16 and <= 131072"]),
    ("epochs-overflow", {"num_epochs": "1e400"}, "num_epochs", ["must be a finite number, got inf"]),
    ("warmup-both", {"warmup_steps": 5, "warmup_ratio": 0.1}, "warmup_ratio",
     ["set either warmup_steps or warmup_ratio, not both"]),
    ("slice-backwards", {"dataset_slice_start": 10, "dataset_slice_end": 5}, "dataset_slice_end",
     ["must be greater than dataset_slice_start"]),
    ("bool-text", {"packing": "maybe"}, "packing", ["expected true or false, got 'maybe'"]),
    ("str-as-list", {"model_name": ["a", "b"]}, "model_name", ["expected text, got list"]),
    ("list-as-int", {"local_datasets": 5}, "local_datasets", ["expected a list, got 5"]),
    ("mapping-values", {"custom_format_mapping": {"instruction": 3}}, "custom_format_mapping",
     ["expected a mapping of role names to column names"]),
    ("unknown-key-close", {"learning_rte": 1e-4}, "learning_rte", ["unknown field. Did you mean 'learning_rate'?"]),
    ("unknown-key-far", {"zzz_qqq": 1}, "zzz_qqq", ["unknown field. Remove it."]),
    ("run-name-dotdot", {"run_name": "../x"}, "run_name", ["no slashes"]),
    ("run-name-slash", {"run_name": "a/b"}, "run_name", ["no slashes"]),
    ("run-name-nul", {"run_name": "a\x00b"}, "run_name", ["use letters, digits, spaces"]),
    ("run-name-newline", {"run_name": "name\n"}, "run_name", ["use letters, digits, spaces"]),
    ("target-modules-shell", {"target_modules": ["q_proj;rm -rf /"]}, "target_modules",
     ["module names are plain identifiers such as q_proj"]),
    ("gpu-ids-negative", {"gpu_ids": [-1]}, "gpu_ids", ["non-negative integers"]),
    ("model-not-an-id", {"model_name": "not a model!"}, "model_name", ["not a hub id (org/name) nor an existing folder"]),
    ("hub-dataset-path", {"hf_dataset": "../../etc/passwd", "local_datasets": []}, "hf_dataset",
     ["a hub dataset id looks like org/name"]),
    ("hub-and-local", {"hf_dataset": "org/name"}, "hf_dataset", ["choose either a hub dataset or local files"]),
    ("no-dataset", {"local_datasets": []}, "local_datasets", ["choose a dataset"]),
    ("tensorboard-dir-up", {"enable_tensorboard": True, "tensorboard_dir": "../elsewhere"}, "tensorboard_dir",
     ["relative to the run folder, without '..'"]),
    ("tensorboard-dir-absolute", {"enable_tensorboard": True, "tensorboard_dir": "/tmp/tb"}, "tensorboard_dir",
     ["relative to the run folder"]),
]


@pytest.mark.parametrize("values, field, phrases", [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_bad_field_is_named_with_its_fix(home, values, field, phrases):
    errors = problems(values)
    assert_reported(errors, field, *phrases)
    assert_nothing_left(home)


def test_too_large_batch_size_names_the_upper_bound(home):
    assert_reported(problems({"batch_size": 10**30}), "batch_size", "4096")


# ====================================================================== dataset files
DATASET_CASES = [
    # (id, file name, content (bytes, or a fixture name), extra config, field, phrases)
    ("jsonl-corrupt-line", "rows.jsonl", "corrupt.jsonl", {}, "local_datasets",
     ["rows.jsonl: line 7 is not valid JSON", "Fix or remove that line"]),
    ("jsonl-not-object", "rows.jsonl", b'{"text": "a"}\n[1, 2]\n', {}, "local_datasets",
     ["line 2 is not a JSON object (got list)", "each line must be one row"]),
    ("jsonl-empty", "rows.jsonl", b"", {}, "local_datasets", ["rows.jsonl has no rows"]),
    ("jsonl-blank-lines", "rows.jsonl", b"\n  \n\n", {}, "local_datasets", ["rows.jsonl has no rows"]),
    ("jsonl-not-utf8", "rows.jsonl", '{"text": "caf\xe9"}\n'.encode("latin-1"), {}, "local_datasets",
     ["is not UTF-8 text (byte 0xe9 on line 1)", "re-save it as UTF-8"]),
    ("csv-not-utf8", "latin1.csv", "latin1.csv", {}, "local_datasets", ["is not UTF-8 text", "re-save it as UTF-8"]),
    ("csv-header-only", "rows.csv", b"text\n", {}, "local_datasets", ["rows.csv has no rows"]),
    ("unknown-columns", "rows.jsonl", "unknown_columns.jsonl", {}, "format_type",
     ["could not tell the format: the columns are 'prompt' and 'completion'", "custom_format_mapping"]),
    ("alpaca-missing-output", "rows.jsonl", b'{"instruction": "a"}\n', {"format_type": "alpaca"}, "format_type",
     ["'output' is missing; the columns are 'instruction'", "map them with custom_format_mapping"]),
    ("text-missing", "rows.jsonl", b'{"body": "a"}\n', {"format_type": "text"}, "format_type",
     ["'text' is missing; the columns are 'body'", "{text: <your column>}"]),
    ("mapping-to-absent-column", "rows.jsonl", b'{"question": "a", "answer": "b"}\n',
     {"custom_format_mapping": {"instruction": "nope", "output": "answer"}}, "custom_format_mapping",
     ["maps instruction to 'nope', but the data has no such column", "Map to one of these columns"]),
    ("mapping-unknown-role", "rows.jsonl", b'{"question": "a"}\n', {"custom_format_mapping": {"question": "q"}},
     "custom_format_mapping", ["unknown name 'question'", "onto your column names"]),
    ("all-rows-dropped", "rows.jsonl", b'{"messages": [{"role": "user", "content": "hi"}]}\n', {}, "local_datasets",
     ["no usable rows: all 1 rows were dropped (no assistant turn: 1)", "Check the format and column mapping"]),
    ("cpt-on-chat", "rows.jsonl", "chatml.jsonl", {"training_type": "cpt"}, "local_datasets",
     ["continued pretraining (cpt) trains on raw text", "use a dataset with a 'text' column"]),
    ("parquet-not-parquet", "rows.parquet", b"PAR1 this is not parquet at all", {}, "local_datasets",
     ["rows.parquet is not a readable Parquet file"]),
    ("json-string", "rows.json", b'"just text"', {}, "local_datasets", ["must hold a list of rows, got str"]),
    ("json-list-of-numbers", "rows.json", b"[1, 2, 3]", {}, "local_datasets", ["row 1 is not a JSON object (got int)"]),
    ("json-object-of-scalars", "rows.json", b'{"a": 1, "b": 2}', {}, "local_datasets",
     ["expected a list of rows, or an object with one list"]),
    ("json-truncated", "rows.json", b'[{"text": "a"}', {}, "local_datasets", ["rows.json is not valid JSON"]),
    ("wrong-extension", "notes.txt", "notes.txt", {}, "local_datasets",
     ["unsupported file type '.txt'; use one of .jsonl, .json, .csv, .parquet"]),
    ("slice-past-end", "rows.jsonl", b'{"text": "a"}\n', {"dataset_slice_start": 5}, "dataset_slice_start",
     ["has only 1 rows: lower dataset_slice_start"]),
]


def _write(folder: Path, name: str, content: bytes | str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    if isinstance(content, str):
        shutil.copy(FIXTURES / content, target)
    else:
        target.write_bytes(content)
    return target


@pytest.mark.parametrize("name, content, extra, field, phrases", [c[1:] for c in DATASET_CASES],
                         ids=[c[0] for c in DATASET_CASES])
def test_bad_dataset_file_is_named_with_its_fix(home, tmp_path, name, content, extra, field, phrases):
    source = _write(tmp_path / "data", name, content)
    errors = problems({"local_datasets": [str(source)], **extra})
    assert_reported(errors, field, *phrases)
    # The worker reads the same file through load_local: it raises the same problem, not a traceback.
    if field in ("local_datasets", "format_type", "custom_format_mapping", "dataset_slice_start"):
        with pytest.raises(DatasetError) as raised:
            loading.load_local([str(source)], TrainConfig.from_dict({"local_datasets": [str(source)], **extra}))
        assert raised.value.field == field
    assert_nothing_left(home)


def test_bad_dataset_as_eval_file_names_the_eval_field(home, tmp_path):
    source = _write(tmp_path / "data", "eval.jsonl", "corrupt.jsonl")
    errors = problems({"local_eval_datasets": [str(source)]})
    assert_reported(errors, "local_eval_datasets", "line 7 is not valid JSON")
    assert_nothing_left(home)


def test_folder_without_data_files(home, tmp_path):
    folder = tmp_path / "empty-folder"
    folder.mkdir()
    (folder / "readme.txt").write_text("no data here")
    (folder / ".hidden.jsonl").write_text('{"text": "hidden files are skipped"}\n')
    assert_reported(problems({"local_datasets": [str(folder)]}), "local_datasets",
                    f"folder {folder} has no .jsonl/.json/.csv/.parquet files")
    assert_nothing_left(home)


def test_missing_and_empty_dataset_entries(home, tmp_path):
    errors = problems({"local_datasets": [str(tmp_path / "nope.jsonl"), ""]})
    assert [e.field for e in errors] == ["local_datasets", "local_datasets"]
    assert "nope.jsonl does not exist: check the path or upload the file" in errors[0].message
    assert "an entry is empty: give a file path, or remove the entry" in errors[1].message
    assert_nothing_left(home)


def test_csv_with_a_bad_quote_names_the_line(home, tmp_path):
    source = _write(tmp_path / "data", "rows.csv", b'text,label\nfine,1\n"broken,2\nlast,3\n')
    assert_reported(problems({"local_datasets": [str(source)]}), "local_datasets",
                    "rows.csv: line 3 is not valid CSV")
    assert_nothing_left(home)


# ====================================================================== paths outside the allowed roots
OUTSIDE = "outside the allowed folders"


def _link(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


PATH_CASES = [
    # (id, builds {field: value} from (tmp_path, outside), field, phrases)
    ("dataset-dotdot", lambda t, o: {"local_datasets": [f"{t}/../{o.name}/data.jsonl"]}, "local_datasets",
     [OUTSIDE, "add its folder to FINETUNE_STUDIO_ALLOWED_ROOTS"]),
    ("dataset-absolute", lambda t, o: {"local_datasets": [str(o / "data.jsonl")]}, "local_datasets", [OUTSIDE]),
    ("dataset-system-file", lambda t, o: {"local_datasets": ["/etc/hostname.jsonl"]}, "local_datasets", [OUTSIDE]),
    ("dataset-symlink-file", lambda t, o: {"local_datasets": [str(_link(t / "in.jsonl", o / "data.jsonl"))]},
     "local_datasets", [OUTSIDE]),
    ("dataset-symlink-folder", lambda t, o: {"local_datasets": [str(_link(t / "in-folder", o))]},
     "local_datasets", [OUTSIDE]),
    ("dataset-symlink-inside-folder",
     lambda t, o: {"local_datasets": [str(_link(t / "folder" / "x.jsonl", o / "data.jsonl").parent)]},
     "local_datasets", [OUTSIDE, "Remove the link or copy the file into the folder"]),
    ("eval-dataset-absolute", lambda t, o: {"local_eval_datasets": [str(o / "data.jsonl")]}, "local_eval_datasets",
     [OUTSIDE]),
    ("model-dotdot", lambda t, o: {"model_name": f"{t}/../{o.name}/model"}, "model_name",
     [OUTSIDE, "Put the model under the data root or set FINETUNE_STUDIO_ALLOWED_ROOTS"]),
    ("model-absolute", lambda t, o: {"model_name": "/usr"}, "model_name", [OUTSIDE]),
    ("model-symlink", lambda t, o: {"model_name": str(_link(t / "model-link", o / "model"))}, "model_name",
     [OUTSIDE]),
    ("model-folder-without-config", lambda t, o: {"model_name": str(_mkdir(t / "not-a-model"))}, "model_name",
     ["has no config.json: point at a Hugging Face model folder"]),
    ("model-folder-missing", lambda t, o: {"model_name": f"{t}/no-such-model"}, "model_name",
     ["does not exist: check the path"]),
    ("resume-absolute", lambda t, o: {"resume_from_checkpoint": str(o / "checkpoint-1")}, "resume_from_checkpoint",
     [OUTSIDE]),
    ("resume-dotdot", lambda t, o: {"resume_from_checkpoint": f"{paths.runs_dir()}/../../{o.name}/checkpoint-1"},
     "resume_from_checkpoint", [OUTSIDE]),
    ("resume-symlink-in-runs",
     lambda t, o: {"resume_from_checkpoint": str(_link(paths.runs_dir() / "r1" / "checkpoint-9", o / "checkpoint-1"))},
     "resume_from_checkpoint", [OUTSIDE]),
    ("resume-not-a-checkpoint", lambda t, o: {"resume_from_checkpoint": str(t / "home")}, "resume_from_checkpoint",
     [OUTSIDE]),
]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("build, field, phrases", [c[1:] for c in PATH_CASES], ids=[c[0] for c in PATH_CASES])
def test_paths_outside_the_allowed_roots_are_refused(home, tmp_path, outside, build, field, phrases):
    values = build(tmp_path, outside)
    assert_reported(problems(values), field, *phrases)
    shutil.rmtree(paths.runs_dir() / "r1", ignore_errors=True)  # the symlink case planted it; the check is below
    assert_nothing_left(home)


def test_incomplete_checkpoint_under_runs_is_refused(home):
    partial = paths.runs_dir() / "r1" / "checkpoints" / "tmp-checkpoint-3"
    partial.mkdir(parents=True)
    assert_reported(problems({"resume_from_checkpoint": str(partial)}), "resume_from_checkpoint",
                    "is not a completed checkpoint folder (no trainer_state.json)")
    shutil.rmtree(paths.runs_dir() / "r1")
    assert_nothing_left(home)


def test_hub_dataset_id_that_is_a_local_folder_outside_the_roots_is_refused(home, tmp_path, outside, monkeypatch):
    work = _mkdir(tmp_path / "work")
    _link(work / "leak", outside)  # a folder named like a hub id, leading outside the allowed roots
    monkeypatch.chdir(work)
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", str(tmp_path / "home"))
    errors = problems({"hf_dataset": "leak", "local_datasets": []})
    assert [e.field for e in errors] == ["hf_dataset"]


# ====================================================================== uploads (New run page -> save_upload)
UPLOAD_CASES = [
    # (id, file name, data, max_bytes, phrases)
    ("extension-exe", "payload.exe", b"MZ", None, ["payload.exe: unsupported file type '.exe'",
                                                  "upload one of .jsonl, .json, .csv, .parquet"]),
    ("extension-double", "rows.jsonl.sh", b"echo", None, ["unsupported file type '.sh'"]),
    ("extension-none", "README", b"text", None, ["README: unsupported file type '(none)'"]),
    ("empty", "rows.jsonl", b"", None, ["rows.jsonl is empty"]),
    ("oversized", "big.jsonl", b"x" * (3 * 2**20), 2 * 2**20,
     ["big.jsonl is 3.0 MiB; uploads are limited to 2 MiB", "enter their path instead"]),
]


@pytest.mark.parametrize("name, data, max_bytes, phrases", [c[1:] for c in UPLOAD_CASES],
                         ids=[c[0] for c in UPLOAD_CASES])
def test_bad_upload_is_refused_and_nothing_is_stored(home, name, data, max_bytes, phrases):
    kwargs = {"max_bytes": max_bytes} if max_bytes else {}
    with pytest.raises(DatasetError) as raised:
        sources.save_upload(name, data, **kwargs)
    assert raised.value.field == "local_datasets"
    for phrase in phrases:
        assert phrase in raised.value.message
    assert_nothing_left(home)


class ChunkCountingUpload(io.RawIOBase):
    """An upload that can only be read piece by piece (no getvalue), recording how much each read asked for."""

    def __init__(self, data: bytes):
        self._inner = io.BytesIO(data)
        self.reads: list[int] = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._inner.seek(offset, whence)

    def read(self, size: int = -1) -> bytes:
        self.reads.append(size)
        return self._inner.read(size)


def test_an_upload_is_streamed_to_disk_in_chunks(home):
    data = b'{"text": "row"}\n' * 300_000  # 4.8 MB
    upload = ChunkCountingUpload(data)
    saved = sources.save_upload("rows.jsonl", upload)
    assert saved.read_bytes() == data
    assert upload.reads and all(0 < size <= sources.UPLOAD_CHUNK for size in upload.reads)
    assert len(upload.reads) >= len(data) // sources.UPLOAD_CHUNK
    assert sources.save_upload("rows.jsonl", data) == saved  # the same content, given as bytes: the same file
    assert_nothing_left(home, uploads_before={saved.name})


def test_upload_name_with_path_characters_stays_in_the_datasets_folder(home):
    saved = sources.save_upload("../../../etc/evil\x00name.jsonl", b'{"text": "a"}\n')
    assert saved.parent == paths.datasets_dir()
    assert saved.name.startswith("evil_name-") and saved.suffix == ".jsonl"
    assert_nothing_left(home, uploads_before={saved.name})


PAGE_UPLOAD_CASES = [
    # (id, upload name, data, field, phrases)
    ("page-corrupt-jsonl", "rows.jsonl", (FIXTURES / "corrupt.jsonl").read_bytes(), "local_datasets",
     ["line 7 is not valid JSON"]),
    ("page-wrong-columns", "rows.jsonl", (FIXTURES / "unknown_columns.jsonl").read_bytes(), "format_type",
     ["could not tell the format", "custom_format_mapping"]),
    ("page-not-parquet", "rows.parquet", b"PAR1 not parquet", "local_datasets", ["is not a readable Parquet file"]),
]


@pytest.mark.parametrize("name, data, field, phrases", [c[1:] for c in PAGE_UPLOAD_CASES],
                         ids=[c[0] for c in PAGE_UPLOAD_CASES])
def test_new_run_page_reports_a_bad_upload_by_field(app_home, name, data, field, phrases):
    at = open_page("pages/new_run.py")
    at.radio(key="nr_dataset_source").set_value("upload")
    at.file_uploader(key="nr_upload").set_value((name, data, "application/octet-stream"))
    submit(at)
    errors = texts(at, "error")
    assert _page_fields(errors) == {field}, errors
    mine = [e for e in errors if e.startswith(f"**{field}**:")]  # the page may show it twice: inline and in the summary
    assert all(phrase in m for m in mine for phrase in phrases), mine
    # The upload itself is kept whole under its content-addressed name, so a resubmit after fixing the
    # mapping reuses it; nothing else is written.
    stored = [p.name for p in paths.datasets_dir().iterdir()]
    assert len(stored) == 1 and stored[0].startswith("rows-")
    assert_nothing_left(app_home, uploads_before=set(stored))


def _page_fields(errors: list[str]) -> set[str]:
    """Fields named by the page's error boxes (each reads '**field**: message')."""
    return {e.split("**")[1] for e in errors if e.startswith("**")}


def test_new_run_page_refuses_paths_and_names_together(app_home, tmp_path, outside):
    at = open_page("pages/new_run.py")
    at.text_input(key="nr_run_name").input("../escape")
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(f"{tmp_path}/../{outside.name}/data.jsonl")
    at.radio(key="nr_model_source").set_value("local")
    at.text_input(key="nr_model_text").input(str(outside / "model"))
    submit(at)
    errors = texts(at, "error")
    assert _page_fields(errors) == {"local_datasets", "model_name", "run_name"}, errors
    assert all(OUTSIDE in e for e in errors if e.startswith(("**local_datasets**", "**model_name**")))
    assert all("no slashes" in e for e in errors if e.startswith("**run_name**"))
    assert_nothing_left(app_home)


# Paths no file system can hold: the OS would raise OSError (name too long) or ValueError (NUL) instead of
# saying what to fix, which crashed New run (the Start button disappeared) and the CLI.
UNUSABLE_PATHS = {"300-characters": ("./" + "a" * 300, "names are limited to 255"),
                  "nul-byte": ("data\x00.jsonl", "contains a NUL character"),
                  "5000-bytes": ("/" + "/".join(["d" * 200] * 25), "paths are limited to 4,095")}
PATH_FIELDS = ("model_name", "local_datasets", "local_eval_datasets", "resume_from_checkpoint", "init_adapter",
               "tensorboard_dir")


@pytest.mark.parametrize("kind", UNUSABLE_PATHS)
def test_new_run_page_reports_an_unusable_path_in_every_path_field(app_home, kind):
    bad, phrase = UNUSABLE_PATHS[kind]
    at = open_page("pages/new_run.py")
    at.radio(key="nr_model_source").set_value("local")
    at.text_input(key="nr_model_text").input(bad)
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(bad)
    at.text_input(key="nr_local_eval_datasets").input(bad)
    at.text_input(key="nr_resume_from_checkpoint").input(bad)
    at.text_input(key="nr_init_adapter").input(bad)
    at.toggle(key="nr_enable_tensorboard").set_value(True)
    at.text_input(key="nr_tensorboard_dir").input(bad)
    submit(at)
    errors = texts(at, "error")
    for field in PATH_FIELDS:
        assert any(e.startswith(f"**{field}**") and phrase in e for e in errors), (field, errors)
    assert [b for b in at.button if b.label == "Start training"]  # the form is still there to fix
    assert_nothing_left(app_home)


@pytest.mark.parametrize("field", PATH_FIELDS)
@pytest.mark.parametrize("kind", UNUSABLE_PATHS)
def test_cli_reports_an_unusable_path_as_a_field_error(home, tmp_path, capsys, field, kind):
    bad, phrase = UNUSABLE_PATHS[kind]
    config = tmp_path / "run.yaml"
    value = [bad] if field in ("local_datasets", "local_eval_datasets") else bad
    config.write_text(yaml.safe_dump({field: value, "enable_tensorboard": field == "tensorboard_dir"}))
    for command in ("validate", "run"):
        assert cli_main([command, "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        mine = [line for line in err.splitlines() if line.startswith(f"error: {field}: ")]
        assert len(mine) == 1 and phrase in mine[0], err
    assert_nothing_left(home)


@pytest.mark.parametrize("kind", UNUSABLE_PATHS)
def test_cli_reports_an_unusable_config_path(home, capsys, kind):
    bad, phrase = UNUSABLE_PATHS[kind]
    assert cli_main(["validate", "--config", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config: ") and phrase in err, err


@pytest.mark.parametrize("suffix, text", [
    (".json", "[" * 100_000 + "]" * 100_000),
    (".jsonl", '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}\n"),
    (".csv", 'messages\n"' + "[" * 100_000 + "]" * 100_000 + '"\n'),
])
def test_deeply_nested_json_is_a_field_error(home, tmp_path, suffix, text):
    data = tmp_path / f"deep{suffix}"
    data.write_text(text)
    errors = problems({"local_datasets": [str(data)]})
    if suffix == ".csv":  # a cell too deep to be read as turns is not a chat column: nothing to detect
        assert_reported(errors, "format_type", "could not tell the format")
    else:
        assert_reported(errors, "local_datasets", "nests lists or objects too deeply to read")


def test_cli_set_with_a_value_that_is_not_yaml(home, capsys):
    assert cli_main(["validate", "--config", "/dev/null", "--set", "lora_r=[[[" ]) == 2
    assert "error: lora_r: --set value '[[[' is not a YAML value" in capsys.readouterr().err


# ====================================================================== resource sanity
HUGE = {"max_seq_length": 131072, "batch_size": 4096}


def test_settings_far_beyond_the_device_memory_are_refused_with_the_estimate_and_the_fix(home):
    orch = Orchestrator(start_pump=False)
    try:
        with pytest.raises(ConfigError) as raised:
            orch.start(TrainConfig(**HUGE))
        assert orch.validate(TrainConfig(**HUGE, allow_memory_overcommit=True)) == []
        assert orch.validate(TrainConfig()) == []  # the defaults fit anywhere
    finally:
        orch.close()
    [error] = raised.value.errors
    assert error.field == "memory"
    for phrase in ("Will not fit: needs about", "To make room:", "lower max_seq_length to 65536",
                   "in total, so the run is refused", "set allow_memory_overcommit to start anyway"):
        assert phrase in error.message, error.message
    assert_nothing_left(home)


def test_new_run_page_refuses_settings_far_beyond_the_device_memory(app_home):
    at = open_page("pages/new_run.py")
    at.number_input(key="nr_max_seq_length").set_value(HUGE["max_seq_length"])
    at.number_input(key="nr_batch_size").set_value(HUGE["batch_size"])
    submit(at)
    errors = texts(at, "error")
    assert any(e.startswith("**memory**") and "allow_memory_overcommit" in e for e in errors), errors
    assert_nothing_left(app_home)


def test_cli_refuses_settings_far_beyond_the_device_memory_unless_overridden(home, capsys):
    sets = [arg for key, value in HUGE.items() for arg in ("--set", f"{key}={value}")]
    for command in ("validate", "run"):
        assert cli_main([command, "--config", "/dev/null", *sets]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: memory: Will not fit") and "allow_memory_overcommit" in err, err
    assert cli_main(["validate", "--config", "/dev/null", *sets, "--set", "allow_memory_overcommit=true"]) == 0
    assert_nothing_left(home)


@pytest.mark.parametrize("message, oom", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB", True),
    ("[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
     "1099511627776 bytes. Error code 12 (Cannot allocate memory)", True),
    ("DefaultCPUAllocator: not enough memory: you tried to allocate 68719476736 bytes.", True),
    ("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)", False),
])
def test_a_cpu_allocation_failure_gets_the_out_of_memory_hint(message, oom):
    from trainer_core.worker import train  # stdlib and our own modules only: the ML stack loads inside Worker.run

    assert train._is_oom(RuntimeError(message)) is oom
    assert train._is_oom(MemoryError()) is True


@pytest.mark.parametrize("text, expected", [
    ("max_steps: 1.0e9\n", "error: max_steps: must be >= 0 and <= 10000000, got 1000000000"),
    ("max_steps: 2.5e0\n", "error: max_steps: expected a whole number, got '2.5e0'"),
])
def test_cli_reads_integral_exponent_numbers_and_names_the_rest(home, tmp_path, capsys, text, expected):
    config = tmp_path / "run.yaml"
    config.write_text(text)
    assert cli_main(["validate", "--config", str(config)]) == 2
    assert capsys.readouterr().err.strip() == expected
    config.write_text("max_steps: 1.2e3\n")
    assert cli_main(["validate", "--config", str(config)]) == 0
    assert TrainConfig.from_yaml("max_steps: 1.2e3").max_steps == 1200


@pytest.mark.parametrize("values, field, phrase", [
    ({"system_prompt": "x" * 20_001}, "system_prompt", "is 20,001 characters long; the limit is 20,000"),
    ({"subset": "s" * 201}, "subset", "the limit is 200"),
    ({"train_split": "t" * 201}, "train_split", "the limit is 200"),
    ({"wandb_project": "w" * 129}, "wandb_project", "the limit is 128"),
    ({"model_name": "org/" + "m" * 250}, "model_name", "a hub model id is at most 200 characters"),
    ({"hf_dataset": "org/" + "d" * 250, "local_datasets": []}, "hf_dataset", "a hub dataset id is at most 200"),
    ({"custom_format_mapping": {"instruction": "q" * 201}}, "custom_format_mapping", "at most 200 characters"),
])
def test_free_text_fields_have_length_limits(home, values, field, phrase):
    assert_reported(problems(values), field, phrase)


def test_new_run_page_reports_an_overlong_system_prompt(app_home):
    at = open_page("pages/new_run.py")
    at.text_area(key="nr_system_prompt").input("be brief. " * 2_500)
    submit(at)
    errors = texts(at, "error")
    assert any(e.startswith("**system_prompt**") and "the limit is 20,000" in e for e in errors), errors
    assert_nothing_left(app_home)


def test_orchestrator_start_refuses_bad_config_without_a_trace(home, tmp_path, outside):
    orch = Orchestrator(start_pump=False)
    try:
        with pytest.raises(ConfigError) as raised:
            orch.start(TrainConfig(run_name="a/b", local_datasets=[str(outside / "data.jsonl")], learning_rate=NAN))
    finally:
        orch.close()
    assert sorted(e.field for e in raised.value.errors) == ["learning_rate", "local_datasets", "run_name"]
    assert_nothing_left(home)


# ====================================================================== the headless CLI
def _cli(tmp_path: Path, command: str, config: dict | str, *extra: str, env: dict | None = None) -> SimpleNamespace:
    """The CLI's main() in this process (a subprocess per case cost ~7 s on this machine: the imports), with
    its own environment, exit code and output, like a separate run of ``python -m trainer_core``."""
    path = tmp_path / "run.yaml"
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    base = {"FINETUNE_STUDIO_HOME": str(tmp_path / "home"), "FINETUNE_STUDIO_FORCE_CPU": "1",
            "FINETUNE_STUDIO_ALLOWED_ROOTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {**base, **(env or {})}.items():
            mp.setenv(name, value)
        for name in ("HF_TOKEN", "WANDB_API_KEY", "DATABASE_URL", "FINETUNE_STUDIO_MODELS"):
            mp.delenv(name, raising=False)
        hardware.cuda_available.cache_clear()  # cached per process: recompute under FORCE_CPU
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli_main([command, "--config", str(path), *extra])
        finally:
            hardware.cuda_available.cache_clear()
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


CLI_CASES = [
    # (id, command, yaml config, extra args, field, phrases)
    ("unknown-key", "validate", {"max_step": 10, "learning_rate": 1e-4}, [], "max_step",
     ["unknown field. Did you mean 'max_steps'?"]),
    ("secret-in-yaml", "validate", {"hf_token": "hf_in_yaml_123"}, [], "hf_token",
     ["secrets do not belong in YAML; set HF_TOKEN / WANDB_API_KEY in the environment"]),
    ("wandb-secret-in-yaml", "run", {"wandb_token": "wb_in_yaml_123"}, [], "wandb_token",
     ["secrets do not belong in YAML"]),
    ("not-yaml", "validate", "max_steps: [1,\n", [], "config", ["is not valid YAML"]),
    ("not-a-mapping", "validate", "- a\n- b\n", [], "config", ["must hold a mapping of field: value"]),
    ("nan-lr-run", "run", "learning_rate: .nan\n", [], "learning_rate", ["must be a finite number, got nan"]),
    ("negative-batch-run", "run", {"batch_size": -4}, [], "batch_size", ["use a batch size of at least 1"]),
    ("bad-set", "validate", {}, ["--set", "max_steps"], "--set", ["expected key=value, got 'max_steps'"]),
    ("set-huge-lora", "run", {}, ["--set", "lora_r=1000000000000"], "lora_r", ["must be >= 1 and <= 4096, got 1000000000000"]),
    ("run-name-path", "run", {"run_name": "../../etc/x"}, [], "run_name", ["no slashes"]),
]


@pytest.mark.parametrize("command, config, extra, field, phrases", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_bad_config_with_exit_2(tmp_path, command, config, extra, field, phrases):
    result = _cli(tmp_path, command, config, *extra)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    mine = [line for line in result.stderr.splitlines() if line.startswith(f"error: {field}: ")]
    assert len(mine) == 1, result.stderr
    for phrase in phrases:
        assert phrase in mine[0]
    for secret in ("hf_in_yaml_123", "wb_in_yaml_123"):
        assert secret not in result.stdout + result.stderr  # refusing a secret does not echo it
    home = tmp_path / "home"
    assert not (home / "runs").exists() or list((home / "runs").iterdir()) == []
    if (home / "studio.db").exists():
        assert Store(f"sqlite:///{home / 'studio.db'}").list_runs() == []
    good = _cli(tmp_path, "validate", {"max_steps": 3})
    assert good.returncode == 0 and good.stdout.strip() == "config is valid", good.stderr


def test_cli_reports_every_problem_at_once(tmp_path):
    result = _cli(tmp_path, "validate", {"learning_rate": 0, "batch_size": 0, "lora_r": 0, "eval_fraction": 2})
    assert result.returncode == 2
    fields = [line.split(":")[1].strip() for line in result.stderr.splitlines() if line.startswith("error:")]
    assert fields == ["learning_rate", "batch_size", "eval_fraction", "lora_r"]


def test_cli_refuses_a_secret_passed_with_set(tmp_path):
    result = _cli(tmp_path, "validate", {}, "--set", "hf_token=hf_on_argv_123")
    assert result.returncode == 2
    assert any(line.startswith("error: hf_token: ") for line in result.stderr.splitlines()), result.stderr


# ====================================================================== hub ids that cannot be reached offline
@pytest.mark.subprocess
@pytest.mark.parametrize("values, field", [
    pytest.param({"model_name": "no-such-org/no-such-model"}, "model_name", id="hub-model"),
    pytest.param({"hf_dataset": "no-such-org/no-such-dataset", "local_datasets": []}, "hf_dataset",
                 id="hub-dataset"),
])
def test_unreachable_hub_id_fails_the_run_with_a_clear_message(home, tmp_path, monkeypatch, values, field):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty cache: nothing to fall back on
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    tiny = build_tiny_model()
    cfg = TrainConfig.from_dict({"model_name": str(tiny), "max_steps": 2, **values})
    assert cfg.validate() == []  # a well-formed id passes validation; only the worker can find out
    orch = Orchestrator()
    try:
        run_id = orch.start(cfg)
        snap = orch.wait(run_id, timeout=240, interval=0.2)
    finally:
        orch.close()
    run = Store().get_run(run_id)
    assert snap.status.value == "failed" and run.status == "failed"
    first_line = run.error.splitlines()[0]
    assert "Traceback" not in run.error
    if field == "hf_dataset":
        assert first_line.startswith("DatasetError: hf_dataset: could not reach the Hugging Face hub"), run.error
    else:
        assert "model_name" in first_line and "no-such-org/no-such-model" in first_line, run.error
    assert "Traceback" in run.log_tail  # the details stay available in the worker log
    assert json.loads(run.config_json)[next(iter(values))] == next(iter(values.values()))
