"""The tiny text models, built offline in a child process and cached per checkout under .test-cache, each under a
file lock so that parallel test workers (pytest-xdist) build it once. The speech and vision models live in
tests/support/speech.py and tests/support/vision.py and use the same lock."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import textwrap
from pathlib import Path

from tests.support.env import MODELS_CACHE, TINY_MODEL, run_python

BUILD_TINY = textwrap.dedent("""
    import sys
    from pathlib import Path
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trainer_core.host import hardware
    from trainer_core.worker import model_files
    from trainer_core.protocol import paths
    import torch

    target = Path(sys.argv[1])
    bundled = model_files.convert_gguf(hardware.bundled_gguf_path(), paths.models_dir() / "SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(bundled)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    print("ok", target)
""")


@contextlib.contextmanager
def cache_lock(target: Path):
    """Parallel test workers (pytest-xdist) share .test-cache: one builds a cached model while the others wait."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.build-lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def built_once(build):
    """A builder of a cached model under ``cache_lock`` of its ``target``: its own check for a finished folder runs
    inside the lock, so a worker never takes a folder another is still writing."""
    signature = inspect.signature(build)

    @functools.wraps(build)
    def locked(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        with cache_lock(Path(bound.arguments["target"])):
            return build(*args, **kwargs)
    return locked


@built_once
def build_tiny_model(target: Path = TINY_MODEL, models_cache: Path = MODELS_CACHE) -> Path:
    """A 2-layer Llama with the bundled SmolLM2 tokenizer: real training, a fraction of a second per step."""
    if (target / "config.json").exists():
        return target
    result = run_python(BUILD_TINY, str(target), env={"FINETUNE_STUDIO_MODELS": str(models_cache)})
    assert result.returncode == 0, result.stderr[-3000:]
    return target


CONVERT_BUNDLED = textwrap.dedent("""
    import sys
    from pathlib import Path
    from trainer_core.host import hardware
    from trainer_core.worker import model_files

    model_files.convert_gguf(hardware.bundled_gguf_path(), Path(sys.argv[1]))
""")


def bundled_model_folder() -> Path:
    """The converted bundled model in the test models cache, converted now (once) when a fresh clone has none yet.
    For tests that load it directly rather than through a worker, which converts it itself (under its own lock)."""
    folder = MODELS_CACHE / "SmolLM2-135M-Instruct"
    if not (folder / "config.json").exists():
        result = run_python(CONVERT_BUNDLED, str(folder))  # model_files.convert_gguf locks and writes atomically
        assert result.returncode == 0, result.stderr[-3000:]
    return folder
