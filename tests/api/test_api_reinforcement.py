"""The one real reinforcement job through the API: the official ``openai`` client against ``python -m gateway.api``
(real orchestrator, real GRPO worker) on the tiny test model, with the method contract's GRPO sizes (2 steps, 2
completions of 8 tokens per prompt). OpenAI's reinforcement rows and a multi grader go in; the job succeeds and its
metrics events carry the reward the graders' built-in rewards gave."""
from __future__ import annotations

import json
import math
import signal
import sys

import pytest

from tests.api.server_support import ApiServer, status_when_ended
from tests.support import ROOT, wait_until
from trainer_core.auth.access import Role
from trainer_core.config import TrainConfig

pytestmark = [pytest.mark.train, pytest.mark.timeout(1800)]  # a loaded host loads and steps slowly

ROWS = [{"messages": [{"role": "developer", "content": "Answer with one word."},
                      {"role": "user", "content": f"Which colour is {thing}?"}], "reference_answer": colour}
        for thing, colour in (("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"))]
CHECK = {"type": "string_check", "input": "{{sample.output_text}}"}
# exact answers (the tiny random model never writes one) and a letter it sometimes writes: a reward that varies
GRADER = {"type": "multi", "calculate_output": "0.5 * exact + 0.5 * letter",
          "graders": {"exact": {**CHECK, "reference": "{{item.reference_answer}}", "operation": "eq"},
                      "letter": {**CHECK, "reference": "x", "operation": "ilike"}}}


def test_a_reinforcement_job_trains_a_grpo_run_to_succeeded(tmp_path, tiny_model):
    api = ApiServer(tmp_path / "home", tmp_path, command=[sys.executable, "-m", "gateway.api", "--port", "0"],
                    extra_env={"FINETUNE_STUDIO_ALLOWED_ROOTS": f"{tmp_path}:{ROOT / '.test-cache'}"})
    api.command[-1] = str(api.port)
    try:
        api.start()
        client = api.client("ana", Role.OPERATOR)
        upload = client.files.create(file=("colours.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS).encode()),
                                     purpose="fine-tune")
        job = client.fine_tuning.jobs.create(
            model=str(tiny_model), training_file=upload.id, suffix="colours",
            method={"type": "reinforcement", "reinforcement": {"grader": GRADER, "hyperparameters": {
                "batch_size": 1, "compute_multiplier": 0.5}}},  # 1 prompt x 2 completions a step
            extra_body={"studio": {"max_steps": 2, "max_seq_length": 128, "warmup_steps": 0, "learning_rate": 1e-3,
                                   "grpo": {"max_completion_length": 8, "max_prompt_length": 96,
                                            "sample_every": 0}}})
        wait_until(lambda: status_when_ended(client, job.id) not in ("queued", "running"), timeout=1700,
                   what="the job to end")
        job = client.fine_tuning.jobs.retrieve(job.id)
        assert job.status == "succeeded", (job.error, api.log_text()[-3000:])
        assert job.fine_tuned_model == f"ft:{tiny_model.name}:colours:{job.id}"
        cfg = TrainConfig.from_yaml((api.home / "runs" / job.id.removeprefix("ftjob-") / "config.yaml").read_text())
        assert (cfg.method, cfg.batch_size, cfg.method_settings.num_generations) == ("grpo", 2, 2)
        metrics = [e.data for e in client.fine_tuning.jobs.list_events(job.id, limit=50) if e.type == "metrics"]
        assert [m["step"] for m in metrics] == [2, 1]
        rewards = [m["train_reward_mean"] for m in metrics]
        assert all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in rewards), rewards
        print(f"reinforcement job {job.id}: reward per step (newest first) {rewards}")
    finally:
        api.kill(signal.SIGTERM)
