"""The LLM judge over HTTP (a local OpenAI-compatible stub), an endpoint that is down, and the overall metrics."""
from __future__ import annotations

import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from trainer_core.evaluation import scoring
from trainer_core.evaluation.judge import Judge, JudgeUnavailable, parse_score
from trainer_core.evaluation.spec import DEFAULT_RUBRIC
from trainer_core.protocol import events as ev
from trainer_core.worker.evaluate import Evaluator


@pytest.fixture
def allow_loopback(monkeypatch):
    """The stub judges listen on 127.0.0.1, which a judge may only call when the admin allowed private addresses."""
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE", "1")


@pytest.fixture
def endpoint(allow_loopback):
    """A stub chat endpoint: answers with the reply set in ``state`` and records what it was sent."""
    state = {"reply": "Score: 7", "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"].append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": state["reply"]}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there once the socket is closed


def test_the_judge_sends_the_rubric_and_the_key_and_parses_the_score(endpoint):
    judge = Judge(endpoint["url"], "grader", "Q {prompt} R {reference} A {answer} {x}", api_key="sk-test")
    score, reply = judge.score("What {is} 2+2?", "4", "four")
    judge.close()
    assert (score, reply) == (7.0, "Score: 7")
    sent = endpoint["requests"][0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer sk-test"
    assert sent["body"]["model"] == "grader" and sent["body"]["temperature"] == 0
    assert sent["body"]["messages"][0]["content"] == "Q What {is} 2+2? R 4 A four {x}"  # braces in user text are text


@pytest.mark.parametrize("reply, score", [("10", 10.0), ("I'd give it 3/10.", 3.0), ("8.5", 8.0), ("none", None),
                                          ("0", None), ("11", None)])
def test_scores_are_read_from_the_reply(reply, score):
    assert parse_score(reply) == score


def test_an_endpoint_that_is_down_is_one_warning_and_an_empty_judge_column(tmp_path, allow_loopback):
    judge = Judge(closed_port_url(), "grader", DEFAULT_RUBRIC)
    with pytest.raises(JudgeUnavailable, match="cannot be reached"):
        judge.score("q", "r", "a")
    evaluator = Evaluator(tmp_path)
    scores = scoring.SampleScores()
    assert evaluator.judge_one(judge, scores, "q", "r", "a") is None  # no more calls for this run
    evaluator.events.close()
    logged, _ = ev.read_new(tmp_path / ev.LOG_NAME, 0)
    assert [e.kind for e in logged] == ["warning"] and scores.judge is None
    assert logged[0].message.startswith("LLM judge unavailable, the judge column stays empty for this eval: the "
                                        "judge endpoint")


def test_overall_metrics_agree_with_the_libraries_called_directly():
    answers = ["The cat sat on the mat.", "Paris", "  hello   world "]
    references = ["The cat is on the mat.", "The capital is Paris.", "hello world"]
    metrics = ["exact", "rouge", "bleu", "perplexity"]
    scores = [scoring.score_text(a, r, metrics) for a, r in zip(answers, references)]
    scores[0].loss, scores[0].tokens = 1.0, 3
    scores[1].loss, scores[1].tokens = 2.0, 1
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    assert [s.exact for s in scores] == [0.0, 0.0, 1.0]  # whitespace runs collapse
    assert [s.rouge_l for s in scores] == [scorer.score(r, a)["rougeL"].fmeasure for a, r in zip(answers, references)]
    assert [s.bleu for s in scores] == [sacrebleu.sentence_bleu(a, [r]).score for a, r in zip(answers, references)]
    result = scoring.overall(scores, answers, references, metrics)
    assert result["bleu"] == sacrebleu.corpus_bleu(answers, [references]).score
    assert result["rouge_l"] == pytest.approx(sum(s.rouge_l for s in scores) / 3)
    assert result["loss"] == pytest.approx((1.0 * 3 + 2.0 * 1) / 4)  # token-weighted; the unscored sample is left out
    assert result["perplexity"] == pytest.approx(math.exp(1.25))
    assert result["exact"] == pytest.approx(1 / 3) and result["samples"] == 3
    assert "judge" not in result


def test_the_judge_key_reaches_the_worker_by_name_only(home, monkeypatch, tmp_path):
    from trainer_core.config import BUNDLED_MODEL
    from trainer_core.evaluation.spec import EvalSpec
    from trainer_core.jobs.launcher import WorkerLauncher
    from trainer_core.specs.model_source import ModelSource

    monkeypatch.setenv("JUDGE_API_KEY", "sk-judge-secret")
    monkeypatch.setenv("FINETUNE_STUDIO_JUDGE_KEY_ENVS", "JUDGE_API_KEY")  # declared by the admin
    monkeypatch.setenv("FINETUNE_STUDIO_PASSWORD", "server-password")
    judged = EvalSpec(source=ModelSource(model=BUNDLED_MODEL), data="x.jsonl", metrics=["judge"],
                      judge_url="http://127.0.0.1:1/v1", judge_model="m", judge_key_env="JUDGE_API_KEY")
    env = WorkerLauncher().environment(tmp_path, judged, 1)
    assert env["JUDGE_API_KEY"] == "sk-judge-secret" and "FINETUNE_STUDIO_PASSWORD" not in env
    assert "sk-judge-secret" not in json.dumps(judged.to_dict())  # job.json holds the variable's name
    # A spec naming the server's own secret does not get it.
    grab = EvalSpec(**{**judged.to_dict(), "source": judged.source, "judge_key_env": "FINETUNE_STUDIO_PASSWORD"})
    assert "FINETUNE_STUDIO_PASSWORD" not in WorkerLauncher().environment(tmp_path, grab, 1)


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "FINETUNE_STUDIO_PASSWORD", "FINETUNE_STUDIO_TOKEN"])
def test_a_judge_key_naming_a_server_or_run_secret_is_refused_and_not_passed(home, monkeypatch, tmp_path, name):
    """A judge URL can be anywhere: the dashboard's HF token (or password) must not travel to it."""
    from trainer_core.config import BUNDLED_MODEL
    from trainer_core.evaluation.spec import EvalSpec
    from trainer_core.jobs.launcher import WorkerLauncher
    from trainer_core.specs.model_source import ModelSource

    monkeypatch.setenv(name, "the-servers-own-secret")
    grab = EvalSpec(source=ModelSource(model=BUNDLED_MODEL), data="x.jsonl", metrics=["judge"],
                    judge_url="http://127.0.0.1:1/v1", judge_model="m", judge_key_env=name)
    problems = [e for e in grab.validate() if e.field == "judge_key_env"]
    assert problems and name in problems[0].message and "JUDGE_API_KEY" in problems[0].message
    env = WorkerLauncher().environment(tmp_path, grab, 1)  # a hand-written job.json is not trusted either
    assert "the-servers-own-secret" not in env.values()


@pytest.mark.parametrize("reply", [7, [{"type": "text", "text": "7"}], {"text": "7"}])
def test_a_reply_content_that_is_not_text_is_an_unavailable_judge_not_a_crash(endpoint, reply):
    """content 7 or a list of parts reached parse_score: a TypeError that failed the whole eval."""
    endpoint["reply"] = reply
    judge = Judge(endpoint["url"], "grader", DEFAULT_RUBRIC)
    with pytest.raises(JudgeUnavailable, match="did not answer like an OpenAI-compatible chat endpoint"):
        judge.score("q", "r", "a")
    judge.close()
