"""The OpenAI-compatible fine-tuning API driven by the official ``openai`` client against a real server process,
over fake jobs (tests/api/fake_jobs.py: scripted training steps, a chat server without a model): upload, create,
events to succeeded, chat with the fine-tuned model (streamed chunks named after it), the models routes; a
reinforcement job as a GRPO run; a job continuing a fine-tuned model; cancel, pause and resume; roles; a bad file
named by line; bad input named by parameter; a server restart mid-job."""
from __future__ import annotations

import json
import signal

import httpx
import openai
import pytest

from db import users
from tests.api.fake_jobs import SERVED_NAME
from tests.api.server_support import ApiServer
from tests.support import wait_until
from trainer_core.auth.access import Role
from trainer_core.config import TrainConfig

CHAT = [{"messages": [{"role": "user", "content": f"What is {n} + {n}?"},
                      {"role": "assistant", "content": str(2 * n)}]} for n in range(4)]
PROMPTS = [{"messages": [{"role": "developer", "content": "Answer with a number."},
                         {"role": "user", "content": f"What is {n} + {n}?"}], "reference_answer": str(2 * n)}
           for n in range(4)]
GRADER = {"type": "string_check", "name": "sum", "input": "{{sample.output_text}}",
          "reference": "{{item.reference_answer}}", "operation": "eq"}
PAIRS = [{"input": {"messages": [{"role": "user", "content": "Say hi"}]},
          "preferred_output": [{"role": "assistant", "content": "Hi!"}],
          "non_preferred_output": [{"role": "assistant", "content": "Go away."}]}] * 3


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module. Its fakes pause after step 2 while the marker ``go`` is missing (``held``)."""
    root = tmp_path_factory.mktemp("api")
    (root / "go").touch()
    api = ApiServer(root / "home", root, fake={"FAKE_PAUSE_AT": "2", "FAKE_PAUSE_UNTIL": str(root / "go")}).start()
    yield api
    api.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def ana(server) -> openai.OpenAI:
    return server.client("ana", Role.OPERATOR)


@pytest.fixture(scope="module")
def chat_file(ana):
    return ana.files.create(file=("train.jsonl", jsonl(CHAT)), purpose="fine-tune")


def finished(client: openai.OpenAI, job_id: str, timeout: float = 60):
    wait_until(lambda: client.fine_tuning.jobs.retrieve(job_id).status in ("succeeded", "failed", "cancelled", "paused"),
               timeout=timeout, what=f"job {job_id} to end")
    return client.fine_tuning.jobs.retrieve(job_id)


def error_of(caught: pytest.ExceptionInfo) -> dict:
    return caught.value.body


def test_a_job_from_upload_to_chat(server, ana, chat_file):
    assert chat_file.purpose == "fine-tune" and chat_file.filename == "train.jsonl" and chat_file.status == "processed"
    assert ana.files.retrieve(chat_file.id).bytes == len(jsonl(CHAT))
    assert ana.files.content(chat_file.id).read() == jsonl(CHAT)
    held_out = ana.files.create(file=("valid.jsonl", jsonl(CHAT[:2])), purpose="fine-tune")
    job = ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=chat_file.id, suffix="sums",
                                      validation_file=held_out.id,
                                      seed=7, metadata={"team": "math"}, hyperparameters={"n_epochs": 2},
                                      extra_body={"studio": {"lora_r": 8}})
    assert job.status in ("queued", "running") and job.fine_tuned_model is None and job.seed == 7
    assert job.hyperparameters.n_epochs == 2 and job.hyperparameters.batch_size == 4
    job = finished(ana, job.id)
    assert job.status == "succeeded" and job.error is None
    assert job.fine_tuned_model == f"ft:smollm2-135m-instruct:sums:{job.id}"
    run_id = job.id.removeprefix("ftjob-")
    config = (server.home / "runs" / run_id / "config.yaml").read_text()  # an ordinary run with the asked settings
    assert "num_epochs: 2.0" in config and "lora_r: 8" in config and "random_seed: 7" in config
    assert f"openai-files/{held_out.id}.jsonl" in config and job.validation_file == held_out.id

    events = list(ana.fine_tuning.jobs.list_events(job.id, limit=4))  # the client follows the pages
    metrics = [e for e in events if e.type == "metrics"]
    assert [e.data["step"] for e in metrics] == [5, 4, 3, 2, 1]  # newest first
    assert [e.data.get("train_loss") for e in metrics] == [0.4, 0.5, None, 1.0, 2.0]  # 2/step, NaN at step 3
    assert metrics[1].data["valid_loss"] == 0.75 and metrics[0].message == "Step 5/5: training loss=0.4000"
    assert events[0].message == "The job has successfully completed"
    assert events[1].message == f"New fine-tuned model created: {job.fine_tuned_model}"
    assert events[-1].message == f"Created fine-tuning job: {job.id}"
    assert len({e.id for e in events}) == len(events)
    page = ana.fine_tuning.jobs.list_events(job.id, limit=3)
    assert len(page.data) == 3 and page.has_more

    listed = ana.fine_tuning.jobs.list(metadata={"team": "math"})
    assert [j.id for j in listed.data] == [job.id]

    answer = ana.chat.completions.create(model=job.fine_tuned_model, messages=[{"role": "user", "content": "2 + 2?"}])
    assert answer.choices[0].message.content == f"echo {SERVED_NAME}: 2 + 2?"
    assert answer.model == job.fine_tuned_model
    chunks = list(ana.chat.completions.create(model=job.fine_tuned_model, stream=True,
                                              messages=[{"role": "user", "content": "3 + 3?"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == f"echo {SERVED_NAME}: 3 + 3? "
    assert len(chunks) == 5 and {c.model for c in chunks} == {job.fine_tuned_model}  # not the server's name

    listed = ana.models.list().data
    assert {"SmolLM2-135M-Instruct", job.fine_tuned_model} <= {m.id for m in listed}
    model = ana.models.retrieve(job.fine_tuned_model)
    assert (model.id, model.object, model.owned_by, model.created) == (job.fine_tuned_model, "model", "ana",
                                                                       job.created_at)
    bundled = ana.models.retrieve("SmolLM2-135M-Instruct")
    assert (bundled.id, bundled.owned_by) == ("SmolLM2-135M-Instruct", "finetune-studio")
    for missing in ("gpt-4o-mini", f"{job.fine_tuned_model}:ckpt-step-3", f"ft:smollm2-135m-instruct:x:{job.id}"):
        with pytest.raises(openai.NotFoundError) as caught:
            server.client("vera", Role.VIEWER).models.retrieve(missing)  # viewers read models too
        assert error_of(caught)["param"] == "model" and error_of(caught)["code"] == "model_not_found"
    log = server.log_text()
    assert "ana POST /v1/fine_tuning/jobs -> 200" in log and "ana POST /v1/chat/completions -> 200" in log
    assert "fts_" not in log  # who, never the token


def test_a_dpo_job_trains_the_studio_pairs(server, ana):
    pairs = ana.files.create(file=("pairs.jsonl", jsonl(PAIRS)), purpose="fine-tune")
    job = ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=pairs.id,
                                      method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2}}})
    assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.2
    config = (server.home / "runs" / job.id.removeprefix("ftjob-") / "config.yaml").read_text()
    assert "method: dpo" in config and "beta: 0.2" in config and f"{pairs.id}.pairs.jsonl" in config
    assert finished(ana, job.id).status == "succeeded"
    converted = (server.home / "datasets" / "openai-files" / f"{pairs.id}.pairs.jsonl").read_text().splitlines()
    assert json.loads(converted[0]) == {"prompt": [{"role": "user", "content": "Say hi"}],
                                        "chosen": [{"role": "assistant", "content": "Hi!"}],
                                        "rejected": [{"role": "assistant", "content": "Go away."}]}


def test_a_reinforcement_job_is_a_grpo_run_scored_by_its_grader(server, ana):
    prompts = ana.files.create(file=("sums.jsonl", jsonl(PROMPTS)), purpose="fine-tune")
    grader = {"type": "multi", "calculate_output": "0.8 * sum + 0.2 * short",
              "graders": {"sum": GRADER, "short": {**GRADER, "reference": "I don't know", "operation": "ne"}}}
    job = ana.fine_tuning.jobs.create(
        model="SmolLM2-135M-Instruct", training_file=prompts.id, suffix="rl",
        method={"type": "reinforcement", "reinforcement": {"grader": grader, "hyperparameters": {
            "batch_size": 2, "compute_multiplier": 0.5, "reasoning_effort": "low"}}})
    assert job.method.type == "reinforcement" and job.method.reinforcement.grader.type == "multi"
    assert job.method.reinforcement.hyperparameters.compute_multiplier == 0.5 and job.hyperparameters.batch_size == 2
    cfg = TrainConfig.from_yaml((server.home / "runs" / job.id.removeprefix("ftjob-") / "config.yaml").read_text())
    assert cfg.method == "grpo" and cfg.method_settings.num_generations == 2 and cfg.batch_size == 4
    assert cfg.method_settings.rewards == [
        {"type": "answer_match", "column": "reference_answer", "mode": "exact", "extract": "whole", "weight": 0.8,
         "name": "sum"},
        {"type": "format", "pattern": r"\s*I\ don't\ know\s*", "weight": -0.2, "name": "short"}]
    assert finished(ana, job.id).status == "succeeded"
    events = ana.fine_tuning.jobs.list_events(job.id, limit=100).data
    assert [e.message for e in events[-2:]] == [  # oldest last: the note follows the creation
        "reasoning_effort 'low' is ignored: the studio's models have no reasoning-effort setting; each completion is "
        "up to grpo.max_completion_length tokens (studio.grpo)", f"Created fine-tuning job: {job.id}"]
    assert events[-2].level == "warn"
    with pytest.raises(openai.BadRequestError) as caught:
        ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=prompts.id, method={
            "type": "reinforcement", "reinforcement": {"grader": {"type": "python", "source": "def grade(s, i): 1"}}})
    assert error_of(caught)["param"] == "method.reinforcement.grader.type"
    assert error_of(caught)["code"] == "unsupported" and "your own code" in error_of(caught)["message"]


def test_a_job_continues_a_fine_tuned_model(server, ana, chat_file):
    first = finished(ana, ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=chat_file.id,
                                                      suffix="one", extra_body={"studio": {"lora_r": 4}}).id)
    job = ana.fine_tuning.jobs.create(model=first.fine_tuned_model, training_file=chat_file.id, suffix="two")
    first_run = server.home / "runs" / first.id.removeprefix("ftjob-")
    cfg = TrainConfig.from_yaml((server.home / "runs" / job.id.removeprefix("ftjob-") / "config.yaml").read_text())
    assert (cfg.model_name, cfg.init_adapter, cfg.lora_r) == ("bundled:SmolLM2-135M-Instruct",
                                                              str(first_run / "adapter"), 4)
    job = finished(ana, job.id)
    assert job.status == "succeeded" and job.model == first.fine_tuned_model
    assert job.fine_tuned_model == f"ft:smollm2-135m-instruct:two:{job.id}"  # named after the first base
    full = finished(ana, ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=chat_file.id,
                                                     extra_body={"studio": {"adapter": "full"}}).id)
    job = ana.fine_tuning.jobs.create(model=full.fine_tuned_model, training_file=chat_file.id)  # new LoRA on it
    cfg = TrainConfig.from_yaml((server.home / "runs" / job.id.removeprefix("ftjob-") / "config.yaml").read_text())
    full_run = server.home / "runs" / full.id.removeprefix("ftjob-")
    assert (cfg.model_name, cfg.init_adapter, cfg.adapter) == (str(full_run / "model"), "", "lora")
    assert finished(ana, job.id).fine_tuned_model == f"ft:smollm2-135m-instruct::{job.id}"
    for name in (first.fine_tuned_model,  # not his
                 f"ft:smollm2-135m-instruct:one:ftjob-{'0' * 8}", f"{first.fine_tuned_model}:ckpt-step-9"):
        with pytest.raises(openai.NotFoundError) as caught:
            server.client("bob").fine_tuning.jobs.create(model=name, training_file=chat_file.id)
        assert error_of(caught)["param"] == "model" and error_of(caught)["code"] == "model_not_found"


@pytest.fixture
def held(server):
    """Jobs started now pause after step 2 until the returned marker exists (the test acts mid-run, without racing)."""
    marker = server.home.parent / "go"
    marker.unlink()
    yield marker
    marker.touch()


def at_step(client: openai.OpenAI, job_id: str, step: int) -> None:
    wait_until(lambda: any(e.type == "metrics" and e.data["step"] == step
                           for e in client.fine_tuning.jobs.list_events(job_id, limit=100).data),
               timeout=60, what=f"step {step}")


def test_cancel_mid_run(server, ana, chat_file, held):
    job = ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=chat_file.id)
    at_step(ana, job.id, 2)
    bob = server.client("bob")  # another operator: not his job
    with pytest.raises(openai.PermissionDeniedError) as caught:
        bob.fine_tuning.jobs.cancel(job.id)
    assert "belongs to ana" in error_of(caught)["message"]
    assert ana.fine_tuning.jobs.cancel(job.id).status == "running"  # asked; the worker ends at its next step
    held.touch()
    job = finished(ana, job.id)
    assert job.status == "cancelled" and job.fine_tuned_model is None
    events = ana.fine_tuning.jobs.list_events(job.id, limit=100).data
    assert "cancel requested by ana" in [e.message for e in events]
    assert max(e.data["step"] for e in events if e.type == "metrics") == 2
    with pytest.raises(openai.BadRequestError) as caught:
        ana.fine_tuning.jobs.cancel(job.id)
    assert error_of(caught)["message"].startswith(f"Job {job.id} is already cancelled")
    with pytest.raises(openai.NotFoundError) as caught:
        ana.chat.completions.create(model=f"ft:smollm2-135m-instruct::{job.id}", messages=[])
    assert error_of(caught)["param"] == "model"
    with pytest.raises(openai.BadRequestError) as caught:  # a cancelled job has no model to go on from
        ana.fine_tuning.jobs.create(model=f"ft:smollm2-135m-instruct::{job.id}", training_file=chat_file.id)
    assert error_of(caught)["param"] == "model" and error_of(caught)["code"] == "model_not_ready"
    assert f"its job {job.id} is cancelled, not succeeded" in error_of(caught)["message"]


def test_pause_and_resume_continue_one_job(server, ana, chat_file, held):
    job = ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=chat_file.id)
    at_step(ana, job.id, 2)
    ana.fine_tuning.jobs.pause(job.id)
    held.touch()
    assert finished(ana, job.id).status == "paused"
    # the fake reports its checkpoint without writing one: the folder the real worker saves, for resume to find
    first_run = server.home / "runs" / job.id.removeprefix("ftjob-")
    (first_run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (first_run / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    [checkpoint] = ana.fine_tuning.jobs.checkpoints.list(job.id).data
    assert checkpoint.step_number == 2 and checkpoint.metrics.train_loss == 1.0
    assert checkpoint.fine_tuned_model_checkpoint == f"ft:smollm2-135m-instruct::{job.id}:ckpt-step-2"
    with pytest.raises(openai.BadRequestError):
        ana.fine_tuning.jobs.pause(job.id)
    resumed = ana.fine_tuning.jobs.resume(job.id)
    assert resumed.id == job.id and resumed.status in ("queued", "running")
    job = finished(ana, job.id)
    assert job.status == "succeeded"
    messages = [e.message for e in ana.fine_tuning.jobs.list_events(job.id, limit=100).data]
    assert "stop requested by ana" in messages and any(m.startswith("resumed from run") for m in messages)


def test_a_viewer_reads_but_cannot_create(server, ana, chat_file):
    vera = server.client("vera", Role.VIEWER)
    with pytest.raises(openai.PermissionDeniedError):
        vera.files.create(file=("t.jsonl", jsonl(CHAT)), purpose="fine-tune")
    with pytest.raises(openai.PermissionDeniedError) as caught:
        vera.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=chat_file.id)
    assert error_of(caught)["type"] == "permission_error" and "viewer" in error_of(caught)["message"]
    assert chat_file.id in [f.id for f in vera.files.list().data]
    assert [j.id for j in vera.fine_tuning.jobs.list().data] == [j.id for j in ana.fine_tuning.jobs.list().data]
    with pytest.raises(openai.PermissionDeniedError):
        vera.files.delete(chat_file.id)
    assert "vera POST /v1/fine_tuning/jobs -> 403" in server.log_text()
    no_key = httpx.get(f"{server.url}/fine_tuning/jobs")
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "missing_api_key"
    bad_key = openai.OpenAI(base_url=server.url, api_key="fts_nope_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.fine_tuning.jobs.list()
    token = server.token("vera", Role.VIEWER)
    revoked = openai.OpenAI(base_url=server.url, api_key=token, max_retries=0)
    assert revoked.files.list().data  # verified once, then known to the server by its hash ...
    assert users.revoke_token(server.store, "vera", users.token_id_of(token))
    with pytest.raises(openai.AuthenticationError):  # ... which never outlives the token
        revoked.files.list()


@pytest.mark.parametrize("name, content, line, fix", [
    ("bad.jsonl", jsonl(CHAT[:2]) + b"{\"messages\": [}\n", 3, "is not valid JSON"),
    ("bad.jsonl", jsonl(CHAT[:1]) + b"\n" + jsonl([{"messages": [{"role": "wizard", "content": "x"}]}]), 3,
     "unsupported role"),
    ("bad.jsonl", jsonl(PAIRS[:1]) + jsonl([{**PAIRS[0], "preferred_output": []}]), 2,
     "preferred_output must be a non-empty list"),
])
def test_a_bad_file_is_refused_naming_the_line(ana, name, content, line, fix):
    with pytest.raises(openai.BadRequestError) as caught:
        ana.files.create(file=(name, content), purpose="fine-tune")
    error = error_of(caught)
    assert error["param"] == "file" and error["code"] == "invalid_file_format"
    assert error["message"].startswith(f"{name}: line {line}") and fix in error["message"]


def test_bad_input_gets_openai_errors_naming_the_parameter(server, ana, chat_file):
    def refused(kind, call) -> dict:
        with pytest.raises(kind) as caught:
            call()
        return error_of(caught)

    create = ana.fine_tuning.jobs.create
    error = refused(openai.NotFoundError, lambda: create(model="gpt-4o-mini", training_file=chat_file.id))
    assert error["param"] == "model" and error["code"] == "model_not_found"
    assert refused(openai.BadRequestError, lambda: ana.files.create(file=("t.jsonl", jsonl(CHAT)),
                                                                    purpose="assistants"))["param"] == "purpose"
    error = refused(openai.BadRequestError, lambda: ana.files.create(file=("t.csv", b"a,b\n1,2\n"), purpose="fine-tune"))
    assert error["param"] == "file" and "not a .jsonl file" in error["message"]
    for hyper, param in (({"n_epochs": 0}, "n_epochs"), ({"batch_size": 1000}, "batch_size"),
                         ({"learning_rate_multiplier": -1}, "learning_rate_multiplier"),
                         ({"n_epochs": "many"}, "n_epochs")):
        error = refused(openai.BadRequestError, lambda: create(model="SmolLM2-135M-Instruct",
                                                               training_file=chat_file.id, hyperparameters=hyper))
        assert error["param"] == f"hyperparameters.{param}", error
    pairs = ana.files.create(file=("pairs.jsonl", jsonl(PAIRS)), purpose="fine-tune")
    error = refused(openai.BadRequestError, lambda: create(
        model="SmolLM2-135M-Instruct", training_file=pairs.id,
        method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 5}}}))
    assert error["param"] == "method.dpo.hyperparameters.beta"
    error = refused(openai.BadRequestError, lambda: create(
        model="SmolLM2-135M-Instruct", training_file=chat_file.id, method={"type": "dpo"}))
    assert error["param"] == "training_file" and "holds supervised (chat or text rows)" in error["message"]
    assert refused(openai.NotFoundError, lambda: create(model="SmolLM2-135M-Instruct",
                                                        training_file="file-000000000000000000000000"))["param"] \
        == "training_file"
    error = refused(openai.BadRequestError, lambda: create(model="SmolLM2-135M-Instruct", training_file=chat_file.id,
                                                           method={"type": "reinforcement"}))
    assert error["param"] == "method.reinforcement.grader" and "grader is required" in error["message"]
    error = refused(openai.BadRequestError, lambda: create(model="SmolLM2-135M-Instruct", training_file=chat_file.id,
                                                           extra_body={"studio": {"lora_r": -3}}))
    assert error["param"] == "studio.lora_r"
    error = refused(openai.BadRequestError, lambda: create(model="SmolLM2-135M-Instruct", training_file=chat_file.id,
                                                           extra_body={"temperature": 1}))
    assert error["param"] == "temperature" and error["message"] == "Unrecognized request argument supplied: temperature"
    assert refused(openai.NotFoundError, lambda: ana.fine_tuning.jobs.retrieve("ftjob-nope"))["param"] \
        == "fine_tuning_job_id"
    unknown = httpx.post(f"{server.url}/batches", headers={"Authorization": f"Bearer {server.token('ana', Role.OPERATOR)}"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"


def test_a_restarted_server_keeps_the_job_and_its_events(tmp_path):
    marker = tmp_path / "go"
    api = ApiServer(tmp_path / "home", tmp_path, fake={"FAKE_PAUSE_AT": "2", "FAKE_PAUSE_UNTIL": str(marker)})
    try:
        api.start()
        ana = api.client("ana")
        file = ana.files.create(file=("t.jsonl", jsonl(CHAT)), purpose="fine-tune")
        job = ana.fine_tuning.jobs.create(model="SmolLM2-135M-Instruct", training_file=file.id, suffix="kept")
        at_step(ana, job.id, 2)
        before = ana.fine_tuning.jobs.list_events(job.id, limit=100).data
        api.kill()  # SIGKILL: no shutdown at all; the worker runs in a session of its own and goes on
        api.start()
        assert ana.fine_tuning.jobs.retrieve(job.id).status == "running"
        assert [e.id for e in ana.fine_tuning.jobs.list_events(job.id, limit=100).data] == [e.id for e in before]
        assert ana.files.retrieve(file.id).filename == "t.jsonl"
        marker.touch()
        job = finished(ana, job.id)
        assert job.status == "succeeded" and job.fine_tuned_model == f"ft:smollm2-135m-instruct:kept:{job.id}"
        steps = [e.data["step"] for e in ana.fine_tuning.jobs.list_events(job.id, limit=100).data if e.type == "metrics"]
        assert steps == [5, 4, 3, 2, 1]
    finally:
        marker.touch()
        api.kill()
