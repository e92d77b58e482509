"""Converting the bundled GGUF (worker side: runs in a subprocess, the test process never imports
transformers): special tokens from the GGUF metadata, and library versions in the cache key."""
from __future__ import annotations

import json
import textwrap

import pytest

from tests.support import MODELS_CACHE, run_python

CONVERT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from trainer_core.host import hardware
    from trainer_core.worker import model_files

    gguf, target, elsewhere = hardware.bundled_gguf_path(), Path(sys.argv[1]), Path(sys.argv[2])
    model_files.convert_gguf(gguf, target)  # the checkout's shared conversion: made here at most once
    tokenizer, config = AutoTokenizer.from_pretrained(target), AutoConfig.from_pretrained(target)
    generation = GenerationConfig.from_pretrained(target)
    first = {"metadata": model_files.gguf_special_tokens(gguf),
             "tokens": {r: getattr(tokenizer, r + "_token") for r in ("bos", "eos", "pad", "unk")},
             "token_ids": {r: getattr(tokenizer, r + "_token_id") for r in ("bos", "eos", "pad")},
             "config_ids": {r: getattr(config, r + "_token_id") for r in ("bos", "eos", "pad")},
             "generation_eos": generation.eos_token_id,
             "marker": (target / model_files.READY_MARKER).read_text()}
    again = []
    model_files.convert_gguf(gguf, target, log=again.append)  # same versions: reused
    key = json.loads(model_files.conversion_key(gguf))
    elsewhere.mkdir()
    older = model_files.conversion_key(gguf).replace(key["transformers"], "5.17.0")
    (elsewhere / model_files.READY_MARKER).write_text(older)  # what transformers 5.17 would have left
    stale = not model_files.is_converted(elsewhere, model_files.conversion_key(gguf))
    (elsewhere / model_files.READY_MARKER).write_text(gguf.name)  # what a release before the key left
    print(json.dumps({**first, "again": again, "stale": stale,
                      "unkeyed": not model_files.is_converted(elsewhere, model_files.conversion_key(gguf))}))
""")

WRONG_EOS = textwrap.dedent("""
    import json, sys
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trainer_core.host import hardware
    from trainer_core.worker import model_files

    # transformers 5.17 read the bundled GGUF's EOS as <|im_start|> (id 1) and set no pad token: repair
    # a tokenizer and model left that way
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
    model.config.eos_token_id = model.generation_config.eos_token_id = 1
    model_files.apply_special_tokens(tokenizer, model, model_files.gguf_special_tokens(hardware.bundled_gguf_path()))
    print(json.dumps([tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token, model.config.eos_token_id,
                      model.generation_config.eos_token_id]))
""")


@pytest.mark.subprocess  # starts a transformers subprocess
def test_conversion_takes_special_tokens_from_the_gguf_and_redoes_stale_folders(tmp_path):
    result = run_python(CONVERT, str(MODELS_CACHE / "SmolLM2-135M-Instruct"), str(tmp_path / "elsewhere"))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    # SmolLM2's GGUF: bos 1 <|im_start|>, eos 2 <|im_end|>, pad 2, unk 0 <|endoftext|>
    assert out["metadata"] == {"bos": 1, "eos": 2, "pad": 2, "unk": 0}
    assert out["tokens"] == {"bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|im_end|>", "unk": "<|endoftext|>"}
    assert out["token_ids"] == out["config_ids"] == {"bos": 1, "eos": 2, "pad": 2}
    assert out["generation_eos"] == 2
    marker = json.loads(out["marker"])
    assert set(marker) == {"file", "size", "transformers", "gguf", "torch"} and marker["file"].endswith(".gguf")
    assert out["again"] == []  # same file, same library versions: the folder is reused
    assert out["stale"] is True and out["unkeyed"] is True  # other versions, or unknown ones: converted again


@pytest.mark.subprocess  # starts a transformers subprocess
def test_a_wrong_eos_is_repaired_from_the_gguf_metadata(tmp_path, tiny_model):
    result = run_python(WRONG_EOS, str(tiny_model))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == ["<|im_end|>", 2, "<|im_end|>", 2, 2]
