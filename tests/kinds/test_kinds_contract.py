"""The model-kind registry's contract: every kind is told from its files, every method trains a kind that produces what
the method says, every (method, kind) pair the table allows resolves to that kind, and every refusal the table holds
(export targets, serving, evaluation) reaches the user through the real job specs, word for word, naming its reason.
docs/model-kinds.md is the table's own output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer_core import kinds, methods
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.evaluation.spec import EvalSpec
from trainer_core.export.spec import ExportSpec
from trainer_core.specs.model_source import ModelSource, resolve
from trainer_core.kinds.base import EXPORT_TARGETS, NEEDS_WRITER, Facts
from trainer_core.kinds.docs import DOC_PATH, markdown
from trainer_core.planning import modality
from trainer_core.protocol import paths
from trainer_core.serving.spec import ServeSpec
from tests.support import ROOT

# One model folder of each kind that a base model's files tell (reward: never from files)
FOLDERS = {
    "text": ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, {}, ()),
    "vision": ({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                "vision_config": {"model_type": "siglip_vision_model", "image_size": 224, "patch_size": 14}}, {}, ()),
    "speech": ({"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper"},
               {"feature_extractor": {"chunk_length": 30, "sampling_rate": 16000}}, ()),
    "tts": ({"architectures": ["CsmForConditionalGeneration"], "model_type": "csm", "num_codebooks": 32,
             "codec_config": {"model_type": "mimi", "sampling_rate": 24000}}, {}, ()),
    "embedding": ({"architectures": ["BertModel"], "model_type": "bert"}, {}, ("modules.json",)),
}


def write_folder(root: Path, kind: str) -> Path:
    config, processor, markers = FOLDERS[kind]
    folder = root / f"base-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if processor:
        (folder / "processor_config.json").write_text(json.dumps(processor))
    for marker in markers:
        (folder / marker).write_text("[]")
    return folder


def allowed_pairs() -> list[tuple[str, str]]:
    return [(method, kind.name) for kind in kinds.KINDS.values() for method in kind.methods]


def write_run(home: Path, tmp_path: Path, method: str, kind: str, adapter: str = "full") -> ModelSource:
    """A finished run of ``method`` on a base model of ``kind`` (its weights folder as training leaves it)."""
    base = BUNDLED_MODEL if kind in ("text", "reward") else str(write_folder(tmp_path, kind))
    if kind == "embedding":
        base = str(write_folder(tmp_path, "embedding"))
    cfg = TrainConfig(model_name=base, run_name=f"{kind} by {method}", method=method, adapter=adapter)
    run_id = f"20260105-000000-{abs(hash((method, kind, adapter))) % 16 ** 6:06x}"
    folder = paths.run_dir(run_id)
    weights = folder / ("adapter" if cfg.effective_use_lora else "model")
    weights.mkdir(parents=True)
    (weights / ("adapter_config.json" if cfg.effective_use_lora else "config.json")).write_text("{}")
    (folder / "config.yaml").write_text(cfg.to_yaml())
    return ModelSource(run_id=run_id)


def test_every_method_trains_a_kind_that_produces_what_the_method_says():
    for name, spec in methods.METHODS.items():
        trained = [k for k in kinds.KINDS.values() if k.trains(name)]
        assert trained, f"method {name} trains no registered model kind: add it to a kind's methods"
        assert all(k.output == spec.output for k in trained), (name, [k.name for k in trained])
        assert all(set(spec.adapters) & set(k.adapters) for k in trained), name
    assert {m for k in kinds.KINDS.values() for m in k.methods} == set(methods.METHODS)


@pytest.mark.parametrize("kind", list(FOLDERS))
def test_each_kind_is_told_from_a_model_folder(home, tmp_path, kind):
    folder = write_folder(tmp_path, kind)
    assert modality.detect_kind(str(folder)).name == kind
    assert modality.detect_modality(str(folder)).kind == kind
    assert resolve(ModelSource(model=str(folder))).kind.name == kind


def test_the_bundled_model_is_text_and_no_folder_is_a_reward_model():
    assert modality.detect_kind(BUNDLED_MODEL).name == "text"
    config = {"architectures": ["LlamaForSequenceClassification"], "model_type": "llama"}
    assert kinds.detect(Facts(config)).name == "text"  # a reward model is what method reward trained
    assert kinds.DETECTION_ORDER[-1] == "text" and set(kinds.DETECTION_ORDER) == set(kinds.KINDS)


@pytest.mark.parametrize("method, kind", allowed_pairs())
def test_every_allowed_pair_resolves_to_its_kind(home, tmp_path, method, kind):
    row = kinds.get(kind)
    adapter = next(a for a in row.adapters if a in methods.get(method).adapters and a != "qlora")
    source = write_run(home, tmp_path, method, kind, adapter)
    assert resolve(source).kind is row
    assert kinds.of_run(method, row) is row
    assert resolve(source).sees_images is row.sees_images
    assert (resolve(source).not_a_writer("served") is None) is row.writes_answers


@pytest.mark.parametrize("kind", list(kinds.KINDS))
def test_every_refusal_in_the_table_reaches_the_user_with_its_reason(home, tmp_path, kind):
    row = kinds.get(kind)
    source = write_run(home, tmp_path, row.methods[0], kind)
    resolved = resolve(source)
    for target in EXPORT_TARGETS:
        why = row.export_refusal(target)
        found = [e.message for e in ExportSpec(source=source, targets=[target]).validate() if e.field == "targets"]
        if why == NEEDS_WRITER:
            assert found == [f"{target}: {resolved.not_a_writer(NEEDS_WRITER)}; a full fine-tune's weights folder "
                             "is the whole model: copy it as it is"], (kind, target)
            assert row.uses in found[0]
        elif why:
            assert found == [why], (kind, target, found)
            assert why.startswith(f"{target}: ") and len(why) > len(target) + 20
        elif target == "onnx":  # offered; the exporter's venv may still be missing on this host
            assert found == [] or (len(found) == 1 and "make install" in found[0]), found
        elif not (target == "gguf" and row.gguf_needs_converter):
            assert found == [], (kind, target, found)
    serve = [e.message for e in ServeSpec(source=source, sources=[source], api_key_hash="0" * 64).validate()
             if e.field == "source"]
    if row.served:
        assert serve == [] or row.name == "embedding", serve  # infinity's own venv may be missing on this host
    else:
        assert serve == [resolved.not_a_writer(row.not_served)] and row.uses in serve[0], serve
    if not row.eval_metrics:
        found = {e.field: e.message for e in EvalSpec(source=source, data=str(tmp_path / "x.jsonl"),
                                                      metrics=["exact"]).validate()}
        assert found["source"] == f"{resolved.not_a_writer(row.not_evaluated)}; {row.eval_instead}", found
    assert bool(row.vllm) is (row.name not in ("text", "vision"))


def test_every_kind_names_its_worker_half_and_playground():
    for row in kinds.KINDS.values():
        module = ROOT / Path(*row.worker.split("."))
        assert module.with_suffix(".py").is_file() or (module / "__init__.py").is_file(), row.worker
        assert row.playground in ("", "chat", "search", "transcribe", "speak"), row.playground
        assert (row.playground == "chat") is row.writes_answers
        assert bool(row.uses) is (not row.writes_answers)
        assert set(row.default_exports) <= set(EXPORT_TARGETS)
        assert set(row.eval_defaults) <= set(row.eval_metrics) and bool(row.eval_defaults) is bool(row.eval_metrics)
        assert not any(row.export_refusal(t) for t in row.default_exports), row.name


def test_every_kind_has_an_export_verify_stage_and_a_merge():
    """The worker half's tables are keyed by kind name: a kind missing from them would verify as a text model."""
    from trainer_core.worker.export_merge import OWN_MERGES, Merging
    from trainer_core.worker.export_verify import VERIFIERS, Verification

    assert set(VERIFIERS) == set(kinds.KINDS)
    assert all(callable(getattr(Verification, name)) for name in VERIFIERS.values())
    assert set(OWN_MERGES) <= set(kinds.KINDS) and all(callable(getattr(Merging, n)) for n in OWN_MERGES.values())


def test_the_docs_page_is_the_tables_own_output():
    page = (ROOT / DOC_PATH).read_text(encoding="utf-8")
    assert page == markdown(), "docs/model-kinds.md is stale: run `python -m trainer_core.kinds --write`"
    assert all(k.label in page for k in kinds.KINDS.values())
