"""The key gate in front of the serving engine, over a fake inner app that records what reaches it."""
from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from trainer_core.serving.gate import Activity, GateConfig, KeyGate, generation_config_json
from trainer_core.serving.spec import hash_key

KEY = "secret-key-1"


class Inner:
    """The engine's app: answers 200 with what it received."""

    def __init__(self):
        self.seen: list[tuple[str, str, dict, dict]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        data = json.loads(body) if body else {}
        self.seen.append((scope["method"], scope["path"], dict(scope["headers"]), data))
        raw = json.dumps({"ok": True}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": raw})


@pytest.fixture
def model_dir(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": False, "transformers_version": "5"}))
    return folder


def gate(model_dir, translate=True, limits=None, max_body=4096, activity=None):
    inner = Inner()
    config = GateConfig(key_hash=hash_key(KEY), models={"tuned": str(model_dir), "base": ""},
                        translate_sampling=translate, max_body_bytes=max_body)
    return inner, TestClient(KeyGate(inner, config, activity=activity, limits=limits))


AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                                     {"Authorization": "Bearer "}, {"Authorization": f"Basic {KEY}"}])
@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/chat/completions"),
                                         ("POST", "/load_model")])
def test_no_or_wrong_key_is_401_everywhere(model_dir, headers, method, path):
    inner, client = gate(model_dir)
    response = client.request(method, path, headers=headers, json={"model": "tuned"} if method == "POST" else None)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "missing or wrong API key" in response.json()["error"]["message"]
    assert inner.seen == []


def test_models_answered_by_the_gate(model_dir):
    inner, client = gate(model_dir)
    response = client.get("/v1/models", headers=AUTH)
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == ["tuned", "base"]
    assert inner.seen == []


@pytest.mark.parametrize("method,path", [("POST", "/load_model"), ("POST", "/reset"), ("POST", "/v1/responses"),
                                         ("GET", "/v1/chat/completions"), ("GET", "/docs"), ("DELETE", "/v1/models")])
def test_other_routes_are_404(model_dir, method, path):
    inner, client = gate(model_dir)
    response = client.request(method, path, headers=AUTH)
    assert response.status_code == 404
    assert "is not served here" in response.json()["error"]["message"]
    assert inner.seen == []


def test_health_passes_through(model_dir):
    inner, client = gate(model_dir)
    assert client.get("/health", headers=AUTH).status_code == 200
    assert [(m, p) for m, p, *_ in inner.seen] == [("GET", "/health")]


def test_unknown_model_is_404_naming_the_served_ones(model_dir):
    inner, client = gate(model_dir)
    for model in ("other", None, "../m", 3):
        response = client.post("/v1/chat/completions", headers=AUTH, json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 404
        assert response.json()["error"]["message"].endswith("is not served here; served: tuned, base")
    assert inner.seen == []


def test_body_cap_and_bad_json(model_dir):
    inner, client = gate(model_dir, max_body=200)
    big = {"model": "tuned", "messages": [{"role": "user", "content": "x" * 500}]}
    response = client.post("/v1/chat/completions", headers=AUTH, json=big)
    assert response.status_code == 413 and "at most 200" in response.json()["error"]["message"]
    chunked = client.post("/v1/chat/completions", headers=AUTH, content=iter([b"{" + b" " * 150, b" " * 150 + b"}"]))
    assert chunked.status_code == 413 and "over 200 bytes" in chunked.json()["error"]["message"]
    for raw in (b"not json", b"[1, 2]", b"\x00\xff"):
        response = client.post("/v1/chat/completions", headers=AUTH, content=raw)
        assert response.status_code == 400
    assert inner.seen == []


def test_sampling_becomes_generation_config_built_on_the_models_own(model_dir):
    inner, client = gate(model_dir)
    body = {"model": "tuned", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
            "min_p": 0.05, "repetition_penalty": 1.2, "max_tokens": 16, "seed": 3}
    assert client.post("/v1/chat/completions", headers=AUTH, json=body).status_code == 200
    _, path, headers, forwarded = inner.seen[0]
    assert path == "/v1/chat/completions"
    assert set(forwarded) == {"model", "messages", "stream", "temperature", "top_p", "max_tokens", "seed",
                              "generation_config"}
    assert json.loads(forwarded["generation_config"]) == {
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": True, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.2, "max_new_tokens": 16}
    assert int(headers[b"content-length"]) == len(json.dumps(forwarded).encode())


def test_greedy_drops_sampling_fields():
    config = json.loads(generation_config_json("", {"temperature": 0, "top_k": 50, "min_p": 0.1, "max_tokens": 5}))
    assert config == {"do_sample": False, "max_new_tokens": 5}


def test_vllm_gets_the_fields_untouched(model_dir):
    inner, client = gate(model_dir, translate=False)
    body = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "top_k": 40, "min_p": 0.05, "stream_options": {"include_usage": True}}
    assert client.post("/v1/chat/completions", headers=AUTH, json=body).status_code == 200
    assert inner.seen[0][3] == body


def test_prompt_longer_than_the_context_is_400_and_max_tokens_fits_the_rest(model_dir):
    counts = {"tokens": 3000}
    inner, client = gate(model_dir, translate=False, limits=lambda model, body: (counts["tokens"], 2048))
    body = {"model": "tuned", "messages": [{"role": "user", "content": "long"}], "max_tokens": 100}
    response = client.post("/v1/chat/completions", headers=AUTH, json=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == ("the prompt has 3,000 tokens but tuned reads at most 2,048 (its "
                                                   "context length): shorten the conversation or the system prompt")
    counts["tokens"] = 2000
    assert client.post("/v1/chat/completions", headers=AUTH, json=body).status_code == 200
    assert inner.seen[-1][3]["max_tokens"] == 48
    unnamed = {"model": "tuned", "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", headers=AUTH, json=unnamed).status_code == 200
    assert inner.seen[-1][3]["max_tokens"] == 48  # the engine's default (1,024) would not fit either
    counts["tokens"] = 10
    assert client.post("/v1/chat/completions", headers=AUTH, json=unnamed).status_code == 200
    assert "max_tokens" not in inner.seen[-1][3]  # room enough: the engine's own default stands


def test_activity_counts_only_authorized_requests(model_dir):
    activity = Activity()
    inner, client = gate(model_dir, activity=activity)
    before = activity.last
    assert client.get("/v1/models").status_code == 401
    assert activity.last == before  # refused requests do not keep the server alive
    client.get("/v1/models", headers=AUTH)
    assert activity.last > before and activity.in_flight == 0


def test_activity_touches_its_file(tmp_path):
    path = tmp_path / "activity"
    activity = Activity(touch_file=str(path))
    activity.begin()
    assert path.exists() and activity.idle_s() == 0.0
    activity.end()
    assert activity.in_flight == 0


def test_gate_built_from_the_environment_file(model_dir, tmp_path, monkeypatch):
    path = tmp_path / "gate.json"
    path.write_text(GateConfig(key_hash=hash_key(KEY), models={"tuned": str(model_dir)}, translate_sampling=False).to_json())
    monkeypatch.setenv("FINETUNE_STUDIO_SERVE_GATE", str(path))
    client = TestClient(KeyGate(Inner()))
    assert client.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == "tuned"
    assert client.get("/v1/models").status_code == 401


@pytest.mark.parametrize("field,value", [("max_tokens", "-5"), ("max_tokens", "0"), ("max_completion_tokens", "-1"),
                                         ("max_tokens", "1e300"), ("max_tokens", '"50"'),
                                         ("max_tokens", "true")])
@pytest.mark.parametrize("translate", [True, False])
def test_a_max_tokens_that_is_not_a_positive_count_is_400_naming_it(model_dir, field, value, translate):
    """A negative answer length reached generate() (max_new_tokens=-5); 1e300 or Infinity skipped the cap."""
    inner, client = gate(model_dir, translate=translate, limits=lambda model, body: (10, 100))
    raw = '{"model": "tuned", "messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field, value)
    answer = client.post("/v1/chat/completions", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert answer.status_code == 400 and field in answer.json()["error"]["message"]
    assert inner.seen == []


@pytest.mark.parametrize("field,value", [("top_k", "Infinity"), ("repetition_penalty", "-Infinity"),
                                         ("temperature", "NaN"), ("max_tokens", "Infinity")])
@pytest.mark.parametrize("translate", [True, False])
def test_nan_and_infinity_are_400_not_a_crash(model_dir, field, value, translate):
    """Python's json reads them; int(Infinity) crashed the gate (a 500) and the rest reached the engine."""
    inner, client = gate(model_dir, translate=translate)
    raw = '{"model": "tuned", "messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field, value)
    answer = client.post("/v1/chat/completions", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert answer.status_code == 400 and "not JSON" in answer.json()["error"]["message"]
    assert inner.seen == []


@pytest.mark.parametrize("messages", ['"hi"', "null", "[]", "[1, null]", '[{"content": "hi"}]', '[{"role": "user", "content": 5}]'])
def test_messages_of_the_wrong_shape_are_400_not_the_engines_500(model_dir, messages):
    """transformers serve answered these with a bare 500 Internal Server Error (seen on a real server)."""
    inner, client = gate(model_dir)
    raw = '{"model": "tuned", "messages": %s}' % messages
    answer = client.post("/v1/chat/completions", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert answer.status_code == 400 and "messages" in answer.json()["error"]["message"]
    assert inner.seen == []


def test_n_above_1_is_400_on_transformers_and_passed_to_vllm(model_dir):
    """transformers serve gives one answer whatever n asks for: the caller silently got 1 of 3 (real server)."""
    body = {"model": "tuned", "messages": [{"role": "user", "content": "hi"}], "n": 3}
    inner, client = gate(model_dir)
    answer = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert answer.status_code == 400 and "n must be 1" in answer.json()["error"]["message"] and inner.seen == []
    assert client.post("/v1/chat/completions", json={**body, "n": 1}, headers=AUTH).status_code == 200
    inner, client = gate(model_dir, translate=False)
    assert client.post("/v1/chat/completions", json=body, headers=AUTH).status_code == 200 and inner.seen[0][3]["n"] == 3


@pytest.mark.parametrize("body", [{}, {"prompt": ["a"]}, {"prompt": None}])
def test_a_completion_without_a_text_prompt_is_400(model_dir, body):
    """transformers serve answered a missing prompt with a bare 500 (real server)."""
    inner, client = gate(model_dir)
    answer = client.post("/v1/completions", json={"model": "tuned", **body}, headers=AUTH)
    assert answer.status_code == 400 and "prompt must be a string" in answer.json()["error"]["message"]
    assert inner.seen == []
    inner, client = gate(model_dir, translate=False)  # vLLM takes a list of prompts, and answers for itself
    assert client.post("/v1/completions", json={"model": "tuned", **body}, headers=AUTH).status_code == 200
