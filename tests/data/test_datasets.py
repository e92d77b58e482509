"""trainer_core.data: reading, detecting, normalising and validating dataset files."""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer_core.config import BUNDLED_DATASET, FieldError, TrainConfig
from trainer_core.data import DatasetError, formats, loading, readers, sources
from trainer_core.data.formats import NormalizedData

FIXTURES = Path(__file__).parents[1] / "fixtures" / "datasets"
DATASET_FIELDS = {"local_datasets", "local_eval_datasets", "format_type", "custom_format_mapping",
                  "dataset_slice_start", "system_prompt", "train_on_completions"}


@pytest.fixture
def data_home(home, tmp_path, monkeypatch):
    """The ``home`` data root, with tmp_path and the fixtures folder as allowed roots; caches emptied."""
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", os.pathsep.join([str(tmp_path), str(FIXTURES)]))
    readers._read_cache.clear()
    loading._check_cache.clear()
    yield home
    readers._read_cache.clear()
    loading._check_cache.clear()


def fixture(name: str) -> list[dict]:
    return readers.read_rows(FIXTURES / name)


def dataset_errors(cfg: TrainConfig) -> list[FieldError]:
    return [e for e in cfg.validate() + loading.check_data(cfg) if e.field in DATASET_FIELDS]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def system(text: str) -> dict:
    return {"role": "system", "content": text}


# ---------------------------------------------------------------------- formats
def test_alpaca_with_and_without_input_ignores_extra_columns():
    data = formats.normalize_rows(fixture("alpaca.jsonl"), "alpaca")
    assert data.format == "alpaca"
    assert data.reason == "format_type is set to 'alpaca'"
    assert data.rows == [
        {"messages": [user("Add 2 and 3."), assistant("5")]},
        {"messages": [user("Translate to French.\n\ncat"), assistant("chat")]},
        {"messages": [user("Name a colour."), assistant("Blue")]},
    ]
    assert data.dropped == {}


def test_chatml_keeps_system_turns_and_multi_turn():
    data = formats.normalize_rows(fixture("chatml.jsonl"), "chatml")
    assert data.rows == [
        {"messages": [system("You are terse."), user("Hi"), assistant("Hello.")]},
        {"messages": [user("2+2?"), assistant("4"), user("And 3+3?"), assistant("6")]},
    ]


def test_sharegpt_roles_map_to_chat_roles_from_json_object_with_list():
    data = formats.normalize_rows(fixture("sharegpt.json"), "sharegpt")
    assert data.rows == [
        {"messages": [system("Be kind."), user("Hello"), assistant("Hi there!")]},
        {"messages": [user("Capital of Peru?"), assistant("Lima.")]},
    ]


def test_raw_text_from_csv_keeps_quoted_commas_and_newlines():
    data = formats.normalize_rows(fixture("text.csv"), "text")
    assert data.rows == [{"text": "Once upon a time, a fox."}, {"text": "Line one\nLine two"}]


def test_parquet_with_nested_turns(tmp_path):
    path = tmp_path / "chat.parquet"
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert readers.read_rows(path) == rows
    data = formats.normalize_rows(readers.read_rows(path), "auto")
    assert data.rows == [{"messages": [user("Hi"), assistant("Hello")]}]


def test_chat_turns_stored_as_json_text_in_csv(tmp_path):
    path = tmp_path / "chat.csv"
    turns = json.dumps([{"role": "user", "content": "Hi, you"}, {"role": "assistant", "content": "Hello"}])
    path.write_text("messages\n" + '"' + turns.replace('"', '""') + '"\n', encoding="utf-8")
    data = formats.normalize_rows(readers.read_rows(path), "auto")
    assert (data.format, data.rows) == ("chatml", [{"messages": [user("Hi, you"), assistant("Hello")]}])


def test_json_lines_in_a_json_file_are_read(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    assert readers.read_rows(path) == [{"text": "a"}, {"text": "b"}]


# ---------------------------------------------------------------------- detection
@pytest.mark.parametrize("name, expected", [
    ("alpaca.jsonl", ("alpaca", "found 'instruction', 'input' and 'output' columns")),
    ("alpaca_dropped.jsonl", ("alpaca", "found 'instruction' and 'output' columns")),
    ("chatml.jsonl", ("chatml", "found a 'messages' column with role/content turns")),
    ("sharegpt.json", ("sharegpt", "found a 'conversations' column with from/value turns")),
    ("text.csv", ("text", "found a 'text' column of raw text")),
])
def test_detect_format_names_the_evidence(name, expected):
    assert formats.detect_format(fixture(name)) == expected


def test_auto_normalisation_reports_the_detection_reason():
    data = formats.normalize_rows(fixture("sharegpt.json"), "auto")
    assert (data.format, data.reason) == ("sharegpt", "found a 'conversations' column with from/value turns")


def test_undetectable_format_lists_columns_and_what_each_format_needs():
    with pytest.raises(DatasetError) as info:
        formats.detect_format(fixture("unknown_columns.jsonl"))
    assert info.value.field == "format_type"
    assert info.value.message == (
        "could not tell the format: the columns are 'prompt' and 'completion'. "
        "alpaca needs 'instruction' and 'output' columns (and optionally 'input'); "
        "chatml needs a 'messages' column holding a list of {role, content} turns; "
        "sharegpt needs a 'conversations' column holding a list of {from, value} turns; "
        "xlam needs 'query', 'answers' (the tool calls) and 'tools' columns; "
        "text needs a 'text' column of raw text. Rename your columns, or map them with "
        "custom_format_mapping (e.g. {instruction: question, output: answer}).")
    assert str(info.value) == f"format_type: {info.value.message}"


# ---------------------------------------------------------------------- custom mapping
def test_custom_mapping_for_alpaca_columns():
    data = formats.normalize_rows(fixture("custom.csv"), "alpaca", {"instruction": "question", "output": "answer"})
    assert data.rows == [
        {"messages": [user("What is 1+1?"), assistant("2")]},
        {"messages": [user("What is the capital of Chile?"), assistant("Santiago")]},
    ]


def test_custom_mapping_with_auto_detection_names_both_columns():
    data = formats.normalize_rows(fixture("custom.csv"), "auto", {"instruction": "question", "output": "answer"})
    assert data.format == "alpaca"
    assert data.reason == "found 'question' (mapped to 'instruction') and 'answer' (mapped to 'output') columns"


def test_custom_mapping_for_chatml_and_text_columns():
    chat = formats.normalize_rows(fixture("dialog.jsonl"), "auto", {"messages": "dialog"})
    assert (chat.format, chat.rows) == ("chatml", [{"messages": [user("Ping"), assistant("Pong")]}])
    text = formats.normalize_rows(fixture("body.jsonl"), "text", {"text": "body"})
    assert text.rows == [{"text": "Raw text one."}, {"text": "Raw text two."}]


def test_custom_mapping_of_turn_keys_and_role_names():
    rows = [{"chat": [{"speaker": "customer", "says": "Hi"}, {"speaker": "agent", "says": "Hello"}]}]
    mapping = {"conversations": "chat", "from": "speaker", "value": "says", "human": "customer", "gpt": "agent"}
    data = formats.normalize_rows(rows, "sharegpt", mapping)
    assert data.rows == [{"messages": [user("Hi"), assistant("Hello")]}]


def test_mapping_to_a_missing_column_names_it_and_the_columns_present():
    with pytest.raises(DatasetError) as info:
        formats.normalize_rows(fixture("custom.csv"), "alpaca", {"instruction": "question", "output": "reply"})
    assert info.value.field == "custom_format_mapping"
    assert info.value.message == ("maps output to 'reply', but the data has no such column; the columns are "
                                  "'question', 'answer' and 'notes'. Map to one of these columns.")


def test_unknown_mapping_key_is_rejected():
    with pytest.raises(DatasetError) as info:
        formats.normalize_rows(fixture("custom.csv"), "alpaca", {"question": "instruction"})
    assert info.value.field == "custom_format_mapping"
    assert info.value.message.startswith("unknown name 'question': map one of instruction, input, output")


# ---------------------------------------------------------------------- missing columns
def test_missing_columns_error_names_missing_and_present_columns():
    with pytest.raises(DatasetError) as info:
        formats.normalize_rows(fixture("custom.csv"), "alpaca")
    assert info.value.field == "format_type"
    assert info.value.message == (
        "format 'alpaca' needs 'instruction' and 'output' columns (and optionally 'input'), but 'instruction' and "
        "'output' are missing; the columns are 'question', 'answer' and 'notes'. Rename your columns, or map them "
        "with custom_format_mapping (e.g. {instruction: <your column>}).")


def test_text_format_on_chat_data_points_at_the_chat_format():
    with pytest.raises(DatasetError) as info:
        formats.normalize_rows(fixture("chatml.jsonl"), "text")
    assert info.value.field == "format_type"
    assert info.value.message == (
        "format 'text' needs a 'text' column of raw text, but 'text' is missing; the columns are 'messages'. "
        "This looks like chatml data (found a 'messages' column with role/content turns): set format_type to "
        "'chatml' or 'auto'.")


# ---------------------------------------------------------------------- system prompt, dropped rows
def test_system_prompt_is_prepended_unless_the_conversation_has_one():
    data = formats.normalize_rows(fixture("chatml.jsonl"), "auto", system_prompt="Be brief.")
    assert [row["messages"][0] for row in data.rows] == [system("You are terse."), system("Be brief.")]
    alpaca = formats.normalize_rows(fixture("alpaca.jsonl"), "alpaca", system_prompt="Be brief.")
    assert alpaca.rows[0] == {"messages": [system("Be brief."), user("Add 2 and 3."), assistant("5")]}


def test_dropped_chat_rows_are_counted_by_reason():
    data = formats.normalize_rows(fixture("dropped.jsonl"), "auto")
    assert len(data.rows) == 2
    assert data.dropped == {"empty conversation": 1, "no assistant turn": 1, formats.UNSUPPORTED_ROLE: 1,
                            "malformed turn": 1, "missing messages": 1}
    assert data.drop_examples == {formats.UNSUPPORTED_ROLE: ["'robot'"]}
    assert data.summary().endswith("dropped 5 (empty conversation: 1, malformed turn: 1, missing messages: 1, "
                                   "no assistant turn: 1, unsupported role (map it in custom_format_mapping, e.g. "
                                   "{bot: assistant}): 1)")


def test_thousands_of_rows_with_unknown_roles_make_one_warning_with_counts_and_examples():
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": f"bot{i}", "content": "yo"}]}
            for i in range(3000)]
    rows += [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 10
    rows += [{"messages": [{"role": "user", "content": "hi"}]}] * 2
    data = formats.normalize_rows(rows, "auto")
    assert data.dropped == {formats.UNSUPPORTED_ROLE: 3000, "no assistant turn": 2}
    assert data.drop_examples == {formats.UNSUPPORTED_ROLE: ["'bot0'", "'bot1'", "'bot2'"]}
    assert data.drop_warning() == (
        "Dropped 3,002 of 3,012 training rows: unsupported role (map it in custom_format_mapping, e.g. "
        "{bot: assistant}): 3,000 (e.g. 'bot0', 'bot1', 'bot2'); no assistant turn: 2")
    assert formats.normalize_rows(rows[3000:3010], "auto").drop_warning() is None


def test_dropped_alpaca_rows_are_counted_by_reason():
    data = formats.normalize_rows(fixture("alpaca_dropped.jsonl"), "alpaca")
    assert data.rows == [{"messages": [user("Keep me"), assistant("kept")]}]
    assert data.dropped == {"missing output": 2, "missing instruction": 1}


def test_no_usable_rows_is_an_error_on_the_dataset_field():
    rows = [{"instruction": "x", "output": ""}, {"instruction": "y"}]
    with pytest.raises(DatasetError) as info:
        formats.normalize_rows(rows, "alpaca")
    assert info.value.field == "local_datasets"
    assert info.value.message == ("no usable rows: all 2 rows were dropped (missing output: 2). "
                                  "Check the format and column mapping.")


# ---------------------------------------------------------------------- reading errors
def test_corrupt_jsonl_reports_the_line_number():
    with pytest.raises(DatasetError) as info:
        fixture("corrupt.jsonl")
    assert info.value.field == "local_datasets"
    assert info.value.message.startswith("corrupt.jsonl: line 7 is not valid JSON: ")
    assert info.value.message.endswith("Fix or remove that line.")


def test_empty_file_has_no_rows():
    with pytest.raises(DatasetError) as info:
        fixture("empty.jsonl")
    assert (info.value.field, info.value.message) == ("local_datasets", "empty.jsonl has no rows")


def test_non_utf8_file_names_the_file_and_the_fix():
    with pytest.raises(DatasetError) as info:
        fixture("latin1.csv")
    assert info.value.message == ("latin1.csv is not UTF-8 text (byte 0xe9 on line 2): re-save it as UTF-8 "
                                  "(in Excel: Save As > CSV UTF-8)")


def test_unsupported_extension_lists_the_supported_ones():
    with pytest.raises(DatasetError) as info:
        fixture("notes.txt")
    assert info.value.message == "notes.txt: unsupported file type '.txt'; use one of .jsonl, .json, .csv, .parquet"


def test_json_object_without_a_single_list_is_rejected(tmp_path):
    path = tmp_path / "odd.json"
    path.write_text('{"a": [1], "b": [2]}', encoding="utf-8")
    with pytest.raises(DatasetError, match="odd.json holds a JSON object with keys 'a' and 'b'"):
        readers.read_rows(path)


# ---------------------------------------------------------------------- sources and paths
def test_bundled_source_resolves_to_the_shipped_file(data_home):
    assert sources.resolve_source(BUNDLED_DATASET) == sources.bundled_demo_path()


def test_path_outside_allowed_roots_is_refused(data_home, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "secret.jsonl"
    outside.write_text('{"text": "x"}\n', encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        sources.resolve_source(str(outside), "local_eval_datasets")
    assert info.value.field == "local_eval_datasets"
    assert "which is outside the allowed folders" in info.value.message
    assert info.value.message.endswith("or add its folder to FINETUNE_STUDIO_ALLOWED_ROOTS.")


def test_symlink_pointing_outside_is_refused(data_home, tmp_path, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "secret.jsonl"
    outside.write_text('{"text": "x"}\n', encoding="utf-8")
    link = tmp_path / "link.jsonl"
    link.symlink_to(outside)
    with pytest.raises(DatasetError, match="outside the allowed folders"):
        sources.resolve_source(str(link))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "a"}\n', encoding="utf-8")
    (folder / "b.jsonl").symlink_to(outside)
    with pytest.raises(DatasetError, match="outside the allowed folders"):
        loading.load_local([str(folder)], TrainConfig())


def test_missing_file_is_reported(data_home, tmp_path):
    with pytest.raises(DatasetError) as info:
        sources.resolve_source(str(tmp_path / "nope.jsonl"))
    assert info.value.message == f"{tmp_path / 'nope.jsonl'} does not exist: check the path or upload the file"


def test_folder_source_reads_supported_files_in_name_order(data_home, tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "b.jsonl").write_text('{"text": "second"}\n', encoding="utf-8")
    (folder / "a.csv").write_text("text\nfirst\n", encoding="utf-8")
    (folder / "readme.md").write_text("ignored", encoding="utf-8")
    data = loading.load_local([str(folder)], TrainConfig())
    assert data.rows == [{"text": "first"}, {"text": "second"}]


def test_load_local_concatenates_then_slices(data_home):
    cfg = TrainConfig(dataset_slice_start=1, dataset_slice_end=4)
    data = loading.load_local([str(FIXTURES / "chatml.jsonl"), str(FIXTURES / "sharegpt.json")], cfg)
    assert data.rows == [
        {"messages": [user("2+2?"), assistant("4"), user("And 3+3?"), assistant("6")]},
        {"messages": [system("Be kind."), user("Hello"), assistant("Hi there!")]},
        {"messages": [user("Capital of Peru?"), assistant("Lima.")]},
    ]
    assert data.format == "chatml+sharegpt"
    assert data.is_chat
    assert len(loading.load_local([str(FIXTURES / "chatml.jsonl")], cfg, apply_slice=False).rows) == 2


def test_load_local_refuses_to_mix_text_and_chat(data_home):
    with pytest.raises(DatasetError) as info:
        loading.load_local([str(FIXTURES / "text.csv"), str(FIXTURES / "chatml.jsonl")], TrainConfig())
    assert info.value.message == ("mixes raw text (text.csv) with chat data (chatml.jsonl): "
                                  "train on one kind at a time")


# ---------------------------------------------------------------------- uploads
def test_save_upload_sanitises_the_name(data_home):
    payload = b'{"text": "x"}\n'
    path = sources.save_upload("../../evil.jsonl", payload)
    assert path.parent == data_home / "datasets"
    assert path.name.startswith("evil-") and path.suffix == ".jsonl"
    assert path.read_bytes() == payload
    assert sources.save_upload("../../evil.jsonl", payload) == path
    other = sources.save_upload(r"C:\Users\me\My Data (v2).JSONL", b'{"text": "y"}\n')
    assert other.parent == data_home / "datasets"
    assert other.name.startswith("My_Data_v2-") and other.suffix == ".jsonl"
    assert other != path


def test_save_upload_refuses_bad_extension_and_oversized_data(data_home):
    with pytest.raises(DatasetError) as info:
        sources.save_upload("payload.exe", b"MZ")
    assert info.value.field == "local_datasets"
    assert info.value.message == ("payload.exe: unsupported file type '.exe'; "
                                  "upload one of .jsonl, .json, .csv, .parquet")
    with pytest.raises(DatasetError) as info:
        sources.save_upload("big.jsonl", b"x" * (2**20 + 1), max_bytes=2**20)
    assert info.value.message.startswith("big.jsonl is 1.0 MiB; uploads are limited to 1 MiB.")
    assert not list(data_home.glob("datasets/*"))


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x002\xc8\x00\x002\xc8\x08\x00\x00\x00\x00"


@pytest.mark.parametrize("name, data, what", [
    ("rows.csv", PNG + b"\x00" * 64, "a PNG image"),
    ("rows.jsonl", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "a JPEG image"),
    ("rows.json", b"RIFF\x24\x00\x00\x00WAVEfmt ", "a WAV clip"),
    ("rows.csv", b"PK\x03\x04\x14\x00\x00\x00", "a ZIP archive"),
    ("rows.parquet", b'{"text": "a"}\n', "text"),
    ("rows.csv", b"a,b\n\x00\x01\x02\x03", "binary data"),
], ids=["png-as-csv", "jpeg-as-jsonl", "wav-as-json", "zip-as-csv", "text-as-parquet", "binary-as-csv"])
def test_an_upload_is_checked_by_its_content_not_its_extension(data_home, name, data, what):
    """A 13000 x 13000 PNG uploaded as .csv was stored under the datasets folder, where a dataset's rows could name
    it as an image and New run decoded it. What a file is comes from its bytes."""
    with pytest.raises(DatasetError) as info:
        sources.save_upload(name, data)
    assert info.value.field == "local_datasets"
    assert info.value.message.startswith(f"{name} is {what}, not a {name.rpartition('.')[2]} dataset file: "), \
        info.value.message
    assert not list(data_home.glob("datasets/*")) and not list(data_home.glob("datasets/.*"))


def test_text_and_parquet_uploads_pass_the_content_check(data_home, tmp_path):
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "t.parquet")
    for name, data in (("t.csv", "name,text\nZoë,é\n".encode("latin-1")), ("t.jsonl", b'{"text": "a"}\n'),
                       ("t.json", b"\xef\xbb\xbf[]"), ("t.parquet", (tmp_path / "t.parquet").read_bytes())):
        assert sources.save_upload(name, data).read_bytes() == data


def test_uploaded_file_name_resolves_from_the_datasets_folder(data_home):
    path = sources.save_upload("chat.jsonl", (FIXTURES / "chatml.jsonl").read_bytes())
    assert sources.resolve_source(path.name) == path


# ---------------------------------------------------------------------- eval split
def test_split_eval_is_deterministic_and_disjoint():
    data = NormalizedData("text", "test", [{"text": str(i)} for i in range(20)])
    train, held = loading.split_eval(data, 0.25, seed=3407)
    assert (len(train), len(held)) == (15, 5)
    assert (train, held) == loading.split_eval(data, 0.25, seed=3407)
    assert held != loading.split_eval(data, 0.25, seed=1)[1]
    assert sorted(r["text"] for r in train + held) == sorted(r["text"] for r in data.rows)


def test_split_eval_keeps_at_least_one_row_on_each_side():
    two = NormalizedData("text", "test", [{"text": "a"}, {"text": "b"}])
    assert [len(part) for part in loading.split_eval(two, 0.01, seed=0)] == [1, 1]
    assert loading.split_eval(two, 0.0, seed=0) == (two.rows, [])
    one = NormalizedData("text", "test", [{"text": "a"}])
    assert loading.split_eval(one, 0.4, seed=0) == (one.rows, [])


# ---------------------------------------------------------------------- bundled demo
def test_bundled_demo_parses_as_chatml():
    rows = readers.read_rows(sources.bundled_demo_path())
    data = formats.normalize_rows(rows, "auto")
    assert data.format == "chatml"
    assert len(data.rows) >= 200 and data.dropped == {}
    assert all(row["messages"][-1]["role"] == "assistant" for row in data.rows)
    assert all(row["messages"][-1]["content"].startswith("Studio here! ") for row in data.rows)
    assert any(row["messages"][0]["role"] == "system" for row in data.rows)


def test_bundled_demo_is_what_the_script_writes():
    script = Path(__file__).parents[2] / "scripts" / "make_demo_dataset.py"
    namespace = runpy.run_path(str(script), run_name="make_demo_dataset")
    expected = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in namespace["build"]())
    assert sources.bundled_demo_path().read_text(encoding="utf-8") == expected


# ---------------------------------------------------------------------- validation through TrainConfig
def test_default_config_validates_the_bundled_demo(data_home):
    assert dataset_errors(TrainConfig()) == []


def test_validate_reports_dataset_problems_with_field_names(data_home, tmp_path):
    cfg = TrainConfig(local_datasets=[str(FIXTURES / "corrupt.jsonl"), str(tmp_path / "missing.jsonl")],
                      local_eval_datasets=[str(FIXTURES / "latin1.csv")])
    errors = dataset_errors(cfg)
    assert [e.field for e in errors] == ["local_datasets", "local_datasets", "local_eval_datasets"]
    assert errors[0].message.startswith("corrupt.jsonl: line 7 is not valid JSON")
    assert errors[1].message.endswith("does not exist: check the path or upload the file")
    assert errors[2].message.startswith("latin1.csv is not UTF-8 text")


def test_validate_reports_format_mismatch_on_format_type(data_home):
    errors = dataset_errors(TrainConfig(local_datasets=[str(FIXTURES / "chatml.jsonl")], format_type="text"))
    assert [e.field for e in errors] == ["format_type"]
    assert errors[0].message.startswith("chatml.jsonl: format 'text' needs a 'text' column")


def test_validate_reports_bad_mapping_and_no_usable_rows(data_home):
    cfg = TrainConfig(local_datasets=[str(FIXTURES / "custom.csv")], custom_format_mapping={"instruction": "q"})
    assert dataset_errors(cfg) == [FieldError(
        "custom_format_mapping", "custom.csv: maps instruction to 'q', but the data has no such column; the columns "
                                 "are 'question', 'answer' and 'notes'. Map to one of these columns.")]
    cfg = TrainConfig(local_eval_datasets=[str(FIXTURES / "dropped.jsonl")])
    assert dataset_errors(cfg) == []  # some rows dropped is fine
    cfg = TrainConfig(local_datasets=[str(FIXTURES / "alpaca_dropped.jsonl")],
                      dataset_slice_start=1, dataset_slice_end=4)
    errors = dataset_errors(cfg)
    assert [e.field for e in errors] == ["local_datasets"]
    assert errors[0].message == ("alpaca_dropped.jsonl: no usable rows: all 3 rows were dropped "
                                 "(missing instruction: 1, missing output: 2). Check the format and column mapping.")


def test_validate_continued_pretraining_needs_text(data_home):
    errors = dataset_errors(TrainConfig(method="cpt", local_datasets=[BUNDLED_DATASET]))
    assert [e.field for e in errors] == ["local_datasets"]
    assert errors[0].message.startswith("continued pretraining (cpt) trains on raw text, but demo_chat.jsonl "
                                        "holds chatml chat data")
    assert dataset_errors(TrainConfig(method="cpt", local_datasets=[str(FIXTURES / "text.csv")])) == []


def test_validate_slice_beyond_the_data(data_home):
    errors = dataset_errors(TrainConfig(local_datasets=[str(FIXTURES / "chatml.jsonl")], dataset_slice_start=5))
    assert errors == [FieldError("dataset_slice_start", "the slice starts at row 5, but the training data has only "
                                                        "2 rows: lower dataset_slice_start or set it to 0")]


def test_validate_system_prompt_on_raw_text(data_home):
    errors = dataset_errors(TrainConfig(local_datasets=[str(FIXTURES / "text.csv")], system_prompt="Be kind."))
    assert [e.field for e in errors] == ["system_prompt"]


def test_check_sources_reads_each_file_once(data_home, monkeypatch):
    calls = []
    real_parse = readers._parse
    monkeypatch.setattr(readers, "_parse", lambda *a: calls.append(a[0]) or real_parse(*a))
    cfg = TrainConfig(local_datasets=[str(FIXTURES / "chatml.jsonl")])
    for _ in range(3):
        assert loading.check_sources(cfg.local_datasets, cfg, "local_datasets") == []
    assert calls == [FIXTURES / "chatml.jsonl"]


# ---------------------------------------------------------------------- hub (faked; never the network)
class FakeHubDataset:
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def select(self, indices):
        return FakeHubDataset([self.rows[i] for i in indices])

    def to_list(self):
        return list(self.rows)


def fake_datasets_module(monkeypatch, load_dataset):
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_load_hub_slices_the_training_split(monkeypatch):
    seen = {}

    def load_dataset(name, subset, split, token):
        seen.update(name=name, subset=subset, split=split, token=token)
        return FakeHubDataset([{"text": f"row {i}"} for i in range(5)])

    fake_datasets_module(monkeypatch, load_dataset)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    cfg = TrainConfig(hf_dataset="org/name", local_datasets=[], dataset_slice_start=1, dataset_slice_end=3)
    data = loading.load_hub(cfg, "train")
    assert seen == {"name": "org/name", "subset": None, "split": "train", "token": "hf_secret"}
    assert data.rows == [{"text": "row 1"}, {"text": "row 2"}]
    assert len(loading.load_hub(cfg, "test").rows) == 5  # the slice applies to the training split only


def test_load_hub_offline_explains_the_cache(monkeypatch):
    def load_dataset(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'org/name' on the Hub (LocalEntryNotFoundError)")

    fake_datasets_module(monkeypatch, load_dataset)
    with pytest.raises(DatasetError) as info:
        loading.load_hub(TrainConfig(hf_dataset="org/name", local_datasets=[]), "train")
    assert info.value.field == "hf_dataset"
    assert info.value.message.startswith("could not reach the Hugging Face hub and the dataset is not in the local "
                                         "cache: ConnectionError: Couldn't reach 'org/name'")


def test_load_hub_unknown_split_names_the_split_field(monkeypatch):
    def load_dataset(*args, **kwargs):
        raise ValueError('Unknown split "dev". Should be one of [\'train\', \'test\'].')

    fake_datasets_module(monkeypatch, load_dataset)
    cfg = TrainConfig(hf_dataset="org/name", local_datasets=[], eval_split="dev")
    with pytest.raises(DatasetError) as info:
        loading.load_hub(cfg, "dev")
    assert info.value.field == "eval_split"


# ---------------------------------------------------------------------- import hygiene
def test_module_does_not_import_the_ml_stack():
    code = ("import sys, trainer_core.data.loading; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'trl', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------- the form's chat-column sniffer
def test_turn_values_reads_turn_keys_and_speaker_names_like_the_converters():
    rows = [{"dialog": [{"who": "bot", "said": "hi"}, {"who": "person", "said": "yo"}]},
            {"dialog": json.dumps([{"who": "narrator", "said": "..."}])},  # turns stored as JSON text (CSV)
            {"dialog": "[[[[" * 2000 + "]]]]" * 2000},  # nested deeper than Python parses: skipped, no crash
            {"dialog": ["not a turn", 3]}, {"other": 1}]
    assert formats.turn_values(rows, "dialog") == ["who", "said"]
    assert formats.turn_values(rows, "dialog", "who") == ["bot", "person", "narrator"]
    assert formats.turn_values(rows, "dialog", "who", limit=2) == ["bot", "person"]
    assert formats.columns_of(rows) == ["dialog", "other"]


def test_unknown_speakers_are_the_names_no_format_knows():
    assert formats.unknown_speakers(["Human", " gpt ", "system", "bot", "narrator"]) == ["bot", "narrator"]
