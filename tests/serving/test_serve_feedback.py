"""Votes on served answers (issue 34): a serve job that keeps its completions stores each chat completion (plain or
streamed) under the engine's id, takes ratings of them at POST /v1/feedback with the endpoint's key, refuses ids it
did not store (another job's included) and bad ratings, and the dashboard turns the ratings into votes once."""
from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from db.store import Store
from trainer_core.auth.access import Actor, Role
from trainer_core.feedback import export, served, votes
from trainer_core.feedback.service import Feedback
from trainer_core.protocol import paths
from trainer_core.serving.gate import GateConfig, KeyGate, completion_of
from trainer_core.serving.spec import COMPLETIONS_FILE, FEEDBACK_FILE, ServeSpec, feedback_files, hash_key

KEY = "secret-key-1"
AUTH = {"Authorization": f"Bearer {KEY}"}
ASK = {"model": "tuned", "messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0.5}


class Engine:
    """Answers every chat request with completion ``chatcmpl-<n>``: one JSON body, or two deltas as events."""

    def __init__(self):
        self.n = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        self.n += 1
        cid = f"chatcmpl-{self.n}"
        if request.get("stream"):
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            for piece in ("Four", " it is."):
                chunk = {"id": cid, "choices": [{"index": 0, "delta": {"content": piece}}]}
                await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        raw = json.dumps({"id": cid, "object": "chat.completion",
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}}]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": raw})


def endpoint(folder, store: bool = True) -> TestClient:
    folder.mkdir(parents=True, exist_ok=True)
    files = feedback_files(folder, ServeSpec(store_completions=store))
    return TestClient(KeyGate(Engine(), GateConfig(key_hash=hash_key(KEY), models={"tuned": ""}, **files)))


def test_completions_are_kept_and_rated_with_the_endpoints_key(tmp_path):
    client = endpoint(tmp_path / "job")
    plain = client.post("/v1/chat/completions", json=ASK, headers=AUTH).json()
    client.post("/v1/chat/completions", json={**ASK, "stream": True}, headers=AUTH)
    stored = [json.loads(line) for line in (tmp_path / "job" / COMPLETIONS_FILE).read_text().splitlines()]
    assert [(c["id"], c["answer"], c["model"], c["messages"], c["sampling"]) for c in stored] == [
        ("chatcmpl-1", "4", "tuned", ASK["messages"], {"temperature": 0.5}),
        ("chatcmpl-2", "Four it is.", "tuned", ASK["messages"], {"temperature": 0.5})]

    answer = client.post("/v1/feedback", json={"completion_id": plain["id"], "rating": "up", "user": "app-user-7"},
                         headers=AUTH)
    assert answer.status_code == 200 and answer.json()["completion_id"] == "chatcmpl-1"
    assert client.post("/v1/feedback", json={"completion_id": "chatcmpl-2", "edited": "4."}, headers=AUTH).status_code == 200
    assert client.post("/v1/feedback", json={"completion_id": "chatcmpl-1", "rating": "up"}).status_code == 401
    ratings = [json.loads(line) for line in (tmp_path / "job" / FEEDBACK_FILE).read_text().splitlines()]
    assert [(r["completion_id"], r.get("rating"), r.get("edited"), r["user"]) for r in ratings] == [
        ("chatcmpl-1", "up", None, "app-user-7"), ("chatcmpl-2", None, "4.", "")]


@pytest.mark.parametrize("body, status, message", [
    ({"completion_id": "chatcmpl-99", "rating": "up"}, 404, "no completion 'chatcmpl-99' was stored by this endpoint"),
    ({"completion_id": "chatcmpl-1", "rating": "meh"}, 400, "rating is \"up\" or \"down\", not 'meh'"),
    ({"completion_id": "chatcmpl-1", "edited": "   "}, 400, "edited is a non-empty text"),
    ({"completion_id": "chatcmpl-1", "rating": "up", "edited": "x"}, 400, "give exactly one of rating"),
    ({"completion_id": "chatcmpl-1"}, 400, "give exactly one of rating"),
    ({"rating": "up"}, 400, "completion_id: the id of a chat completion this endpoint returned"),
])
def test_bad_ratings_are_refused_naming_the_problem(tmp_path, body, status, message):
    client = endpoint(tmp_path / "job")
    client.post("/v1/chat/completions", json=ASK, headers=AUTH)
    answer = client.post("/v1/feedback", json=body, headers=AUTH)
    assert answer.status_code == status and message in answer.json()["error"]["message"]
    assert not (tmp_path / "job" / FEEDBACK_FILE).exists()


def test_another_jobs_completion_and_an_endpoint_that_keeps_none_are_refused(tmp_path):
    first, second = endpoint(tmp_path / "a"), endpoint(tmp_path / "b")
    first.post("/v1/chat/completions", json=ASK, headers=AUTH)
    answer = second.post("/v1/feedback", json={"completion_id": "chatcmpl-1", "rating": "up"}, headers=AUTH)
    assert answer.status_code == 404  # each serve job keeps its own
    plain = endpoint(tmp_path / "c", store=False)
    plain.post("/v1/chat/completions", json=ASK, headers=AUTH)
    answer = plain.post("/v1/feedback", json={"completion_id": "chatcmpl-1", "rating": "up"}, headers=AUTH)
    assert answer.status_code == 404 and "does not keep its completions" in answer.json()["error"]["message"]
    assert list((tmp_path / "c").iterdir()) == []  # nothing stored without the opt-in


def test_ratings_become_votes_once_and_export(home):
    job = "serve-job-1"
    client = endpoint(paths.run_dir(job))
    client.post("/v1/chat/completions", json=ASK, headers=AUTH)
    client.post("/v1/chat/completions", json=ASK, headers=AUTH)
    client.post("/v1/feedback", json={"completion_id": "chatcmpl-1", "rating": "down", "user": "u1"}, headers=AUTH)
    client.post("/v1/feedback", json={"completion_id": "chatcmpl-2", "preferred": "2+2 is 4."}, headers=AUTH)
    store = Store()
    feedback = Feedback(store)
    report = served.sync(feedback, [job])
    assert (report.added, report.skipped) == (2, [])
    assert served.sync(feedback, [job]).added == 0  # idempotent
    found = sorted((v.voter, v.kind, v.label, v.answer_a, v.answer_b, v.origin) for v in store.votes())
    assert found == [(f"endpoint {job}", "pair", "b_better", "4", "2+2 is 4.", "served"),
                     (f"u1 via endpoint {job}", "single", "down", "4", "", "served")]
    done = feedback.export(Actor("ann", Role.OPERATOR), "dpo")
    assert json.loads(done.path.read_text())["chosen"] == [{"role": "assistant", "content": "2+2 is 4."}]
    store.engine.dispose()
    assert export.versions("dpo") == [1] and votes.ORIGINS[-1] == "served"


def test_a_completion_is_read_from_a_body_or_events():
    assert completion_of(b'{"id": "c1", "choices": [{"message": {"content": "hi"}}]}') == ("c1", "hi")
    assert completion_of(b'data: {"id": "c2", "choices": [{"delta": {"content": "a"}}]}\n\ndata: [DONE]\n') == ("c2", "a")
    assert completion_of(b'{"error": {"message": "bad"}}') is None and completion_of(b"data: [DONE]") is None
