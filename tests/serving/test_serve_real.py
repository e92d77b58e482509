"""A real serve job on the bundled model: base, a run's adapter and one of its checkpoints behind the key
gate, answered through the `openai` client and our own; then Stop, and the CLI's one-shot chat."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest

from db.entities import RunRecord
from db.store import Store
from tests.support.lora_runs import fake_trained_run
from tests.support import MODELS_CACHE, ROOT, wait_until
from trainer_core.host import hardware
from trainer_core.config import BUNDLED_MODEL
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.specs.model_source import ModelSource
from trainer_core.protocol import paths
from trainer_core.protocol.status import RunStatus
from trainer_core.serving.client import Sampling, ServeError, list_models, stream_chat

pytestmark = pytest.mark.subprocess

RUN_ID = "20260101-000000-5e7e00"
QUESTION = [{"role": "user", "content": "Name three colours."}]
SOURCES = [ModelSource(model=BUNDLED_MODEL), ModelSource(run_id=RUN_ID), ModelSource(run_id=RUN_ID, checkpoint=5)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINETUNE_STUDIO_HOME", str(tmp / "home"))
        mp.setenv("FINETUNE_STUDIO_MODELS", str(MODELS_CACHE))
        mp.setenv("FINETUNE_STUDIO_FORCE_CPU", "1")
        mp.setenv("FINETUNE_STUDIO_ALLOWED_ROOTS", f"{tmp}:{ROOT / '.test-cache'}")
        mp.delenv("DATABASE_URL", raising=False)
        hardware.cuda_available.cache_clear()
        run_dir = fake_trained_run(RUN_ID, "style run", steps=(5,))
        store = Store()
        store.create_run(RunRecord(id=RUN_ID, name="style run", status=RunStatus.COMPLETED, created_at=time.time(),
                                   output_dir=str(run_dir)))
        orch = Orchestrator(store=store)
        job_id, key = orch.start_server(SOURCES)
        try:
            wait_until(lambda: orch.endpoint(job_id) is not None or orch.get_run(job_id).status.is_terminal(),
                       timeout=300, what="the server to listen")
            assert orch.endpoint(job_id) is not None, (orch.get_run(job_id).error, orch.log_tail(job_id))
            yield orch, job_id, key, orch.endpoint(job_id), tmp
        finally:
            if not orch.get_run(job_id).status.is_terminal():
                orch.cancel(job_id)
                orch.wait(job_id, timeout=60)
            orch.close()
            hardware.cuda_available.cache_clear()


def test_the_openai_client_with_the_key_gets_a_streamed_greedy_answer(server):
    orch, job_id, key, endpoint, _ = server
    tuned = endpoint.name_of(f"run:{RUN_ID}")
    assert [m.name for m in endpoint.models] == ["smollm2-135m-instruct", "style-run", "style-run-step5"]
    assert tuned == "style-run" and endpoint.engine == "transformers"
    client = openai.OpenAI(base_url=endpoint.url, api_key=key)
    assert [m.id for m in client.models.list()] == ["smollm2-135m-instruct", "style-run", "style-run-step5"]
    chunks = [c.choices[0].delta.content for c in client.chat.completions.create(
        model=tuned, messages=QUESTION, temperature=0, max_tokens=16, stream=True) if c.choices and c.choices[0].delta.content]
    assert len(chunks) > 1
    whole = client.chat.completions.create(model=tuned, messages=QUESTION, temperature=0, max_tokens=16)
    assert whole.choices[0].message.content == "".join(chunks)  # greedy: the same answer, streamed or not
    assert whole.usage.completion_tokens == 16 or whole.choices[0].finish_reason == "stop"


def test_requests_without_the_key_are_refused(server):
    _, _, key, endpoint, _ = server
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.post(f"{endpoint.url}/chat/completions", headers=headers,
                              json={"model": "style-run", "messages": QUESTION})
        assert response.status_code == 401
        assert httpx.get(f"{endpoint.url}/models", headers=headers).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=endpoint.url, api_key="wrong").chat.completions.create(
            model="style-run", messages=QUESTION, max_tokens=4)
    refused = httpx.post(f"{endpoint.url.removesuffix('/v1')}/load_model", headers={"Authorization": f"Bearer {key}"},
                         json={"model": "gpt2"})
    assert refused.status_code == 404
    assert list_models(endpoint.url, key) == ["smollm2-135m-instruct", "style-run", "style-run-step5"]


def test_a_prompt_longer_than_the_context_is_a_400(server):
    _, _, key, endpoint, _ = server
    long = [{"role": "user", "content": "word " * 9000}]  # the bundled model reads 8,192 tokens
    with pytest.raises(ServeError, match=r"refused the request \(400\): the prompt has 9,0\d\d tokens but "
                                         r"style-run reads at most 8,192"):
        list(stream_chat(endpoint.url, key, "style-run", long, Sampling(max_new_tokens=4)))


def test_the_adapter_changes_the_answer_and_the_checkpoint_is_that_adapter(server):
    _, _, key, endpoint, _ = server
    answers = {}
    for model in endpoint.models:
        stream = stream_chat(endpoint.url, key, model.name, QUESTION, Sampling(max_new_tokens=16))
        answers[model.name] = "".join(stream)
        assert stream.stats.tokens > 0 and stream.stats.finish_reason in ("stop", "length")
    assert answers["smollm2-135m-instruct"] != answers["style-run"]
    assert answers["style-run-step5"] == answers["style-run"]  # the checkpoint holds the same adapter
    assert (paths.run_dir(RUN_ID) / "serving" / "final" / "model.safetensors").exists()
    assert (paths.run_dir(RUN_ID) / "serving" / "checkpoint-5" / "model.safetensors").exists()
    assert "torch" not in sys.modules and "transformers" not in sys.modules


def test_stop_ends_the_server_then_the_cli_chats(server):
    orch, job_id, key, endpoint, tmp = server
    expected = "".join(stream_chat(endpoint.url, key, "style-run", QUESTION, Sampling(max_new_tokens=16)))
    pid = orch.get_run(job_id).pid
    orch.stop(job_id)
    orch.wait(job_id, timeout=60)
    run = orch.get_run(job_id)
    assert run.status is RunStatus.STOPPED and run.error == ""
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
               what="the worker to exit")
    assert orch.endpoint(job_id) is None and not (paths.run_dir(job_id) / "endpoint.json").exists()
    with pytest.raises(ServeError, match="no model server is running"):
        list(stream_chat(endpoint.url, key, "style-run", QUESTION, Sampling()))
    # The device is free again: the CLI starts its own server, answers once and stops it.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "trainer_core", "chat", "style run", "--prompt", "Name three colours.",
                             "--max-new-tokens", "16"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == expected + "\n"  # the same greedy answer, streamed to stdout
    assert "chatting with style run · final" in result.stderr and "Traceback" not in result.stderr
    cli_jobs = [r for r in orch.store.list_runs() if r.kind.value == "serve" and r.id != job_id]
    assert [r.status for r in cli_jobs] == [RunStatus.STOPPED]  # the CLI stopped its server on the way out
