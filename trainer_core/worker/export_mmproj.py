"""A vision-language model's GGUF (trainer_core/worker/export.py): the language model's GGUF comes from the usual
stage, and llama.cpp's converter with ``--mmproj`` writes the vision tower and projector as a second file, the
mmproj. Ollama gets no Modelfile for the pair (see OLLAMA_NO_PROJECTOR); llama.cpp runs it as written.

The mmproj's verify reads the file back with the ``gguf`` package and compares every tensor with the merged model's
vision tower and projector weights: the converter renames them, may reorder a tensor's elements (a permutation, as
for Llama's attention heads) and stores them as f16 (matrices) or f32 (norms, biases, embeddings). So each mmproj
tensor is matched to a merged tensor holding exactly the same values once cast to the mmproj tensor's type: the same
values in the same order ("exact"), or the same multiset of values (sorted, compared element for element:
"permuted"). Every merged vision tensor must find one mmproj tensor and every mmproj tensor one merged tensor. Both
files are read with numpy alone (no torch)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from trainer_core.export import tools
from trainer_core.protocol.status import RunStatus
from trainer_core.worker.export_plan import ExportError, Plan, Staged

# Why a vision export writes no Ollama Modelfile: Ollama's support for a separate projector file depends on its
# version and the model (ollama/ollama#9967: Gemma 3 loses its vision; #14730: Qwen3.5 fails to load; #17491:
# `ollama create` hangs on a Pixtral pair), so no Modelfile is written that may not run.
OLLAMA_NO_PROJECTOR = ("No Ollama Modelfile: Ollama does not reliably run a llama.cpp GGUF with a separate mmproj "
                       "projector file")
# Names of a vision-language model's tensors that are not its language model's: the pool the mmproj is matched from.
VISION_PARTS = ("vision", "visual", "connector", "multi_modal_projector", "mm_projector", "image_newline")


def mmproj_name(plan: Plan) -> str:
    return f"{tools.MMPROJ_PREFIX}{plan.stem}-{tools.MMPROJ_TYPE}.gguf"


def run_commands(model: str, mmproj: str) -> str:
    return (f"llama-server -m {model} --mmproj {mmproj} (an OpenAI-compatible server that takes images), or "
            f"llama-mtmd-cli -m {model} --mmproj {mmproj} --image photo.png -p 'Describe the image.'")


class Projector:
    """ExportWorker's mmproj stage (after the language GGUF) and its tensor check (in verify)."""

    def mmproj(self, plan: Plan) -> None:
        script = tools.converter_script()
        if script is None:
            raise ExportError(tools.missing_converter_message())
        name = mmproj_name(plan)
        self.convert(script, plan.merged_dir, tools.MMPROJ_TYPE, plan.staging / name, mmproj=True)
        model = next(s.name for s in plan.staged if s.artifact == "gguf")
        how = run_commands(model, name)
        plan.staged.append(Staged(name, "mmproj", tools.MMPROJ_TYPE,
                                  f"llama.cpp's vision projector ({tools.MMPROJ_TYPE}) for {model}: run the pair "
                                  f"with {how}"))
        self.status(RunStatus.RUNNING, "mmproj", f"wrote {name}")
        self.warn(f"{OLLAMA_NO_PROJECTOR}, so none was written; run the model with {how}")

    def verify_mmproj(self, plan: Plan) -> None:
        for item in plan.staged:
            if item.artifact == "mmproj":
                self.check_control()
                result = compare_mmproj(plan.staging / item.name, plan.merged_dir)
                self.log(f"verify mmproj: projector type {result.pop('projector')}")
                self.report_verify(plan, result)


def read_mmproj(path: Path) -> tuple[str, dict[str, object]]:
    """(clip.projector_type, {tensor name: values}) of an mmproj file, read with the gguf package. f16/f32/bf16
    tensors come back as they are stored; a quantized one is dequantized (and then only its permuted form can
    match, with float32 rounding: such files are not written here)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    field = reader.fields.get("clip.projector_type")
    projector = bytes(field.parts[field.data[0]]).decode("utf-8", "replace") if field is not None else ""
    tensors = {}
    for t in reader.tensors:
        if t.tensor_type in (GGMLQuantizationType.F16, GGMLQuantizationType.F32):
            tensors[t.name] = np.asarray(t.data)
        elif t.tensor_type == GGMLQuantizationType.BF16:
            tensors[t.name] = (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            tensors[t.name] = dequantize(t.data, t.tensor_type)
    return projector, tensors


SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8"}


def merged_vision_tensors(folder: Path) -> dict[str, object]:
    """The merged model's vision tower and projector weights as float32 numpy arrays, read straight from the
    safetensors shards (an 8-byte header length, a JSON header of dtype, shape and byte offsets, then the data):
    bfloat16, which numpy has no type for, is widened by shifting its 16 bits into a float32's high half."""
    import json

    import numpy as np

    found = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with open(shard, "rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(length))
            for key, info in header.items():
                if key == "__metadata__" or not any(part in key for part in VISION_PARTS):
                    continue
                if info["dtype"] not in SAFETENSORS_DTYPES:
                    raise ExportError(f"the merged model's {key} is {info['dtype']}: the mmproj check reads 16- and "
                                      "32-bit float weights only")
                start, end = info["data_offsets"]
                fh.seek(8 + length + start)
                values = np.frombuffer(fh.read(end - start), dtype=SAFETENSORS_DTYPES[info["dtype"]])
                if info["dtype"] == "BF16":
                    values = (values.astype(np.uint32) << 16).view(np.float32)
                found[key] = values.astype(np.float32).reshape(info["shape"])
    return found


def _key(values) -> tuple[int, str]:
    import numpy as np

    return values.size, hashlib.sha256(np.sort(values, axis=None).tobytes()).hexdigest()


def compare_mmproj(path: Path, merged_dir: Path) -> dict:
    """VerifyEvent fields (plus ``projector``): how many of the merged model's vision tensors the mmproj holds
    value for value (see the module's docstring), and the first that it does not."""
    import numpy as np

    projector, written = read_mmproj(path)
    merged = merged_vision_tensors(merged_dir)
    pool: dict[tuple[str, tuple[int, str]], list[str]] = {}  # (mmproj dtype, key) -> merged names left to match
    for name, values in merged.items():
        for dtype in {str(v.dtype) for v in written.values()}:
            pool.setdefault((dtype, _key(values.astype(dtype))), []).append(name)
    matched: dict[str, str] = {}  # merged name -> mmproj name
    exact, unmatched = 0, []
    for gguf_name, values in written.items():
        names = [n for n in pool.get((str(values.dtype), _key(values)), []) if n not in matched]
        if not names:
            unmatched.append(gguf_name)
            continue
        # Prefer the candidate stored in the same order (equal-valued tensors, e.g. fresh norms, are interchangeable)
        same_order = [n for n in names if merged[n].size == values.size and
                      np.array_equal(merged[n].astype(values.dtype).reshape(-1), values.reshape(-1))]
        source = (same_order or names)[0]
        matched[source] = gguf_name
        exact += bool(same_order)
    missing = [n for n in merged if n not in matched]
    first = ""
    if unmatched:
        first = f"mmproj tensor {unmatched[0]} equals no vision tensor of the merged model"
    elif missing:
        first = f"the merged model's {missing[0]} is not in the mmproj"
    if first and len(unmatched) + len(missing) > 1:
        first += f" ({len(unmatched)} mmproj tensor(s) unmatched, {len(missing)} merged tensor(s) missing)"
    return dict(format=f"mmproj {projector or '(no projector type)'} tensors", identical=len(matched),
                total=max(len(merged), len(written)), first_difference=first,
                unit=f"equal to the merged model's vision weights ({exact} in the same order)",
                projector=projector or "missing")
