"""ONNX export of an embedding run (issue 21): sentence-transformers' own exporter, run in the embedding venv
(.venv-embed: optimum needs transformers < 4.58), writes the sentence-transformers folder with onnx/model.onnx;
verify reloads it there with backend="onnx" and compares the run's texts' vectors with the PyTorch model's (cosine
>= 0.9999). The spec refuses onnx for a model that is no embedding model, and without the embedding venv, naming
the fix; the exporter's environment holds no hub token."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.methods.test_embedding_run import jargon_files, run_config
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.export.spec import ONNX_INSTALL_FIX, ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.methods import embedding
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.serving.spec import EMBED_INSTALL_FIX, EMBED_VENV_ENV, embed_python
from trainer_core.worker.export_onnx import onnx_env

CHAT_RUN = "20260108-000000-c4a7c4"
EMBED_RUN = "20260108-000000-e4b0e4"
TEXTS = ["A cat sits on the mat.", "Stocks fell sharply on Monday.", "The kitten is resting on a rug."]

# In the embedding venv: the exported folder loaded with backend="onnx" (its model.onnx, never exported again) and
# the bundled model with PyTorch embed the same texts; prints the cosine of each pair.
RELOAD = """
import json, sys
from pathlib import Path
from sentence_transformers import SentenceTransformer
assert (Path(sys.argv[1]) / "onnx" / "model.onnx").is_file()
onnx = SentenceTransformer(sys.argv[1], device="cpu", backend="onnx")
torch_model = SentenceTransformer(sys.argv[2], device="cpu")
texts = json.loads(sys.argv[3])
a = onnx.encode(texts, normalize_embeddings=True)
b = torch_model.encode(texts, normalize_embeddings=True)
print(json.dumps({"backend": onnx.backend, "cosines": (a * b).sum(axis=1).tolist()}))
"""


def chat_run() -> None:
    folder = paths.run_dir(CHAT_RUN)
    (folder / "adapter").mkdir(parents=True)
    write_kind(folder, JobKind.TRAIN)
    (folder / "config.yaml").write_text(TrainConfig(run_name="tone", model_name=BUNDLED_MODEL).to_yaml())
    (folder / "adapter" / "adapter_config.json").write_text("{}")


def embedding_run(cfg: TrainConfig) -> None:
    """runs/<EMBED_RUN>: a full embedding run whose saved model/ is a copy of the bundled all-MiniLM-L6-v2 folder
    (no training: the export is what is tested)."""
    source = embedding.bundled_model_dir()
    assert source is not None, embedding.BUNDLED_FIX
    folder = paths.run_dir(EMBED_RUN)
    folder.mkdir(parents=True)
    write_kind(folder, JobKind.TRAIN)
    (folder / "config.yaml").write_text(cfg.to_yaml())
    shutil.copytree(source, folder / "model")


def problems(spec: ExportSpec) -> list[tuple[str, str]]:
    return [(e.field, e.message) for e in spec.validate()]


def test_onnx_is_refused_for_a_chat_run_and_without_the_embedding_venv_naming_the_fix(home, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    chat_run()
    assert problems(ExportSpec(source=ModelSource(run_id=CHAT_RUN), targets=["onnx"])) == [
        ("targets", "onnx: only an embedding run (a sentence-transformers folder) is exported to ONNX here: choose "
                    "adapter, merged or gguf for this run")]

    train, held_out = jargon_files(tmp_path)
    embedding_run(run_config(train, held_out))
    spec = ExportSpec(source=ModelSource(run_id=EMBED_RUN), targets=["merged", "onnx"])
    monkeypatch.setenv(EMBED_VENV_ENV, str(tmp_path / "no-venv"))
    assert problems(spec) == [("targets", ONNX_INSTALL_FIX)]
    assert "`make install`" in ONNX_INSTALL_FIX
    monkeypatch.delenv(EMBED_VENV_ENV)
    if embed_python().exists():  # .venv-embed beside the studio's venv
        assert problems(spec) == []
        assert spec.stages() == ["preflight", "merge", "onnx", "verify", "model card", "publish"]


def test_the_exporter_gets_no_hub_token_and_reads_local_files_only(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_never_in_the_child")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/of/the/studio")
    env = onnx_env()
    assert "HF_TOKEN" not in env and "PYTHONPATH" not in env
    assert env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.subprocess
def test_an_embedding_run_exports_onnx_that_reloads_with_the_pytorch_models_vectors(studio, tmp_path, monkeypatch):
    assert embed_python().exists(), EMBED_INSTALL_FIX
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    train, held_out = jargon_files(tmp_path)
    embedding_run(run_config(train, held_out))

    job_id = studio.submit(ExportSpec(source=ModelSource(run_id=EMBED_RUN), targets=["merged", "onnx"],
                                      verify=True))
    snap = studio.wait(job_id, timeout=300)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id, 80)}"

    artifacts = paths.run_dir(job_id) / "artifacts"
    folder = artifacts / "onnx"
    assert (folder / "onnx" / "model.onnx").is_file() and (folder / "modules.json").is_file()
    assert not (folder / "model.safetensors").exists()  # the ONNX folder, not the PyTorch weights again
    verify = json.loads((artifacts / "verify.json").read_text())
    assert [(v["format"], v["identical"], v["total"]) for v in verify] == [("merged", 8, 8), ("onnx", 8, 8)]
    assert (artifacts / "merged" / "model.safetensors").is_file()
    card = (artifacts / "README.md").read_text()
    assert 'SentenceTransformer("onnx", backend="onnx")' in card and "| onnx | 8/8 |" in card

    reloaded = subprocess.run([str(embed_python()), "-c", RELOAD, str(folder), str(embedding.bundled_model_dir()),
                               json.dumps(TEXTS)], capture_output=True, text=True, timeout=300,
                              env={**onnx_env(), "OMP_NUM_THREADS": "1"})
    assert reloaded.returncode == 0, reloaded.stderr[-3000:]
    result = json.loads(reloaded.stdout.strip().splitlines()[-1])
    assert result["backend"] == "onnx"
    assert [c >= 0.9999 for c in result["cosines"]] == [True, True, True], result
