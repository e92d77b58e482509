"""GGUF export of a vision-language run: the language model's GGUF and llama.cpp's mmproj projector file, decided from
the installed converter's own tables; refused before start, naming what is supported, where the converter cannot
write the projector (the SigLIP LLaVA); and end to end on a tiny Idefics3 (SmolVLM's architecture) trained through the
studio: both files published, hashed and verified (text answers, projector tensors), no Ollama Modelfile."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.vision import build_tiny_idefics3, shape_rows
from tests.support.data_rows import write_jsonl
from trainer_core.config import TrainConfig
from trainer_core.export import tools
from trainer_core.export.spec import ExportSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.config import promptsets

pytestmark = pytest.mark.skipif(tools.converter_script() is None,
                                reason="llama.cpp's converter is not installed (make install)")

SIGLIP_LLAVA = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                "image_token_index": 49152, "vision_config": {"model_type": "siglip_vision_model", "image_size": 32,
                                                              "patch_size": 8},
                "text_config": {"model_type": "llama"}}
IDEFICS3 = {"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3", "scale_factor": 2,
            "vision_config": {"model_type": "idefics3_vision", "image_size": 32, "patch_size": 8},
            "text_config": {"model_type": "llama", "architectures": ["VLlama3ForCausalLM"]}}
RUN = "20260104-100000-vision"


def vision_run(config: dict) -> None:
    """A finished LoRA run on a base model folder holding only ``config``: validation reads config files only."""
    base = paths.data_root() / "base"
    base.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps(config))
    folder = paths.run_dir(RUN)
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    (folder / "config.yaml").write_text(TrainConfig(run_name="shapes", model_name=str(base)).to_yaml())
    write_kind(folder, JobKind.TRAIN)


def target_errors(**values) -> list[str]:
    spec = ExportSpec(source=ModelSource(run_id=RUN), **values)
    return [e.message for e in spec.validate() if e.field == "targets"]


def test_the_support_decision_follows_the_converter_s_own_tables():
    supported = tools.vision_architectures(tools.converter_maps()[1])
    assert "Idefics3ForConditionalGeneration" in supported and "Gemma3ForConditionalGeneration" in supported
    assert "LlavaForConditionalGeneration (pixtral towers)" in supported
    assert "Qwen2AudioForConditionalGeneration" not in supported  # an audio encoder's projector is no vision model
    assert tools.vision_gguf_problem(IDEFICS3) is None
    listed = f" It converts these vision-language architectures: {', '.join(supported)}"
    assert tools.vision_gguf_problem(SIGLIP_LLAVA) == (
        "llama.cpp's converter writes the mmproj projector file of LlavaForConditionalGeneration for pixtral vision "
        "towers only, and this model's is siglip_vision_model." + listed)
    # The converter names the text model by text_config.architectures: without it, Idefics3 has no language GGUF.
    bare = {**IDEFICS3, "text_config": {"model_type": "llama"}}
    assert tools.vision_gguf_problem(bare) == (
        "llama.cpp's converter writes no language-model GGUF for Idefics3ForConditionalGeneration (the architecture "
        "its config names for the text model)." + listed)
    assert tools.vision_gguf_problem({**IDEFICS3, "architectures": ["PaliGemmaForConditionalGeneration"]}) == (
        "llama.cpp's converter writes no mmproj projector file for PaliGemmaForConditionalGeneration." + listed)


def test_a_newer_converter_extends_support_by_itself(tmp_path, monkeypatch):
    newer = tmp_path / "converter"
    shutil.copytree(tools.converter_script().parent / "conversion", newer / "conversion",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(tools.converter_script(), newer / "convert_hf_to_gguf.py")
    paligemma = {**IDEFICS3, "architectures": ["PaliGemmaForConditionalGeneration"], "text_config": {}}
    init = newer / "conversion" / "__init__.py"
    text = init.read_text()
    text = text.replace('MMPROJ_MODEL_MAP: dict[str, str] = {\n',
                        'MMPROJ_MODEL_MAP: dict[str, str] = {\n    "PaliGemmaForConditionalGeneration": "gemma",\n')
    init.write_text(text.replace('TEXT_MODEL_MAP: dict[str, str] = {\n',
                                 'TEXT_MODEL_MAP: dict[str, str] = {\n    "PaliGemmaForConditionalGeneration": '
                                 '"gemma",\n'))
    monkeypatch.setenv(tools.CONVERTER_ENV, str(newer))
    assert tools.vision_gguf_problem(paligemma) is None
    assert "PaliGemmaForConditionalGeneration" in tools.vision_architectures(tools.converter_maps()[1])
    init.write_text("# a layout without the two tables\n")
    assert tools.converter_maps() is None and tools.vision_gguf_problem(paligemma) is None  # no guess: the worker's
    # conversion then names what the converter says


def test_a_vision_run_the_converter_cannot_take_is_refused_before_start(home):
    vision_run(SIGLIP_LLAVA)
    [message] = target_errors(targets=["merged", "gguf"])
    assert message.startswith("gguf: llama.cpp's converter writes the mmproj projector file of "
                              "LlavaForConditionalGeneration for pixtral vision towers only, and this model's is "
                              "siglip_vision_model. It converts these vision-language architectures: ")
    assert "Idefics3ForConditionalGeneration" in message
    assert message.endswith(": export merged instead (it loads in transformers with its processor)")
    assert target_errors(targets=["merged"]) == []


def test_a_vision_run_the_converter_takes_exports_a_projector_instead_of_a_modelfile(home):
    vision_run(IDEFICS3)
    spec = ExportSpec(source=ModelSource(run_id=RUN), targets=["merged", "gguf"], quantizations=["q8_0", "f16"])
    assert spec.validate() == []
    assert spec.stages() == ["preflight", "merge", "gguf q8_0", "gguf f16", "mmproj", "verify", "model card",
                             "publish"]


def safetensors_header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        return length, json.loads(fh.read(length))


def change_one_value(path: Path, key: str, delta: float) -> None:
    """Add ``delta`` to the first element of a float16 tensor in a safetensors file, in place."""
    import numpy as np

    length, header = safetensors_header(path)
    assert header[key]["dtype"] == "F16"
    at = 8 + length + header[key]["data_offsets"][0]
    with open(path, "r+b") as fh:
        fh.seek(at)
        value = np.frombuffer(fh.read(2), dtype="<f2") + np.float16(delta)
        fh.seek(at)
        fh.write(value.astype("<f2").tobytes())


def test_bfloat16_weights_are_read_exactly_without_torch(tmp_path):
    import numpy as np

    from trainer_core.worker.export_mmproj import merged_vision_tensors

    values = np.array([[1.0, -2.5, 3.140625], [1e-3, 65504.0, -0.0]], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")  # these values are exact in bfloat16
    header = {"model.vision_model.w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
              "model.connector.b": {"dtype": "F16", "shape": [2], "data_offsets": [12, 16]},
              "model.text_model.x": {"dtype": "F32", "shape": [1], "data_offsets": [16, 20]}}
    text = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + bf16.tobytes() +
                                                 np.array([0.5, -1], dtype="<f2").tobytes() + bytes(4))
    found = merged_vision_tensors(tmp_path)
    assert sorted(found) == ["model.connector.b", "model.vision_model.w"]  # the text model's weights are no pool
    np.testing.assert_array_equal(found["model.vision_model.w"], (bf16.astype(np.uint32) << 16).view(np.float32))
    assert found["model.vision_model.w"][0].tolist() == [1.0, -2.5, 3.140625]
    assert found["model.connector.b"].tolist() == [0.5, -1.0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.train
@pytest.mark.subprocess
def test_a_tiny_idefics3_trains_and_exports_a_verified_gguf_with_its_mmproj(studio, tmp_path, capsys):
    folder = tmp_path / "shapes"
    data = write_jsonl(folder / "train.jsonl", shape_rows(folder, 16, seed=1, prefix="train"))
    cfg = TrainConfig(run_name="shapes vlm", model_name=str(build_tiny_idefics3()), local_datasets=[str(data)],
                      max_steps=4, batch_size=4, learning_rate=1e-2, max_seq_length=64, logging_steps=2,
                      train_on_completions=True, finetune_vision_layers=True, lora_r=8, lora_alpha=16,
                      target_modules=[], random_seed=0)
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=400)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"

    promptsets.save("vision-gguf", ["What is the capital of France?", "List three fruits."])
    job_id = studio.submit(ExportSpec(source=ModelSource(run_id=run_id), targets=["merged", "gguf"],
                                      quantizations=["f16"],
                                      merged_dtype="float16", prompt_set="vision-gguf", max_new_tokens=8))
    snap = studio.wait(job_id, timeout=400)
    log = studio.log_tail(job_id, 200)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{log}"
    out = paths.run_dir(job_id) / "artifacts"
    artifacts = {Path(a.path).name: a for a in studio.artifacts(job_id=job_id)}
    assert sorted(artifacts) == ["README.md", "merged", "mmproj-shapes-vlm-f16.gguf", "shapes-vlm-f16.gguf",
                                 "verify.json"]
    assert [(a.kind, a.detail) for a in (artifacts["shapes-vlm-f16.gguf"], artifacts["mmproj-shapes-vlm-f16.gguf"])] \
        == [("gguf", "f16"), ("mmproj", "f16")]
    for name, row in artifacts.items():
        digest_of = out / name / "SHA256SUMS" if name == "merged" else out / name
        assert row.sha256 == sha256(digest_of)
    assert not (out / "Modelfile").exists()
    assert ("No Ollama Modelfile: Ollama does not reliably run a llama.cpp GGUF with a separate mmproj projector "
            "file, so none was written; run the model with llama-server -m shapes-vlm-f16.gguf --mmproj "
            "mmproj-shapes-vlm-f16.gguf") in " ".join(snap.warnings)

    verify = json.loads((out / "verify.json").read_text())
    with capsys.disabled():
        print("\nvision gguf verify:", "; ".join(f"{v['format']} {v['identical']}/{v['total']}" for v in verify),
              {n: a.size for n, a in artifacts.items()})
    llama_cpp = ["gguf f16 (llama.cpp)", "gguf f16 + mmproj (llama.cpp)"] if importlib.util.find_spec("xllamacpp") else []
    assert [v["format"] for v in verify] == ["merged", "gguf f16", *llama_cpp[:1], "mmproj idefics3 tensors",
                                             *llama_cpp[1:]]
    if llama_cpp:  # the llamacpp extra: llama.cpp itself answers the text prompts, and the image rows with the pair
        text, images = verify.pop(2), verify.pop(-1)
        assert (text["total"], images["total"]) == (2, 4)
        with capsys.disabled():
            print("llama.cpp:", text, images)
    assert verify[0]["total"] == 4 and verify[0]["identical"] >= 3  # the run's own image rows, float16 weights
    assert (verify[1]["identical"], verify[1]["total"]) == (2, 2)  # f16 GGUF = the float16 merged weights
    # 1 patch embedding (weight, bias), positions, 16 encoder tensors, 2 post norms, 1 connector projection
    assert verify[2] == {"format": "mmproj idefics3 tensors", "identical": 22, "total": 22, "first_difference": "",
                         "unit": "equal to the merged model's vision weights (22 in the same order)"}
    timeline = [e.message for e in studio.events(job_id) if e.kind == "verify"]
    assert ("verify mmproj idefics3 tensors: 22/22 equal to the merged model's vision weights (22 in the same "
            "order)") in timeline
    card = (out / "README.md").read_text()
    assert ("| mmproj idefics3 tensors | 22/22 equal to the merged model\\'s vision weights \\(22 in the same order\\) "
            "| — |") in card  # the card lists the pair and how llama.cpp runs it
    assert "- `mmproj-shapes-vlm-f16.gguf`: llama\\.cpp\\'s vision projector \\(f16\\) for shapes\\-vlm\\-f16\\.gguf\\: " \
           "run the pair with llama\\-server \\-m shapes\\-vlm\\-f16\\.gguf \\-\\-mmproj mmproj" in card

    # the check is not vacuous: one changed weight of the vision tower is found and named (numpy alone, no torch)
    from trainer_core.worker.export_mmproj import compare_mmproj

    broken = tmp_path / "broken"
    shutil.copytree(out / "merged", broken)
    change_one_value(broken / "model.safetensors", "model.vision_model.encoder.layers.0.mlp.fc1.weight", 0.5)
    assert {k: v for k, v in compare_mmproj(out / "mmproj-shapes-vlm-f16.gguf", broken).items() if k != "unit"} == {
        "format": "mmproj idefics3 tensors", "identical": 21, "total": 22, "projector": "idefics3",
        "first_difference": "mmproj tensor v.blk.0.ffn_up.weight equals no vision tensor of the merged model (1 mmproj "
                            "tensor(s) unmatched, 1 merged tensor(s) missing)"}
    assert "torch" not in sys.modules and "transformers" not in sys.modules


def test_the_export_panel_says_how_llama_cpp_runs_the_pair(app_home, monkeypatch):
    from db.entities import RunRecord
    from db.store import Store
    from tests.support.factories import insert_finished_run
    from tests.support.apptest import open_page
    from ui.export_panel import llama_cpp_command

    store = Store()
    insert_finished_run(store, RUN, "shapes", [2.0, 1.5])
    job = "20260104-100100-export"
    out = paths.run_dir(job) / "artifacts"
    out.mkdir(parents=True)
    rows = []
    for name, kind in (("shapes-q8_0.gguf", "gguf"), ("mmproj-shapes-f16.gguf", "mmproj")):
        (out / name).write_bytes(b"GGUF" + bytes(100))
        rows.append(dict(job_id=job, path=str(out / name), source_run_id=RUN, kind=kind, detail=name[-9:-5],
                         size=104, sha256="c" * 64, created_at=1.0))
    store.create_run(RunRecord(id=job, name="Export · 100100", status=RunStatus.RUNNING, kind=JobKind.EXPORT,
                               dataset="gguf (q8_0)", parent_run_id=RUN, created_at=1.0, total_steps=6))
    store.add_artifacts(rows)
    store.finish_run(job, RunStatus.COMPLETED, steps_done=6)
    command = f"llama-server -m {out / 'shapes-q8_0.gguf'} --mmproj {out / 'mmproj-shapes-f16.gguf'}"
    assert llama_cpp_command(store.artifacts(job_id=job)) == command
    assert llama_cpp_command(store.artifacts(job_id=job)[:1]) is None  # a text export has no projector
    at = open_page("pages/run.py", detail_run_id=job)
    assert command in [c.value for c in at.code]
    assert any("Ollama gets no Modelfile for the pair" in c.value for c in at.caption)
    store.engine.dispose()


def test_the_model_card_says_an_mmproj_row_counts_tensors_not_answers():
    from trainer_core.export import card

    text = card.render(title="shapes", source_label="shapes · final", base_model="tiny-idefics3", method="SFT · LoRA",
                       data="shapes.jsonl", config={}, facts=card.RunFacts(losses=[(1, 2.0)], final_loss=2.0, steps=1),
                       artifacts=[("shapes-f16.gguf", "GGUF"), ("mmproj-shapes-f16.gguf", "projector")],
                       verify=[{"format": "gguf f16", "identical": 2, "total": 2, "first_difference": ""},
                               {"format": "mmproj idefics3", "identical": 22, "total": 22, "first_difference": "",
                                "unit": "tensors equal to the merged model's vision weights"}],
                       chart_file=None)
    assert "| gguf f16 | 2/2 | — |" in text
    assert "| mmproj idefics3 | 22/22 tensors equal to the merged model\\'s vision weights | — |" in text  # escaped


@pytest.mark.parametrize("hostile", [{"architectures": 5}, {"architectures": {"a": 1}}, {"architectures": [None]},
                                     {"architectures": "Idefics3ForConditionalGeneration"},
                                     {"vision_config": {**IDEFICS3["vision_config"], "architectures": 7}},
                                     {"text_config": {"model_type": "llama", "architectures": [["VLlama3ForCausalLM"]]}},
                                     {"architectures": ["X" * 100_000]}])
def test_a_hostile_config_json_is_refused_naming_it_never_a_traceback(hostile):
    """config.json is a file in the user's model folder: any JSON shape is an answer, cut to a readable length."""
    config = {**IDEFICS3, **hostile}
    problem = tools.vision_gguf_problem(config)
    assert problem is not None and problem.startswith("llama.cpp's converter writes ") and len(problem) < 2000


@pytest.mark.parametrize("architectures", [5, {"a": 1}, [None], "Idefics3ForConditionalGeneration"])
def test_a_vision_run_whose_config_names_its_architectures_wrongly_is_refused_before_start(home, architectures):
    """The modality is read from the same config.json first (planning/modality.py): any JSON shape is an answer."""
    from trainer_core.planning.modality import from_configs

    config = {**IDEFICS3, "architectures": architectures}
    assert from_configs(config).architecture == "unknown"
    vision_run(config)
    [message] = target_errors(targets=["merged", "gguf"])
    assert message.startswith("gguf: llama.cpp's converter writes no mmproj projector file for a model without "
                              "architectures. It converts these vision-language architectures: ")
