"""Run by the export worker with the embedding venv's Python (.venv-embed: transformers < 4.58, which optimum's ONNX
exporter needs); imports nothing of the studio. Two commands:

    export SOURCE OUT        sentence-transformers' own ONNX export of the folder SOURCE, saved as the folder OUT
                             (the modules, the tokenizer and onnx/model.onnx)
    encode FOLDER TEXTS OUT  the ONNX folder FOLDER loaded with backend="onnx" (never exported again) embeds the
                             texts of the JSON file TEXTS; their normalized vectors go to the JSON file OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ONNX_FILE = Path("onnx") / "model.onnx"  # where sentence-transformers saves and looks for it


def export(source: str, out: str) -> int:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(source, device="cpu", backend="onnx")  # no model.onnx in source: optimum exports
    model.save(out)
    if not (Path(out) / ONNX_FILE).is_file():
        print(f"the export wrote no {ONNX_FILE} in {out}", file=sys.stderr)
        return 1
    print(f"exported {Path(out) / ONNX_FILE} ({(Path(out) / ONNX_FILE).stat().st_size:,} bytes)")
    return 0


def encode(folder: str, texts_file: str, out: str) -> int:
    # Without its model.onnx, backend="onnx" would quietly export the folder again and verify nothing.
    if not (Path(folder) / ONNX_FILE).is_file():
        print(f"{Path(folder) / ONNX_FILE} is missing", file=sys.stderr)
        return 1
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device="cpu", backend="onnx")
    texts = json.loads(Path(texts_file).read_text())
    vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    Path(out).write_text(json.dumps(vectors.tolist()))
    return 0


def main(argv: list[str]) -> int:
    commands = {"export": (export, 2), "encode": (encode, 3)}
    if not argv or argv[0] not in commands or len(argv) - 1 != commands[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    function, _ = commands[argv[0]]
    return function(*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
