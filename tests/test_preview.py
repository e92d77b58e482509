"""trainer_core.data.preview and trainer_core.worker.token_cache: the data exactly as the trainer sees it, and the
tokenized-data cache. Anything that tokenizes runs in a subprocess (this process plays the dashboard)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import MODELS_CACHE, build_tiny_model, run_python
from trainer_core.host import parallel
from trainer_core.data import preview
from trainer_core.config import TrainConfig
from trainer_core.data.preview import PreviewError, build_preview

BUNDLED_DIR = MODELS_CACHE / "SmolLM2-135M-Instruct"
DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
MAX = 64
LONG_REPLY = " ".join(["The answer goes on and on."] * 12)
LONG_PROMPT = " ".join(["Please read all of this first."] * 12)
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    [{"role": "user", "content": "Tell me everything."}, {"role": "assistant", "content": LONG_REPLY}],
    [{"role": "user", "content": LONG_PROMPT}, {"role": "assistant", "content": "Done."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
]

# Token facts computed with transformers directly (not through token_cache): full and prompt lengths.
FACTS = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
out = []
for messages in json.loads(sys.argv[2]):
    full = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    prompt = tok.apply_chat_template(messages[:-1], tokenize=True, return_dict=True, add_generation_prompt=True)["input_ids"]
    out.append({"full": len(full), "prompt": len(prompt)})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def models() -> Path:
    return build_tiny_model()  # converts the bundled model too


@pytest.fixture
def studio_env(home, tmp_path, monkeypatch, models):
    monkeypatch.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
    preview._cache.clear()
    yield tmp_path
    preview._cache.clear()


def write_chat(path: Path) -> Path:
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS))
    return path


@pytest.fixture(scope="module")
def facts(models) -> list[dict]:
    done = run_python(FACTS, str(BUNDLED_DIR), json.dumps(CONVERSATIONS))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess  # starts a transformers subprocess (10-20 s here)
def test_preview_with_completions_only_matches_the_tokenizer(studio_env, facts):
    data = write_chat(studio_env / "chat.jsonl")
    cfg = TrainConfig(local_datasets=[str(data)], train_on_completions=True, max_seq_length=MAX, batch_size=2)
    p = build_preview(cfg, rows_shown=4)
    full = [f["full"] for f in facts]
    prompt = [f["prompt"] for f in facts]
    assert full[1] > MAX and full[2] > MAX and prompt[2] >= MAX and full[0] < MAX and full[3] < MAX  # the fixture's shape

    assert p.format == "chatml" and "SmolLM2" in p.tokenizer and p.max_seq_length == MAX
    assert p.lengths == tuple(full)
    assert p.truncated == 2  # the long reply and the long prompt
    assert p.dropped == {preview.TRUNCATION_DROP: 1}  # the long prompt leaves nothing to train on
    assert p.total_rows == 3 and p.steps_per_epoch == 2  # ceil(3 rows / batch 2)
    assert (p.processes, p.global_batch) == (1, 2)
    kept = [0, 1, 3]
    assert p.total_tokens == sum(min(full[i], MAX) for i in kept)
    assert p.trained_tokens == sum(min(full[i], MAX) - prompt[i] for i in kept)
    assert p.eval_rows == 0

    first = p.rows[0]
    assert first.text == DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    assert first.segments == ((DEFAULT_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", False),
                              ("Hello!<|im_end|>\n", True))
    for row in p.rows:
        assert "".join(text for text, _ in row.segments) == row.text
        assert [trained for _, trained in row.segments] == [False, True][:len(row.segments)]
    assert (p.rows[1].truncated, p.rows[1].num_tokens) == (True, full[1])
    assert not p.rows[1].text.endswith("<|im_end|>\n")  # cut inside the reply
    assert len(p.rows[1].segments[1][0]) < len(LONG_REPLY)
    assert p.rows[3].segments[0][0].startswith("<|im_start|>system\nBe brief.<|im_end|>")

    assert build_preview(cfg, rows_shown=4) is p  # cached in-process ...
    os.utime(data, ns=(1, 1))
    assert build_preview(cfg, rows_shown=4) is not p  # ... until the data file changes
    assert "torch" not in sys.modules and "transformers" not in sys.modules


ALL_TOKENS = """
import json, sys
from trainer_core.config import TrainConfig
from trainer_core.worker import preview_child
cfg = TrainConfig(local_datasets=[sys.argv[1]], max_seq_length=64, batch_size=1, gradient_accumulation_steps=2,
                  eval_fraction=0.25)
p = preview_child.compute(cfg, rows_shown=1)
print(json.dumps({"lengths": p.lengths, "total": p.total_tokens, "trained": p.trained_tokens, "rows": p.total_rows,
                  "steps": p.steps_per_epoch, "eval": p.eval_rows, "dropped": p.dropped, "truncated": p.truncated,
                  "segments": p.rows[0].segments}))
"""


@pytest.mark.subprocess  # starts a transformers subprocess (10-20 s here)
def test_preview_without_completions_only_trains_every_kept_token(studio_env, facts):
    data = write_chat(studio_env / "chat.jsonl")
    env = {"FINETUNE_STUDIO_HOME": str(studio_env / "h2"), "FINETUNE_STUDIO_MODELS": str(MODELS_CACHE)}
    done = run_python(ALL_TOKENS, str(data), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # eval_fraction 0.25 of 4 rows holds out one (fixed seed); the other three are trained whole, cut at 64
    assert got["eval"] == 1 and got["rows"] == 3 and got["dropped"] == {}
    held = set(random.Random(3407).sample(range(4), 1))  # split_eval's draw with the default seed
    assert got["lengths"] == [f["full"] for i, f in enumerate(facts) if i not in held]
    assert got["total"] == got["trained"] == sum(min(n, MAX) for n in got["lengths"])
    assert got["truncated"] == sum(n > MAX for n in got["lengths"])
    assert got["steps"] == 2  # 3 batches of 1, one update per 2 batches, the last one partial
    assert len(got["segments"]) == 1 and got["segments"][0][1] is True


@pytest.mark.subprocess  # starts a transformers subprocess (10-20 s here)
def test_preview_errors_name_the_field(studio_env):
    cfg = TrainConfig(local_datasets=[str(studio_env / "missing.jsonl")])
    with pytest.raises(PreviewError) as err:
        build_preview(cfg)
    assert [e.field for e in err.value.errors] == ["local_datasets"]
    assert "does not exist" in err.value.errors[0].message


def test_token_goes_by_environment_never_stdin(monkeypatch):
    seen = {}

    def fake_run(argv, input, env, **kwargs):
        seen.update(argv=argv, input=input, env=env)
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps({"errors": [
            {"field": "model_name", "message": "bad token hf_secret123"}]}), stderr="")

    monkeypatch.setattr(preview.subprocess, "run", fake_run)
    for name in ("FINETUNE_STUDIO_PASSWORD", "FINETUNE_STUDIO_OIDC_CLIENT_SECRET", "FINETUNE_STUDIO_SESSION_KEY"):
        monkeypatch.setenv(name, "server-secret-" + name)  # the server's own secrets
    monkeypatch.setenv("WANDB_API_KEY", "wandb-of-the-server")
    preview._cache.clear()
    with pytest.raises(PreviewError) as err:
        build_preview(TrainConfig(hf_token="hf_secret123"))
    assert "hf_secret123" not in seen["input"] and "hf_secret123" not in " ".join(seen["argv"])
    assert seen["env"]["HF_TOKEN"] == "hf_secret123"
    assert [v for v in seen["env"].values() if "server-secret-" in v or v == "wandb-of-the-server"] == []
    assert "hf_secret123" not in str(err.value) and "***" in str(err.value)


def test_steps_per_epoch_follows_the_trainer_under_data_parallelism():
    # 270 rows, batch 4: 68 batches dealt to 3 processes, padded to 23 each; 23 updates per epoch
    assert parallel.steps_per_epoch(270, 4, 1, processes=3) == 23
    assert parallel.steps_per_epoch(270, 4, 4, processes=2) == 9  # 34 batches each, 4 per update


def test_steps_per_epoch_follows_the_trainer():
    assert parallel.steps_per_epoch(270, 4, 1) == 68
    assert parallel.steps_per_epoch(270, 4, 4) == 17  # 68 batches -> 17 updates
    assert parallel.steps_per_epoch(5, 2, 2) == 2  # 3 batches -> 1 full update + 1 partial
    assert parallel.steps_per_epoch(1, 8, 1) == 1
    assert parallel.steps_per_epoch(0, 8, 1) == 0


# ---------------------------------------------------------------------- token cache
CACHE = """
import dataclasses, json, os, sys
from transformers import AutoTokenizer
from trainer_core.worker import token_cache
from trainer_core.config import TrainConfig

cfg = TrainConfig(train_on_completions=True, max_seq_length=64)
tok = token_cache.load_tokenizer(cfg, sys.argv[1], None)
rows, _ = token_cache.training_rows(json.loads(sys.argv[2]), True)
hits = []
def run(rows, tok, cfg):
    ds, hit = token_cache.tokenize(rows, tok, cfg, log=lambda m: None)
    hits.append(hit)
    return ds
first = run(rows, tok, cfg)
again = run(rows, tok, cfg)
run(rows, tok, dataclasses.replace(cfg, max_seq_length=128))
run(rows[:2], tok, cfg)
templated = token_cache.load_tokenizer(cfg, sys.argv[1], None)
templated.chat_template = templated.chat_template.replace("helpful", "useful")
run(rows, templated, cfg)
other = token_cache.load_tokenizer(cfg, sys.argv[1], None)
other.add_tokens(["<extra_token>"])
run(rows, other, cfg)
fresh = [token_cache.encode(tok, row) for row in rows]
print(json.dumps({
    "hits": hits, "stats": dict(token_cache.STATS), "entries": len(os.listdir(token_cache.cache_root())),
    "same": first.to_dict() == again.to_dict(),
    "exact": first["input_ids"] == [e.input_ids for e in fresh] and first["completion_mask"] == [e.completion_mask for e in fresh],
}))
"""


@pytest.mark.subprocess  # starts a transformers subprocess (10-20 s here)
def test_token_cache_hits_then_invalidates_on_every_input(models, tmp_path):
    env = {"FINETUNE_STUDIO_HOME": str(tmp_path / "home")}
    done = run_python(CACHE, str(models), json.dumps([{"messages": m} for m in CONVERSATIONS]), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # miss, hit, then a miss for each change: max_seq_length, data, chat template, tokenizer vocabulary
    assert got["hits"] == [False, True, False, False, False, False]
    assert got["stats"] == {"miss": 5, "hit": 1}
    assert got["entries"] == 5  # one folder per key, no leftovers from the atomic rename
    assert got["same"] and got["exact"]


# The same rows through SFTTrainer's own tokenization and through our cache: the prepared datasets must be equal.
EQUIVALENT = """
import json, sys, tempfile
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer
from trainer_core.data import loading
from trainer_core.worker import token_cache
from trainer_core.config import TrainConfig
from trainer_core.worker.engines import transformers_engine as engine
from trainer_core.worker.methods import sft

model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
results = []
for completions, packing, kind, source in [(True, False, "sft", sys.argv[2]), (False, False, "sft", sys.argv[2]),
                                           (False, True, "cpt", sys.argv[3])]:
    cfg = TrainConfig(train_on_completions=completions, max_seq_length=48, packing=packing, method=kind,
                      local_datasets=[source])
    tok = token_cache.load_tokenizer(cfg, sys.argv[1], None)
    ds = engine.to_dataset(loading.load_for_training(cfg).rows, cfg)
    args = SFTConfig(output_dir=tempfile.mkdtemp(), max_length=48, packing=packing, use_cpu=True, report_to=[],
                     packing_strategy=token_cache.packing_strategy(cfg), completion_only_loss=True if completions else None)
    native = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok).train_dataset
    cached = SFTTrainer(model=model, args=args, train_dataset=sft.pretokenize(ds, tok, cfg),
                        processing_class=tok).train_dataset
    keys = ["input_ids", "labels"] + (["seq_lengths"] if packing else [])
    results.append({"rows": len(native), "equal": all(native[k] == cached[k] for k in keys),
                    "masked": sum(l == -100 for row in cached["labels"] for l in row)})
print(json.dumps(results))
"""


@pytest.mark.subprocess
def test_cached_tokens_equal_what_sft_trainer_makes_itself(models, tmp_path):
    chat = write_chat(tmp_path / "chat.jsonl")
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": " ".join(["word"] * n)}) + "\n" for n in (5, 120, 30)))
    env = {"FINETUNE_STUDIO_HOME": str(tmp_path / "home"), "FINETUNE_STUDIO_ALLOWED_ROOTS": str(tmp_path)}
    done = run_python(EQUIVALENT, str(models), str(chat), str(text), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    completions, whole, packed = json.loads(done.stdout.strip().splitlines()[-1])
    assert completions["equal"] and whole["equal"] and packed["equal"]
    assert completions["rows"] == 3  # the long-prompt row is dropped: nothing left to train after truncation
    assert completions["masked"] > 0 and whole["masked"] == 0
    assert packed["rows"] >= 3  # 120 words are split across packed rows of 48 tokens, not cut
