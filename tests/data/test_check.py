"""The dataset files' check the orchestrator and the CLI add to the config's field checks."""
from __future__ import annotations

import json

from trainer_core.config import FieldError, TrainConfig
from trainer_core.data import loading


def errors(**values) -> list[FieldError]:
    """As the orchestrator composes them: the fields first, then the files."""
    cfg = TrainConfig(**values)
    return cfg.validate() + loading.check_data(cfg)


def test_hub_data_is_not_read_here(home):
    assert loading.check_data(TrainConfig(hf_dataset="org/data", local_datasets=[])) == []


def write_alpaca(path, rows: int = 20):
    path.write_text("".join(json.dumps({"instruction": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(rows)))
    return path


def test_local_dataset_file_validates(home, tmp_path):
    data = write_alpaca(tmp_path / "train.jsonl")
    assert errors(local_datasets=[str(data)], local_eval_datasets=[str(data)]) == []


def test_missing_dataset_file(home, tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    assert errors(local_datasets=[missing]) == [FieldError(
        "local_datasets", f"{missing} does not exist: check the path or upload the file")]
    assert errors(local_eval_datasets=[missing]) == [FieldError(
        "local_eval_datasets", f"{missing} does not exist: check the path or upload the file")]
    assert TrainConfig(local_datasets=[missing]).validate() == []  # the config checks fields, never files


def test_dataset_file_outside_allowed_roots(home, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    found = errors(local_datasets=[str(outside)])
    assert [e.field for e in found] == ["local_datasets"]
    assert found[0].message.startswith(f"{outside} resolves to {outside.resolve()}, which is outside the allowed")


def test_dataset_problems_join_config_problems(home, tmp_path):
    data = tmp_path / "odd.jsonl"
    data.write_text('{"foo": 1}\n{"foo": 2}\n')
    found = errors(local_datasets=[str(data)], batch_size=0)
    assert [e.field for e in found] == ["batch_size", "format_type"]
    assert found[1].message.startswith("odd.jsonl: could not tell the format: the columns are 'foo'.")
