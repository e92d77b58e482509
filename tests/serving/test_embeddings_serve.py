"""Embedding models served through infinity-emb (its own venv, .venv-embed, built by `make install`) behind the
key gate: the openai client's embeddings.create gets sentence-transformers' own vectors from the bundled
all-MiniLM-L6-v2 and from a full embedding run's saved folder; a wrong or missing key is a 401, an unknown model a
404 naming the served ones; the gate passes the engine only a checked text request; ServeSpec refuses mixing
embedding and chat models."""
from __future__ import annotations

import json
import math
import shutil

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from tests.support import ROOT, run_python, wait_until
from trainer_core.planning import hardware
from trainer_core.config import BUNDLED_MODEL, TrainConfig
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.jobs.jobspec import ModelSource
from trainer_core.methods import embedding
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind, write_kind
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
