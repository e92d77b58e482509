"""trainer_core.planning.model_info: model facts from metadata only (no torch)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import constants as hf_constants
from safetensors.numpy import save_file

from tests.support import run_python
from trainer_core.planning import model_info
from trainer_core.config import BUNDLED_MODEL
from trainer_core.planning.model_info import ModelInfoError, inspect_model, parameters_from_shape

# The real SmolLM2-135M-Instruct config (as the bundled model converts) and Llama-3-8B's published dimensions.
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
           "max_position_embeddings": 8192, "tie_word_embeddings": True, "head_dim": 64, "torch_dtype": "bfloat16"}
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(autouse=True)
def fresh(home):
    model_info._cache.clear()
    yield
    model_info._cache.clear()


def hf_folder(path: Path, config: dict, template: str | None = None, jinja: bool = False,
              tensors: dict | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template} if template else {}))
    if jinja:
        (path / "chat_template.jinja").write_text(TEMPLATE)
    if tensors:
        save_file(tensors, str(path / "model.safetensors"))
    return path


def test_parameter_count_from_config_matches_known_models():
    smol = model_info._from_config(SMOLLM2, "local", True, None)
    # the GGUF of SmolLM2-135M holds exactly this many elements (tensor count read from the file)
    assert smol.num_parameters == 134_515_008
    llama = model_info._from_config(LLAMA3_8B, "local", True, None)
    assert llama.num_parameters == 8_030_261_248  # Meta's published count for Llama-3-8B
    assert llama.head_dim == 128 and llama.kv_dim == 1024 and llama.q_dim == 4096
    assert parameters_from_shape(llama) == 8_030_261_248


def test_local_folder_counts_safetensors_headers_and_reads_template(tmp_path):
    tensors = {"model.embed_tokens.weight": np.zeros((10, 4), np.float32), "norm.weight": np.zeros(4, np.float32)}
    folder = hf_folder(tmp_path / "m", SMOLLM2, template=TEMPLATE, tensors=tensors)
    info = inspect_model(str(folder))
    assert info.num_parameters == 44  # 10*4 + 4 from the header, not the 135M the config implies
    assert (info.source, info.architecture, info.model_type) == ("local", "LlamaForCausalLM", "llama")
    assert (info.hidden_size, info.num_layers, info.num_attention_heads, info.num_kv_heads) == (576, 30, 9, 3)
    assert (info.intermediate_size, info.vocab_size, info.max_position_embeddings) == (1536, 49152, 8192)
    assert info.tie_word_embeddings is True and info.has_chat_template is True
    assert info.torch_dtype == "bfloat16"


def test_chat_template_from_jinja_file_or_missing(tmp_path):
    assert inspect_model(str(hf_folder(tmp_path / "a", LLAMA3_8B, jinja=True))).has_chat_template is True
    info = inspect_model(str(hf_folder(tmp_path / "b", LLAMA3_8B)))
    assert info.has_chat_template is False
    assert info.num_parameters == 8_030_261_248  # no weights files: counted from the config


def test_result_is_cached_until_the_config_changes(tmp_path):
    folder = hf_folder(tmp_path / "m", SMOLLM2)
    first = inspect_model(str(folder))
    assert inspect_model(str(folder)) is first
    (folder / "config.json").write_text(json.dumps({**SMOLLM2, "num_hidden_layers": 2}))
    os.utime(folder / "config.json", ns=(1, 1))  # a different mtime even on coarse filesystems
    assert inspect_model(str(folder)).num_layers == 2


def test_bundled_model_is_read_from_its_gguf(home):
    info = inspect_model(BUNDLED_MODEL)  # the data root is empty: nothing converted yet
    assert info.source == "bundled"
    assert info.num_parameters == 134_515_008
    assert info.architecture == "LlamaForCausalLM" and info.num_layers == 30 and info.hidden_size == 576
    assert info.num_kv_heads == 3 and info.vocab_size == 49152 and info.tie_word_embeddings is True
    assert info.has_chat_template is True
    assert info.torch_dtype.startswith("Q4_1")


def test_bundled_model_prefers_the_converted_folder(home, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(tmp_path / "models"))
    hf_folder(tmp_path / "models" / model_info.BUNDLED_FOLDER, {**SMOLLM2, "torch_dtype": "float32"}, jinja=True)
    (tmp_path / "models" / model_info.BUNDLED_FOLDER / model_info.CONVERTED_MARKER).write_text("x")
    info = inspect_model(BUNDLED_MODEL)
    assert (info.source, info.torch_dtype, info.num_parameters) == ("bundled", "float32", 134_515_008)


def test_local_problems_name_the_field_and_the_fix(tmp_path, tmp_path_factory):
    with pytest.raises(ModelInfoError) as missing:
        inspect_model(str(tmp_path / "nope"))
    assert missing.value.field == "model_name" and "does not exist" in missing.value.message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelInfoError, match="neither config.json nor a .gguf"):
        inspect_model(str(tmp_path / "empty"))
    outside = tmp_path_factory.mktemp("outside")
    with pytest.raises(ModelInfoError, match="outside the allowed folders"):
        inspect_model(str(outside))
    with pytest.raises(ModelInfoError, match="not a hub id"):
        inspect_model("not a valid id!")


def hub_cache(root: Path, repo: str, files: dict[str, dict]) -> None:
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("abc123")
    for name, content in files.items():
        (snapshot / name).write_text(json.dumps(content))


def test_hub_id_offline_uses_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    hub_cache(tmp_path / "hub", "org/llama", {"config.json": LLAMA3_8B, "tokenizer_config.json": {"chat_template": "x"}})
    info = inspect_model("org/llama")
    assert (info.source, info.num_parameters, info.has_chat_template) == ("hub", 8_030_261_248, True)


def test_hub_id_offline_and_not_cached_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelInfoError) as err:
        inspect_model("org/absent")
    assert err.value.field == "model_name"
    assert "could not reach the Hugging Face hub" in err.value.message and "not in the local cache" in err.value.message


def test_modules_do_not_import_the_ml_stack():
    code = ("import sys; from trainer_core.planning import model_info, memory; from trainer_core.data import preview;"
            "model_info.inspect_model('bundled:SmolLM2-135M-Instruct');"
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'trl', 'datasets') if m in sys.modules))")
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_an_encoder_decoder_speech_config_gives_its_facts_not_an_error():
    """Whisper's config names its stacks apart (encoder_layers, decoder_layers, d_model): the New run page showed
    "does not look like a causal language model" instead of the model's facts and an estimate."""
    whisper_tiny = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "d_model": 384,
                    "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
                    "decoder_attention_heads": 6, "decoder_ffn_dim": 1536, "encoder_ffn_dim": 1536,
                    "vocab_size": 51865, "max_target_positions": 448, "max_source_positions": 1500}
    info = model_info._from_config(whisper_tiny, "local", False, 37_760_640)
    assert (info.hidden_size, info.num_layers, info.num_attention_heads, info.intermediate_size) == (384, 8, 6, 1536)
    assert info.max_position_embeddings == 448 and info.num_parameters == 37_760_640  # counted from the weights
    assert info.architecture == "WhisperForConditionalGeneration"
