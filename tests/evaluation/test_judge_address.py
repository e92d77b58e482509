"""Where a judge may be: a judge URL at a loopback, link-local, private or otherwise non-public address is refused
unless the admin allows it, checked on the resolved address at validation and again before every request (which
goes to the address checked); redirects are not followed and a response body is never quoted in a message."""
from __future__ import annotations

import ipaddress
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainer_core.config import BUNDLED_MODEL, FieldError
from trainer_core.evaluation import endpoint
from trainer_core.evaluation.judge import Judge, JudgeUnavailable
from trainer_core.evaluation.spec import DEFAULT_RUBRIC, EvalSpec
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import events as ev
from trainer_core.worker.evaluate import Evaluator

BASE = ModelSource(model=BUNDLED_MODEL)
# ====================================================================== the judge's address
@pytest.mark.parametrize("address, problem", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.1.2.3", "private"), ("192.168.0.5", "private"),
    ("172.16.0.1", "private"), ("fd00::1", "private"), ("224.0.0.1", "multicast"), ("100.64.0.1", "non-public"),
    ("8.8.8.8", None), ("2001:4860:4860::8888", None)])
def test_address_classes(address, problem):
    assert endpoint.address_problem(address) == problem


def fake_dns(monkeypatch, answers: dict[str, list[str]]) -> None:
    """Names resolve to ``answers`` (changeable while the test runs); addresses as themselves; others not at all."""
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in answers:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                raise socket.gaierror(-2, "Name or service not known") from None
            return real(host, port, *args, **kwargs)  # the connection itself, to the checked address
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in answers[host]]

    monkeypatch.setattr(endpoint.socket, "getaddrinfo", getaddrinfo)


def judge_url_errors(url: str) -> list[FieldError]:
    spec = EvalSpec(source=BASE, data="x.jsonl", metrics=["judge"], judge_url=url, judge_model="m")
    return [e for e in spec._judge_errors() if e.field == "judge_url"]


def test_a_judge_url_at_a_private_address_is_refused_unless_the_admin_allows_it(monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", raising=False)
    fake_dns(monkeypatch, {"localhost": ["127.0.0.1"], "judge.internal": ["8.8.8.8", "10.0.0.7"],
                           "metadata.example": ["169.254.169.254"], "judge.example": ["8.8.8.8"]})
    assert judge_url_errors("http://localhost:8501/v1") == [FieldError(
        "judge_url", "the judge URL's host localhost resolves to 127.0.0.1, a loopback address: judges on this host "
                     "or a private network are refused unless the server's admin sets "
                     "FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE=1")]
    assert "10.0.0.7, a private address" in judge_url_errors("http://judge.internal/v1")[0].message  # any answer
    assert "169.254.169.254, a link-local address" in judge_url_errors("http://metadata.example/latest")[0].message
    assert "cannot be resolved" in judge_url_errors("https://nowhere.example/v1")[0].message
    assert judge_url_errors("https://judge.example/v1") == []
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    assert judge_url_errors("http://localhost:8501/v1") == []


@pytest.fixture
def stub():
    """A local HTTP server answering every POST with ``state['answer']`` = (status, headers, body)."""
    state = {"answer": (200, {}, json.dumps({"choices": [{"message": {"content": "8"}}]})), "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers["Content-Length"]))
            state["requests"].append({"path": self.path, "host": self.headers["Host"]})
            status, headers, body = state["answer"]
            data = body.encode()
            self.send_response(status)
            for name, value in {"Content-Length": str(len(data)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["port"] = server.server_address[1]
    state["url"] = f"http://127.0.0.1:{state['port']}/v1"
    yield state
    server.shutdown()
    server.server_close()


def test_the_worker_refuses_a_loopback_judge_by_default_and_sends_nothing(stub, monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", raising=False)
    judge = Judge(stub["url"], "m", DEFAULT_RUBRIC, api_key="sk-judge")
    with pytest.raises(JudgeUnavailable, match="127.0.0.1, a loopback address"):
        judge.score("q", "r", "a")
    judge.close()
    assert stub["requests"] == []


def test_the_address_is_checked_again_before_each_request_and_the_request_goes_to_it(stub, monkeypatch):
    """A name that resolved to a public address at validation and to loopback now (DNS rebinding) is refused;
    an allowed one is called at the checked address, with the original name in the Host header."""
    answers = {"judge.example": ["8.8.8.8"]}
    fake_dns(monkeypatch, answers)
    assert judge_url_errors(f"http://judge.example:{stub['port']}/v1") == []
    answers["judge.example"] = ["127.0.0.1"]
    judge = Judge(f"http://judge.example:{stub['port']}/v1", "m", DEFAULT_RUBRIC)
    with pytest.raises(JudgeUnavailable, match="resolves to 127.0.0.1"):
        judge.score("q", "r", "a")
    assert stub["requests"] == []
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    assert judge.score("q", "r", "a")[0] == 8.0
    judge.close()
    assert stub["requests"] == [{"path": "/v1/chat/completions", "host": f"judge.example:{stub['port']}"}]


def test_redirects_are_not_followed(stub, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    stub["answer"] = (307, {"Location": "http://169.254.169.254/latest/meta-data"}, "")
    judge = Judge(stub["url"], "m", DEFAULT_RUBRIC)
    with pytest.raises(JudgeUnavailable, match="answered HTTP 307, a redirect \\(not followed\\)"):
        judge.score("q", "r", "a")
    judge.close()
    assert len(stub["requests"]) == 1


@pytest.mark.parametrize("status", [200, 401, 500])
def test_a_response_body_is_never_quoted(stub, monkeypatch, tmp_path, status):
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")
    stub["answer"] = (status, {"Content-Type": "text/html"}, "<h1>internal admin page: SECRET-CONTENT</h1>")
    judge = Judge(stub["url"], "m", DEFAULT_RUBRIC)
    worker = Evaluator(tmp_path)
    from trainer_core.evaluation.scoring import SampleScores

    assert worker.judge_one(judge, SampleScores(), "q", "r", "a") is None
    worker.events.close()
    logged, _ = ev.read_new(tmp_path / ev.LOG_NAME, 0)
    assert [e.kind for e in logged] == ["warning"]
    assert f"HTTP {status}" in logged[0].message and "SECRET-CONTENT" not in logged[0].message
