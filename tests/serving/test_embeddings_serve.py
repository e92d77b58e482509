"""Embedding models served through infinity-emb (its own venv, .venv-embed, built by `make install`) behind the
key gate: the openai client's embeddings.create gets sentence-transformers' own vectors from the bundled
all-MiniLM-L6-v2 and from a full embedding run's saved folder — a copy of the bundled one, and one a run trained
here wrote with the studio's sentence-transformers, served through a view that names its modules as infinity's
3.x does; a wrong or missing key is a 401, an unknown model a 404 naming the served ones; the gate passes the
engine only a checked text request; ServeSpec refuses mixing embedding and chat models."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from tests.support import ROOT, run_python, wait_until
from trainer_core.methods.embedding import EmbeddingSettings
from trainer_core.host import hardware
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.specs.model_source import ModelSource
from trainer_core.methods import embedding
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, RunStatus, write_kind
from trainer_core.serving import infinity_app
from trainer_core.serving.gate import MAX_EMBEDDING_INPUTS, GateConfig, KeyGate
from trainer_core.serving.spec import EMBED_INSTALL_FIX, ServeSpec, embed_python, hash_key

EMBEDDER = ModelSource(model=embedding.BUNDLED_MODEL)
RUN_ID = "20260107-000000-e3b0e3"
KEY = "embed-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["A cat sits on the mat.", "Stocks fell sharply on Monday.", "The kitten is resting on a rug."]

# sentence-transformers' own vectors, in a child process (the test process never imports torch)
REFERENCE = """
import json, sys
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
print(json.dumps(model.encode(json.loads(sys.argv[2])).tolist()))
"""


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


class Engine:
    """The embedding server's app: answers 200 and keeps the body it got."""

    def __init__(self):
        self.seen: list[dict] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        message = await receive()
        self.seen.append(json.loads(message.get("body", b"") or b"{}"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def gated():
    engine = Engine()
    config = GateConfig(key_hash=hash_key(KEY), models={"vec": "", "chat": ""}, translate_sampling=False,
                        embedding_models=["vec"])
    return engine, TestClient(KeyGate(engine, config))


def test_the_engine_gets_only_the_checked_fields_of_an_embeddings_request(gated):
    engine, client = gated
    answer = client.post("/v1/embeddings", headers=AUTH, json={"model": "vec", "input": ["a", "b"],
                                                               "encoding_format": "base64", "dimensions": 128})
    assert answer.status_code == 200
    assert engine.seen == [{"model": "vec", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 128}]


@pytest.mark.parametrize("path, body, status, words", [
    ("/v1/embeddings", {"model": "vec", "input": "a", "modality": "image"}, 400, "unknown field(s) 'modality'"),
    ("/v1/embeddings", {"model": "vec", "input": []}, 400, "input must be a non-empty string or a list"),
    ("/v1/embeddings", {"model": "vec", "input": [[1, 2, 3]]}, 400, "token id lists are not taken here"),
    ("/v1/embeddings", {"model": "vec", "input": ["a"] * (MAX_EMBEDDING_INPUTS + 1)}, 400,
     f"at most {MAX_EMBEDDING_INPUTS:,} per request"),
    ("/v1/embeddings", {"model": "vec", "input": "a", "encoding_format": "int8"}, 400, "encoding_format must be"),
    ("/v1/embeddings", {"model": "vec", "input": "a", "dimensions": 0}, 400, "dimensions must be a whole number"),
    ("/v1/embeddings", {"model": "nope", "input": "a"}, 404, "model 'nope' is not served here; served: vec, chat"),
    ("/v1/embeddings", {"model": "chat", "input": "a"}, 400, "writes answers and does not embed text"),
    ("/v1/chat/completions", {"model": "vec", "messages": [{"role": "user", "content": "hi"}]}, 400,
     "POST the texts to /v1/embeddings"),
])
def test_a_bad_embeddings_request_is_refused_naming_the_field(gated, path, body, status, words):
    engine, client = gated
    answer = client.post(path, headers=AUTH, json=body)
    assert (answer.status_code, engine.seen) == (status, [])
    assert words in answer.json()["error"]["message"]


def test_an_embeddings_request_without_the_key_is_401(gated):
    engine, client = gated
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert client.post("/v1/embeddings", headers=headers, json={"model": "vec", "input": "a"}).status_code == 401
    assert engine.seen == []


def fake_full_embedding_run(folder) -> None:
    """runs/<RUN_ID>: an embedding run (adapter full) whose saved model/ is the bundled model's folder."""
    run_dir = paths.run_dir(RUN_ID)
    run_dir.mkdir(parents=True)
    write_kind(run_dir, JobKind.TRAIN)
    (run_dir / "events.jsonl").touch()  # a run's folder has its event log (the sandbox shows a serve job such runs)
    cfg = TrainConfig(model_name=embedding.BUNDLED_MODEL, run_name="my embedder", method="embedding", adapter="full")
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    shutil.copytree(folder, run_dir / "model")


def test_embedding_and_chat_models_cannot_share_a_server(tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path))
    spec = ServeSpec(name="mixed", sources=[EMBEDDER, ModelSource(model=BUNDLED_MODEL)], api_key_hash=hash_key("k"))
    problems = [(e.field, e.message) for e in spec.validate()]
    assert problems == [("sources", "embedding models (all-minilm-l6-v2) and models that write answers or transcribe "
                                    "cannot share one server (infinity serves the first, transformers serve or vLLM "
                                    "the others): start one server for the embedding models and another for the rest")]
    spec = ServeSpec(name="e", sources=[EMBEDDER], api_key_hash=hash_key("k"), engine="transformers")
    assert [(e.field, e.message) for e in spec.validate()] == [
        ("engine", "embedding models are served by infinity, not transformers: use auto or infinity")]


@pytest.mark.subprocess
def test_the_openai_client_gets_sentence_transformers_vectors_behind_the_key(tmp_path, monkeypatch):
    assert embed_python().exists(), EMBED_INSTALL_FIX
    folder = embedding.bundled_model_dir()
    assert folder is not None, embedding.BUNDLED_FIX
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
    monkeypatch.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp_path}:{ROOT / '.test-cache'}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    hardware.cuda_available.cache_clear()
    fake_full_embedding_run(folder)
    orch = Orchestrator()
    job_id, key = orch.start_server([EMBEDDER, ModelSource(run_id=RUN_ID)])
    try:
        reference = run_python(REFERENCE, str(folder), json.dumps(TEXTS))  # while infinity loads
        assert reference.returncode == 0, reference.stderr[-3000:]
        wait_until(lambda: orch.endpoint(job_id) is not None or orch.get_run(job_id).status.is_terminal(),
                   timeout=120, what="the embedding server to listen")
        endpoint = orch.endpoint(job_id)
        assert endpoint is not None, (orch.get_run(job_id).error, orch.log_tail(job_id))
        assert [m.name for m in endpoint.models] == ["all-minilm-l6-v2", "my-embedder"]

        client = openai.OpenAI(base_url=endpoint.url, api_key=key)
        answer = client.embeddings.create(model="all-minilm-l6-v2", input=TEXTS)
        vectors = [item.embedding for item in sorted(answer.data, key=lambda d: d.index)]
        assert [len(v) for v in vectors] == [384, 384, 384]
        expected = json.loads(reference.stdout.strip().splitlines()[-1])
        assert [cosine(v, e) >= 0.999 for v, e in zip(vectors, expected)] == [True, True, True]
        assert cosine(vectors[0], vectors[2]) > cosine(vectors[0], vectors[1])  # the cat is nearer the kitten
        assert [m.id for m in client.models.list()] == ["all-minilm-l6-v2", "my-embedder"]
        run_vectors = client.embeddings.create(model="my-embedder", input=TEXTS[:1], encoding_format="float").data
        assert cosine(run_vectors[0].embedding, expected[0]) >= 0.999  # the run's saved folder, served by its name

        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=endpoint.url, api_key="wrong").embeddings.create(model="all-minilm-l6-v2",
                                                                                    input=TEXTS)
        bare = httpx.post(f"{endpoint.url}/embeddings", json={"model": "all-minilm-l6-v2", "input": TEXTS})
        assert bare.status_code == 401
        with pytest.raises(openai.NotFoundError) as unknown:
            client.embeddings.create(model="gpt-embed", input=TEXTS)
        assert "served: all-minilm-l6-v2, my-embedder" in str(unknown.value)
        with pytest.raises(openai.BadRequestError) as chat:
            client.chat.completions.create(model="all-minilm-l6-v2", messages=[{"role": "user", "content": "hi"}])
        assert "POST the texts to /v1/embeddings" in str(chat.value)
    finally:
        if not orch.get_run(job_id).status.is_terminal():
            orch.cancel(job_id)
            orch.wait(job_id, timeout=60)
        orch.close()
        hardware.cuda_available.cache_clear()


# What the studio's sentence-transformers (>= 5) writes for all-MiniLM-L6-v2: module types and settings 3.x lacks
NEW_LAYOUT = {
    "modules.json": [{"idx": 0, "name": "0", "path": "",
                      "type": "sentence_transformers.base.modules.transformer.Transformer"},
                     {"idx": 1, "name": "1", "path": "1_Pooling",
                      "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
                     {"idx": 2, "name": "2", "path": "2_Normalize",
                      "type": "sentence_transformers.base.modules.normalize.Normalize"}],
    "sentence_bert_config.json": {"transformer_task": "feature-extraction", "module_output_name": "token_embeddings",
                                  "modality_config": {"text": {"method": "forward",
                                                               "method_output_name": "last_hidden_state"}}},
    "1_Pooling/config.json": {"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": True},
    "2_Normalize/config.json": {"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"},
}


def write_folder(folder: Path, files: dict) -> Path:
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(content))
    (folder / "model.safetensors").write_bytes(b"weights")
    return folder


def test_a_folder_in_the_new_module_layout_is_served_from_a_view_naming_the_modules_infinity_knows(tmp_path):
    run_model = write_folder(tmp_path / "run" / "model", NEW_LAYOUT)
    view = infinity_app.legacy_view(run_model, tmp_path / "job" / "st3-models" / "0")
    assert view == tmp_path / "job" / "st3-models" / "0"
    assert [m["type"] for m in json.loads((view / "modules.json").read_text())] == [
        "sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
        "sentence_transformers.models.Normalize"]
    assert json.loads((view / "sentence_bert_config.json").read_text()) == {"do_lower_case": False}
    assert json.loads((view / "1_Pooling" / "config.json").read_text()) == {
        "word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": False, "include_prompt": True}
    # the run's files are linked, never copied or edited
    assert (view / "model.safetensors").readlink() == run_model / "model.safetensors"
    assert (view / "2_Normalize" / "config.json").readlink() == run_model / "2_Normalize" / "config.json"
    assert {name: json.loads((run_model / name).read_text()) for name in NEW_LAYOUT} == NEW_LAYOUT
    assert infinity_app.legacy_view(view, tmp_path / "again") == view  # 3.x's layout: served as it is
    folder = embedding.bundled_model_dir()
    if folder is not None:
        assert infinity_app.legacy_view(folder, tmp_path / "bundled") == folder


def test_a_module_infinity_has_no_counterpart_for_is_refused_naming_it(tmp_path):
    layout = {**NEW_LAYOUT, "modules.json": NEW_LAYOUT["modules.json"] + [
        {"idx": 3, "name": "3", "path": "3_Router", "type": "sentence_transformers.base.modules.router.Router"}]}
    with pytest.raises(infinity_app.LegacyFolderError, match="its module sentence_transformers.base.modules.router."
                                                             "Router has no sentence-transformers 3.x counterpart"):
        infinity_app.legacy_view(write_folder(tmp_path / "a", layout), tmp_path / "view-a")
    layout = {**NEW_LAYOUT, "1_Pooling/config.json": {"embedding_dimension": 384, "pooling_mode": ["mean", "late"]}}
    with pytest.raises(infinity_app.LegacyFolderError, match="its pooling mode late is unknown"):
        infinity_app.legacy_view(write_folder(tmp_path / "b", layout), tmp_path / "view-b")


# the studio's sentence-transformers saves all-MiniLM-L6-v2 with a Dense layer on top, and encodes with it
SAVE_NEW_LAYOUT = """
import json, sys
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.dense import Dense
torch.manual_seed(0)
base = SentenceTransformer(sys.argv[1], device="cpu")
model = SentenceTransformer(modules=list(base) + [Dense(384, 32)], device="cpu")
model.save(sys.argv[2])
print(json.dumps(model.encode(json.loads(sys.argv[3])).tolist()))
"""
ENCODE = """
import json, sys
from sentence_transformers import SentenceTransformer
print(json.dumps(SentenceTransformer(sys.argv[1], device="cpu").encode(json.loads(sys.argv[2])).tolist()))
"""


@pytest.mark.subprocess
def test_the_view_of_a_folder_the_studio_wrote_gives_the_same_vectors_in_infinitys_sentence_transformers(tmp_path):
    assert embed_python().exists(), EMBED_INSTALL_FIX
    folder = embedding.bundled_model_dir()
    assert folder is not None, embedding.BUNDLED_FIX
    saved = run_python(SAVE_NEW_LAYOUT, str(folder), str(tmp_path / "model"), json.dumps(TEXTS))
    assert saved.returncode == 0, saved.stderr[-3000:]
    view = infinity_app.legacy_view(tmp_path / "model", tmp_path / "view")
    assert view == tmp_path / "view"
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # the embedding venv's own packages
    loaded = subprocess.run([str(embed_python()), "-c", ENCODE, str(view), json.dumps(TEXTS)], capture_output=True,
                            text=True, env=env, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    expected, got = (json.loads(done.stdout.strip().splitlines()[-1]) for done in (saved, loaded))
    assert [len(v) for v in got] == [32, 32, 32]
    assert [cosine(v, e) >= 0.9999 for v, e in zip(got, expected)] == [True, True, True]


@pytest.mark.train
@pytest.mark.subprocess
def test_the_openai_client_gets_a_full_embedding_run_trained_here_with_its_own_vectors(studio, tmp_path):
    assert embed_python().exists(), EMBED_INSTALL_FIX
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"anchor": f"What is item {i}?", "positive": f"Item {i} is a {word}."}) + "\n"
                            for i, word in enumerate(["cat", "boat", "lamp", "drum", "kite", "rope", "coin", "jar"])))
    cfg = TrainConfig(run_name="tiny embedder", method="embedding", adapter="full", model_name=embedding.BUNDLED_MODEL,
                      local_datasets=[str(data)], max_steps=2, batch_size=4, learning_rate=1e-4, warmup_steps=0,
                      logging_steps=1, save_steps=0, max_seq_length=64, random_seed=1,
                      eval_steps=2, method_settings=EmbeddingSettings(eval_on_start=False))  # the default ir_holdout, as a user runs it
    run_id = studio.start(cfg)
    snap = studio.wait(run_id, timeout=600)
    assert snap.status is RunStatus.COMPLETED, f"{snap.error}\n{studio.log_tail(run_id, 80)}"
    assert ("No eval set: 1 of the 8 pairs are held out as the evaluator's queries (embedding.ir_holdout 0.1); their "
            "passages stay in training, so 7 pairs train") in studio.log_tail(run_id, 200)
    output = Path(studio.get_run(run_id).output_dir)
    assert "sentence_transformers.models." not in (output / "modules.json").read_text()  # the layout 3.x lacks
    job_id, key = studio.start_server([ModelSource(run_id=run_id)])
    try:
        reference = run_python(REFERENCE, str(output), json.dumps(TEXTS))  # while infinity loads
        assert reference.returncode == 0, reference.stderr[-3000:]
        wait_until(lambda: studio.endpoint(job_id) is not None or studio.get_run(job_id).status.is_terminal(),
                   timeout=180, what="the embedding server to listen")
        endpoint = studio.endpoint(job_id)
        assert endpoint is not None, (studio.get_run(job_id).error, studio.log_tail(job_id))
        client = openai.OpenAI(base_url=endpoint.url, api_key=key)
        answer = client.embeddings.create(model="tiny-embedder", input=TEXTS)
        vectors = [item.embedding for item in sorted(answer.data, key=lambda d: d.index)]
        expected = json.loads(reference.stdout.strip().splitlines()[-1])
        assert [cosine(v, e) >= 0.999 for v, e in zip(vectors, expected)] == [True, True, True]
        assert "tiny-embedder: serving" in studio.log_tail(job_id, 200)
    finally:
        if not studio.get_run(job_id).status.is_terminal():
            studio.cancel(job_id)
            studio.wait(job_id, timeout=60)
