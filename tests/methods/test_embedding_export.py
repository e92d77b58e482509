"""Exporting an embedding run (issue 21): the sentence-transformers folder that SentenceTransformer(path) loads,
verified by reload (the run's own texts embed as the run's model embeds them, cosine >= 0.9999), through the
orchestrator and a real export worker; GGUF refused before start. The exported folder ranks a held-out jargon
query's passage first in a fresh interpreter, as the tuned model does."""
from __future__ import annotations

import json

import pytest

from tests.methods.test_embedding_run import jargon_files, run_config
from tests.support.data_rows import jargon
from tests.support import run_python
from trainer_core.export.spec import ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus

pytestmark = [pytest.mark.train, pytest.mark.subprocess]

RANK = """
import json, sys
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
query, passages = json.loads(sys.argv[2]), json.loads(sys.argv[3])
scores = model.similarity(model.encode([query]), model.encode(passages))[0].tolist()
print("RANKED:" + json.dumps(sorted(range(len(passages)), key=lambda i: -scores[i])))
"""


def test_an_embedding_run_exports_a_sentence_transformers_folder_verified_by_its_embeddings(studio, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    train, held_out = jargon_files(tmp_path)
    run_id = studio.start(run_config(train, held_out, max_steps=10, eval_steps=10))
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    refused = ExportSpec(source=ModelSource(run_id=run_id), targets=["gguf"]).validate()
    assert any(e.field == "targets" and "sentence-transformers folder" in e.message for e in refused)
    job_id = studio.submit(ExportSpec(source=ModelSource(run_id=run_id), targets=["merged"], verify=True))
    snap = studio.wait(job_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(job_id, 80)}"

    folder = paths.run_dir(job_id) / "artifacts"
    merged = folder / "merged"
    assert (merged / "modules.json").is_file() and (merged / "model.safetensors").is_file()
    verify = json.loads((folder / "verify.json").read_text())
    print("\nembedding export verify", verify)
    assert [(v["format"], v["identical"], v["total"]) for v in verify] == [("merged", 8, 8)]

    _, held = jargon()
    passages = [row["passage"] for row in held[:10]]
    ranked = run_python(RANK, str(merged), json.dumps(held[0]["question"]), json.dumps(passages))
    assert ranked.returncode == 0, ranked.stderr[-3000:]
    assert json.loads(ranked.stdout.split("RANKED:")[-1])[0] == 0  # its own passage first
