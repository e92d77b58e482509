"""The export's ONNX stage (trainer_core/worker/export.py) for embedding runs: sentence-transformers' own exporter
(optimum) needs transformers < 4.58, so it runs in the embedding venv (.venv-embed) as a tool of its own
(export_onnx_child.py) — in its own process group, killed on Cancel and with the worker, without the hub token."""
from __future__ import annotations

import json
from pathlib import Path

from trainer_core.export.spec import ONNX_INSTALL_FIX
from trainer_core.serving.spec import embed_python
from trainer_core.worker.export_plan import ExportError, Plan, Staged
from trainer_core.worker.export_tools import tool_env

CHILD = Path(__file__).with_name("export_onnx_child.py")
ONNX_FOLDER = "onnx"  # the artifact: a sentence-transformers folder whose model is onnx/model.onnx


def onnx_env() -> dict[str, str]:
    """tool_env (no secrets), reading local files only, and nothing of the studio's venv on the child's path."""
    env = tool_env()
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["HF_HUB_OFFLINE"] = "1"
    return env


class OnnxExport:
    """ExportWorker's onnx stage and the ONNX half of an embedding run's verify."""

    def onnx_python(self) -> Path:
        python = embed_python()
        if not python.exists():
            raise ExportError(ONNX_INSTALL_FIX)
        return python

    def onnx(self, plan: Plan) -> None:
        out = plan.staging / ONNX_FOLDER
        self.run_tool([str(self.onnx_python()), str(CHILD), "export", str(plan.resolved.model_dir), str(out)],
                      "the ONNX export (sentence-transformers, optimum)", onnx_env())
        plan.staged.append(Staged(ONNX_FOLDER, "onnx", "sentence-transformers", "the sentence-transformers folder "
                                  "with the model as ONNX (onnx/model.onnx): SentenceTransformer(path, "
                                  "backend=\"onnx\") loads it"))

    def onnx_vectors(self, plan: Plan, texts: list[str]):
        """The ONNX folder reloaded with backend="onnx" in the embedding venv: its normalized vectors of ``texts``."""
        import numpy as np

        work = plan.staging / ".work"
        work.mkdir(exist_ok=True)
        texts_file, vectors_file = work / "onnx-texts.json", work / "onnx-vectors.json"
        texts_file.write_text(json.dumps(texts))
        self.run_tool([str(self.onnx_python()), str(CHILD), "encode", str(plan.staging / ONNX_FOLDER),
                       str(texts_file), str(vectors_file)], "the ONNX model (onnxruntime)", onnx_env())
        return np.asarray(json.loads(vectors_file.read_text()), dtype=np.float32)
