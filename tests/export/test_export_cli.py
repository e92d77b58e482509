"""``python -m trainer_core export``: bad input is a clear message and exit code 2, and no job is recorded."""
from __future__ import annotations

import pytest

from db.store import Store
from tests.support.factories import insert_finished_run
from trainer_core.__main__ import main
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.protocol import paths

RUN = "20260105-100000-aaaaaa"


@pytest.fixture
def cli_run(home, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("FINETUNE_STUDIO_TOKEN", raising=False)
    store = Store()
    insert_finished_run(store, RUN, "tone", [2.0, 1.5])
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    yield store
    store.engine.dispose()


def export(capsys, *args: str) -> tuple[int, str]:
    code = main(["export", *args])
    return code, capsys.readouterr().err


def test_bad_input_is_named_with_its_fix_and_records_nothing(cli_run, capsys, tmp_path):
    code, err = export(capsys, "tone", "--to", "gguf", "--quant", "q9_z")
    assert code == 2 and err.startswith("error: quantizations: unknown quantization type 'q9_z': known types are f16, "
                                        "bf16, q8_0, q2_k")
    code, err = export(capsys, RUN, "--checkpoint", "40", "--to", "merged")
    assert code == 2 and err == "error: checkpoint: run 'tone' has no checkpoint at step 40: it has no checkpoints\n"
    code, err = export(capsys, RUN, "--to", "adapter", "--push", "me/tone")
    assert code == 2 and err.startswith("error: push_repo_id: a hub push needs a write token: set HF_TOKEN")
    code, err = export(capsys, RUN, "--to", "adapter,onnx")
    assert code == 2 and err == ("error: targets: onnx: only an embedding run (a sentence-transformers folder) is "
                                 "exported to ONNX here: choose adapter, merged or gguf for this run\n")
    full = tmp_path / "exports" / "full"
    full.mkdir(parents=True)
    (full / "mine.txt").write_text("keep")
    code, err = export(capsys, RUN, "--to", "adapter", "-o", str(full))
    assert code == 2 and "already exists and is not an empty folder: name a new folder (nothing is overwritten)" in err
    assert (full / "mine.txt").read_text() == "keep"
    (paths.run_dir(RUN) / "adapter" / "adapter_config.json").unlink()
    code, err = export(capsys, RUN, "--to", "adapter")
    assert code == 2 and err.startswith("error: run: run 'tone' has no saved adapter yet (it is queued, still training, "
                                        "or failed before saving)")
    code, err = export(capsys, "no-such-run", "--to", "adapter")
    assert code == 2 and "no run matches 'no-such-run'" in err
    assert cli_run.children(RUN) == []  # no export job was recorded for any of them
