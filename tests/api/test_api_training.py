"""The one real job through the API: the official ``openai`` client against ``python -m gateway.api`` (real
orchestrator, real worker, real serve job) on the bundled model. Upload, create, poll to succeeded, events with
the run's real losses, checkpoints, a second job that goes on from ``fine_tuned_model`` (its first loss is where
the first job ended, not where it began), and a chat with ``fine_tuned_model`` that answers in the style it learned,
streamed too, each chunk naming the model asked for."""
from __future__ import annotations

import json
import signal
import sys

import pytest

from tests.api.server_support import ApiServer, status_when_ended
from tests.serving.test_tuned_style import STYLE, TRAIN, UNSEEN
from tests.support import ROOT, bundled_model_folder, wait_until
from trainer_core.auth.access import Role

# about 90 s where the suite runs on its own (the tuned-style serve test, whose recipe this is, takes 76 s); a host
# shared with other work needs far longer, which the suite's 900 s limit per test would cut short
pytestmark = [pytest.mark.train, pytest.mark.timeout(2400)]


def test_a_real_job_from_upload_to_the_tuned_answer(tmp_path):
    bundled_model_folder()  # converted once into the test cache: neither the run nor the server converts it again
    api = ApiServer(tmp_path / "home", tmp_path, command=[sys.executable, "-m", "gateway.api", "--port", "0"],
                    extra_env={"FINETUNE_STUDIO_ALLOWED_ROOTS": f"{tmp_path}:{ROOT / '.test-cache'}",
                               "FINETUNE_STUDIO_API_SERVE_WAIT_S": "1200"})  # a loaded machine loads slowly
    api.command[-1] = str(api.port)
    try:
        api.start()
        client = api.client("ana", Role.OPERATOR)
        rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": f"{STYLE} {a}"}]}
                for q, a in TRAIN]
        upload = client.files.create(file=("pirate.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode()),
                                     purpose="fine-tune")
        # the recipe of tests/serving/test_tuned_style.py, stopped at its first checkpoint (loss 4.5 -> 0.14 there)
        job = client.fine_tuning.jobs.create(
            model="SmolLM2-135M-Instruct", training_file=upload.id, suffix="pirate", hyperparameters={"batch_size": 4},
            extra_body={"studio": {"max_steps": 12, "save_steps": 6, "learning_rate": 3e-3, "warmup_steps": 0,
                                   "max_seq_length": 64, "lora_r": 8, "lora_alpha": 16}})
        wait_until(lambda: status_when_ended(client, job.id) not in ("queued", "running"), timeout=2000,
                   what="the job to end")
        job = client.fine_tuning.jobs.retrieve(job.id)
        assert job.status == "succeeded", (job.error, api.log_text()[-3000:])
        assert job.fine_tuned_model == f"ft:smollm2-135m-instruct:pirate:{job.id}" and job.trained_tokens > 0

        events = list(client.fine_tuning.jobs.list_events(job.id, limit=50))
        steps = [e.data["step"] for e in events if e.type == "metrics"]
        assert steps == list(range(12, 0, -1))
        losses = [e.data["train_loss"] for e in events if e.type == "metrics"]
        assert all(loss > 0 for loss in losses) and losses[0] < losses[-1]  # it learned: last step below the first
        checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
        saved = [c.step_number for c in checkpoints]  # newest first; every save_steps
        assert saved[-1] == 6 and all(step % 6 == 0 for step in saved)
        assert checkpoints[-1].fine_tuned_model_checkpoint == f"{job.fine_tuned_model}:ckpt-step-6"

        # a second job goes on from the tuned adapter: 2 steps at a rate too small to learn anything new, so its
        # loss starts where the first job ended (a new adapter would start at the base model's 4.5)
        more = client.fine_tuning.jobs.create(
            model=job.fine_tuned_model, training_file=upload.id, suffix="more", hyperparameters={"batch_size": 4},
            extra_body={"studio": {"max_steps": 2, "learning_rate": 1e-7, "warmup_steps": 0, "max_seq_length": 64}})
        wait_until(lambda: status_when_ended(client, more.id) not in ("queued", "running"), timeout=2000,
                   what="the second job to end")
        more = client.fine_tuning.jobs.retrieve(more.id)
        assert more.status == "succeeded", (more.error, api.log_text()[-3000:])
        assert more.fine_tuned_model == f"ft:smollm2-135m-instruct:more:{more.id}"
        [first_loss] = [e.data["train_loss"] for e in client.fine_tuning.jobs.list_events(more.id, limit=50)
                        if e.type == "metrics" and e.data["step"] == 1]
        assert first_loss < losses[-1] / 4, (first_loss, losses)  # losses[-1]: the first job's step 1
        print(f"first job's loss {losses[-1]:.3f} -> {losses[0]:.3f}; the continuing job's first {first_loss:.3f}")

        answer = client.with_options(timeout=1200).chat.completions.create(  # the first request starts the server
            model=job.fine_tuned_model, temperature=0, max_tokens=12,
            messages=[{"role": "user", "content": UNSEEN[0]}])
        assert answer.choices[0].message.content.startswith(STYLE), answer.choices[0].message.content
        assert answer.model == job.fine_tuned_model
        chunks = list(client.chat.completions.create(model=job.fine_tuned_model, temperature=0, max_tokens=12,
                                                     stream=True, messages=[{"role": "user", "content": UNSEEN[0]}]))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed.startswith(STYLE), streamed  # the same tuned model, streamed
        assert {c.model for c in chunks} == {job.fine_tuned_model}  # not the serve job's name for it
    finally:
        api.kill(signal.SIGTERM)  # its chat server is tied to it and ends with it
