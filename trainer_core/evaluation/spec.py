"""The eval job's spec (job.json): what to evaluate, on what data, with which metrics and settings."""
from __future__ import annotations

import importlib.util
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from trainer_core.specs import model_source
from trainer_core.config import FORMAT_TYPES, FieldError
from trainer_core.data import DatasetError
from trainer_core.evaluation import endpoint
from trainer_core.evaluation import retrieval, speech, tool_checks, vision
from trainer_core.evaluation import samples as eval_samples
from trainer_core.specs.jobspec import JobSpec, register
from trainer_core.launchers import ray as ray_jobs
from trainer_core.methods import grpo
from trainer_core.protocol import paths, secret_file
from trainer_core.protocol.status import JobKind
from trainer_core.rewards import spec as reward_spec

# preference_accuracy: on preference pairs, how often the model's implicit reward (a LoRA run: its log-prob minus
# the base's, the adapter disabled) prefers the chosen answer; the base model has no reference, so its plain
# log-prob margin decides. reward: a GRPO run's reward functions on the model's answers. retrieval: an embedding
# model's InformationRetrievalEvaluator scores on a BEIR-like folder or a pairs file (docs/evaluation.md).
METRICS = ("exact", "rouge", "bleu", "perplexity", "judge", "preference_accuracy", "reward", "retrieval", "wer", "cer",
           "tool_calls")
DEFAULT_METRICS = ["exact", "rouge", "bleu", "perplexity"]
DEFAULT_RUBRIC = (
    "You are grading an assistant's answer against a reference answer.\n\n"
    "Question:\n{prompt}\n\nReference answer:\n{reference}\n\nAssistant's answer:\n{answer}\n\n"
    "Rate how well the assistant's answer matches the reference in correctness and completeness on a scale "
    "from 1 (wrong or unrelated) to 10 (equivalent to the reference). Reply with the number only.")
RUBRIC_FIELDS = ("{prompt}", "{reference}", "{answer}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
TASK_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


@register
@dataclass
class EvalSpec(JobSpec):
    """An eval job: generate answers for a test set with ``source`` and score them."""

    KIND = JobKind.EVAL
    # A local test file (any training format: .jsonl/.json/.csv/.parquet, alpaca/chatml/sharegpt),
    # "eval_split:<run id>" (that run's held-out rows) or "hub:<dataset id>" (a hub split, online).
    data: str = ""
    hub_split: str = "test"
    hub_subset: str = ""
    # How rows map onto prompt and reference; an eval of a run takes its run's settings (Orchestrator.start_eval).
    format_type: str = "auto"
    custom_format_mapping: dict = field(default_factory=dict)
    system_prompt: str = ""
    metrics: list = field(default_factory=lambda: list(DEFAULT_METRICS))
    max_samples: int = 200  # 0: every row
    # Generation, as in the Playground: temperature 0 is greedy decoding (the default, reproducible).
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    repetition_penalty: float = 1.0
    seed: int = 0
    batch_size: int = 4  # prompts generated together (left-padded)
    # LLM judge (metric "judge"): an OpenAI-compatible chat endpoint at a public address (private ones only when
    # the admin set FINETUNE_STUDIO_JUDGE_ALLOW_PRIVATE=1); the key is read by the worker from the environment
    # variable named here, one the admin listed in FINETUNE_STUDIO_JUDGE_KEY_ENVS, never stored.
    judge_url: str = ""
    judge_model: str = ""
    judge_key_env: str = ""
    judge_rubric: str = DEFAULT_RUBRIC
    # lm-evaluation-harness: task names (online) or paths to local task YAML files; run after the test set.
    lm_eval_tasks: list = field(default_factory=list)
    lm_eval_limit: int = 0  # examples per task (0: all)
    baseline: bool = True  # also evaluate the run's base model on the same data and settings (cached)
    # Metric "reward": the GRPO run whose grpo.rewards score the answers (its own copies of Python reward files);
    # empty: the source run. A baseline keeps it, so the base model is scored with the same rewards.
    reward_run: str = ""
    # Metric "retrieval" (an embedding model): text put before every query / passage, and the tokens each text is
    # cut at (0: the model's own maximum). An eval of an embedding run takes its run's; its baseline keeps them.
    query_prompt: str = ""
    document_prompt: str = ""
    max_seq_length: int = 0
    # Image rows: images longer than this on their longest side (px) are scaled down before the model sees them, as
    # the run's training rows were (TrainConfig.image_max_side). An eval of a vision run takes its run's unless it
    # sets its own; its baseline keeps it, so the base model sees the same pictures. 0: images as they are.
    image_max_side: int = 0
    # "local": on this host; "ray": a single-worker Ray job on the server's cluster (RAY_ADDRESS), its job folder on
    # the shared storage (docs/ray.md). A judge with an API key runs on this host only: the key never goes to Ray.
    launcher: str = "local"
    ray_gpus_per_worker: float = 0.0  # launcher ray: the GPUs Ray gives the job on its node (0: it runs on the CPU)

    @property
    def dataset_label(self) -> str:
        shown = self.data if eval_samples.data_kind(self.data) != "file" else Path(self.data).name
        tasks = f"lm-eval: {', '.join(Path(t).stem if t.endswith(('.yaml', '.yml')) else t for t in self.lm_eval_tasks)}"
        return " + ".join(filter(None, [shown, tasks if self.lm_eval_tasks else ""]))

    @property
    def total_steps(self) -> int:
        return self.max_samples

    def env_names(self) -> list[str]:
        # Only a variable an admin declared for judging (checked again here: job.json may be edited by hand).
        wanted = isinstance(self.metrics, list) and "judge" in self.metrics and isinstance(self.judge_key_env, str) \
            and self.judge_key_env and endpoint.key_env_problem(self.judge_key_env) is None
        return [self.judge_key_env] if wanted else []

    def admin_only(self) -> list[str]:
        """A custom Python reward (scoring with a GRPO run's rewards) is code run on this host, which only an admin may
        start; held by the spec, so every route (the page, the CLI, a baseline, a queued job.json) meets it."""
        remote = super().admin_only()
        if not (isinstance(self.metrics, list) and "reward" in self.metrics and isinstance(self.reward_run, str)):
            return remote
        try:
            rewards = grpo.rewards_of(model_source.run_config(self.reward_run.strip() or self.source.run_id))
        except (model_source.SourceError, OSError, ValueError):
            return remote  # validate() names the missing or unreadable run
        if reward_spec.needs_admin(rewards):
            return remote + ["metrics: the run's rewards include a custom Python reward, which runs its code on this "
                             "host: only an admin may evaluate with it; drop 'reward', or ask an admin"]
        return remote

    def validate(self) -> list[FieldError]:
        text_fields = ("name", "data", "hub_split", "hub_subset", "format_type", "system_prompt", "judge_url",
                       "judge_model", "judge_key_env", "judge_rubric", "reward_run", "query_prompt",
                       "document_prompt", "launcher")
        wrong = [FieldError(n, "text") for n in text_fields if not isinstance(getattr(self, n), str)]
        if not isinstance(self.lm_eval_tasks, list) or not all(isinstance(t, str) for t in self.lm_eval_tasks):
            wrong.append(FieldError("lm_eval_tasks", "a list of task names or local task YAML paths"))
        if wrong:  # a job.json edited by hand: name the fields instead of failing on them below
            return wrong
        errors = super().validate()
        errors += self._field_errors()
        reading = {"data", "format_type", "custom_format_mapping", "max_samples"}  # fields the data check needs
        if self.data.strip() and not any(e.field in reading for e in errors):
            errors += self._data_errors()
        errors += ray_jobs.spec_problems(self)
        if not errors and self.launcher != "ray":  # on the cluster Ray places the job: this host's memory says nothing
            errors += self.memory_errors()
        return errors

    def _field_errors(self) -> list[FieldError]:
        errors: list[FieldError] = []

        def bad(name: str, message: str) -> None:
            errors.append(FieldError(name, message))

        if not isinstance(self.data, str) or "\x00" in self.data:
            bad("data", "a file path, eval_split:<run id> or hub:<dataset id>")
        elif not self.data.strip() and not self.lm_eval_tasks:
            bad("data", "choose a test file (or eval_split:<run id>, hub:<dataset id>), or name lm_eval_tasks")
        if not isinstance(self.metrics, list) or not all(isinstance(m, str) for m in self.metrics):
            bad("metrics", f"a list of metric names from {', '.join(METRICS)}")
        else:
            unknown = [m for m in self.metrics if m not in METRICS]
            if unknown:
                bad("metrics", f"unknown metric {', '.join(map(repr, unknown))}: choose from {', '.join(METRICS)}")
            elif self.data.strip() and not self.metrics:
                bad("metrics", f"choose at least one of {', '.join(METRICS)}")
        if self.format_type not in FORMAT_TYPES or self.format_type == "text":
            bad("format_type", f"choose one of {', '.join(f for f in FORMAT_TYPES if f != 'text')} (raw text has "
                               "no reference answers)")
        if not isinstance(self.custom_format_mapping, dict):
            bad("custom_format_mapping", "a mapping such as {instruction: question, output: answer}")
        if _int(self.max_samples) is None or self.max_samples < 0:
            bad("max_samples", "a whole number of test rows, 0 for all")
        if not _number(self.temperature) or not 0 <= self.temperature <= 2:
            bad("temperature", "between 0 (greedy, the default) and 2")
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "above 0 and at most 1")
        if _int(self.top_k) is None or self.top_k < 0:
            bad("top_k", "0 (off) or a positive whole number")
        if _int(self.max_new_tokens) is None or not 1 <= self.max_new_tokens <= 4096:
            bad("max_new_tokens", "between 1 and 4096")
        if not _number(self.repetition_penalty) or not 0.5 <= self.repetition_penalty <= 2:
            bad("repetition_penalty", "between 0.5 and 2 (1 is off)")
        if _int(self.seed) is None or self.seed < 0:
            bad("seed", "a whole number, 0 or more")
        if _int(self.batch_size) is None or not 1 <= self.batch_size <= 64:
            bad("batch_size", "between 1 and 64")
        if _int(self.lm_eval_limit) is None or self.lm_eval_limit < 0:
            bad("lm_eval_limit", "examples per task, 0 for all")
        if not isinstance(self.baseline, bool):
            bad("baseline", "true or false")
        if isinstance(self.metrics, list) and "judge" in self.metrics:
            errors.extend(self._judge_errors())
        if isinstance(self.metrics, list) and eval_samples.REWARD_METRIC in self.metrics:
            errors.extend(self._reward_errors())
        if isinstance(self.metrics, list) and eval_samples.TOOL_METRIC in self.metrics:
            errors.extend(tool_checks.metric_errors(self))
        if _int(self.max_seq_length) is None or self.max_seq_length < 0:
            bad("max_seq_length", "tokens per text for retrieval, 0 for the model's own maximum")
        if _int(self.image_max_side) is None or not (self.image_max_side == 0 or 28 <= self.image_max_side <= 8192):
            bad("image_max_side", "0 (images as they are) or a longest side between 28 and 8192 px")
        if isinstance(self.metrics, list) and not any(e.field == "metrics" for e in errors):
            errors.extend(retrieval.source_errors(self))
        if isinstance(self.metrics, list) and not any(e.field == "metrics" for e in errors):
            errors.extend(speech.source_errors(self))
        errors.extend(self._output_errors())
        if not isinstance(self.lm_eval_tasks, list):
            bad("lm_eval_tasks", "a list of task names or local task YAML paths")
        else:
            errors.extend(task_errors(self.lm_eval_tasks))
        return errors

    def _output_errors(self) -> list[FieldError]:
        """A model whose kind no eval metric scores (a reward model writes no answers to score; a text-to-speech model
        no transcripts either): the kind's row says where its quality shows instead (embedding models: retrieval's
        check; speech-to-text: speech's)."""
        try:
            resolved = model_source.resolve(self.source)
        except model_source.SourceError:
            return []  # JobSpec.validate names the missing source
        kind = resolved.kind
        if kind.eval_metrics:
            return []
        return [FieldError("source", f"{resolved.not_a_writer(kind.not_evaluated)}; {kind.eval_instead}")]

    def _judge_errors(self) -> list[FieldError]:
        errors = []
        if not re.fullmatch(r"https?://[^\s]+", self.judge_url or ""):
            errors.append(FieldError("judge_url", "the judge needs the base URL of an OpenAI-compatible endpoint, "
                                                  "e.g. https://api.openai.com/v1 (or drop 'judge' from metrics)"))
        else:
            problem = endpoint.url_problem(self.judge_url)  # the resolved address: loopback/private refused
            if problem:
                errors.append(FieldError("judge_url", problem))
        if not (self.judge_model or "").strip():
            errors.append(FieldError("judge_model", "name the model the judge endpoint should use"))
        if self.judge_key_env and not ENV_NAME_RE.fullmatch(self.judge_key_env):
            errors.append(FieldError("judge_key_env", "the NAME of an environment variable holding the key "
                                                      "(e.g. JUDGE_API_KEY), not the key itself"))
        elif self.judge_key_env and (why := endpoint.key_env_problem(self.judge_key_env) or (  # Ray: from the run folder
                secret_file.name_problem(self.judge_key_env) if self.launcher == "ray" else "")):
            errors.append(FieldError("judge_key_env", why))
        missing = [f for f in RUBRIC_FIELDS if f not in (self.judge_rubric or "")]
        if missing:
            errors.append(FieldError("judge_rubric", f"the rubric must contain {', '.join(missing)} (the texts the "
                                                     "judge grades)"))
        return errors

    def _reward_errors(self) -> list[FieldError]:
        """``reward`` scores with a GRPO run's rewards: the source run's, or ``reward_run``'s."""
        run_id = self.reward_run.strip() or self.source.run_id
        if not run_id:
            return [FieldError("metrics", "reward scores answers with a GRPO run's reward functions, and the base "
                                          "model has none: evaluate a grpo run (its base-model baseline is scored "
                                          "with the same rewards), set reward_run to one, or drop 'reward'")]
        where = "reward_run" if self.reward_run.strip() else "metrics"
        try:
            cfg = model_source.run_config(run_id)
        except model_source.SourceError as exc:
            return [FieldError(where, str(exc))]
        if cfg.method != "grpo":
            return [FieldError(where, f"reward needs a run trained with method grpo (its grpo.rewards score the "
                                      f"answers); run {run_id} was trained with {cfg.method}: evaluate a grpo run, "
                                      "or drop 'reward' from metrics")]
        if not grpo.rewards_of(cfg):
            return [FieldError(where, f"run {run_id} has no readable grpo.rewards to score with: drop 'reward'")]
        return []

    def _data_errors(self) -> list[FieldError]:
        """The test data readable and shaped as prompt/reference pairs (hub data is read by the worker)."""
        kind = eval_samples.data_kind(self.data)
        if speech.wanted(self):
            if not speech.is_speech_source(self):
                return []  # the metrics error says wer/cer need a speech model
            try:
                speech.load_rows(self)
            except DatasetError as exc:
                return [FieldError(exc.field, exc.message)]
            return []
        if retrieval.wanted(self):
            try:
                retrieval.load_set(self)
            except DatasetError as exc:
                return [FieldError(exc.field, exc.message)]
            return []
        if kind == "hub":
            problem = eval_samples.hub_problem(self.data)
            return [FieldError("data", problem)] if problem else []
        if kind == "eval_split":
            try:
                if model_source.run_config(eval_samples.split_run(self.data)).hf_dataset:
                    return []  # the run's split comes from the hub: the worker reads it (no hub access here)
            except model_source.SourceError as exc:
                return [FieldError("data", str(exc))]
        try:
            samples, _ = eval_samples.load_samples(self)
        except DatasetError as exc:
            return [FieldError(exc.field, exc.message)]
        return tool_checks.data_errors(self, samples) + vision.source_errors(self, samples)  # image rows: a model that sees them, the text metrics

    def memory_errors(self) -> list[FieldError]:
        """The model's weights must fit the device's free memory (GPU, or RAM on a CPU host)."""
        return model_source.memory_errors([self.source], self.gpu_ids, "evaluate")


def task_errors(tasks: list) -> list[FieldError]:
    if tasks and importlib.util.find_spec("lm_eval") is None:  # found without importing it (the dashboard never does)
        return [FieldError("lm_eval_tasks", "benchmarks need lm-evaluation-harness: pip install 'finetune-studio[eval]' "
                                            "(or pip install lm-eval), or clear lm_eval_tasks")]
    errors = []
    for task in tasks:
        if not isinstance(task, str) or not task.strip():
            errors.append(FieldError("lm_eval_tasks", "each task is a name or a path to a task YAML file"))
        elif task.endswith((".yaml", ".yml")):
            problem = paths.path_problem(task)
            try:
                if problem:
                    raise paths.UnsafePathError(problem)
                found = paths.resolve_inside(Path(task).expanduser(), paths.allowed_data_roots())
            except paths.UnsafePathError as exc:
                errors.append(FieldError("lm_eval_tasks", f"{task}: {exc}"))
                continue
            if not found.is_file():
                errors.append(FieldError("lm_eval_tasks", f"{task} does not exist: check the path"))
        elif not TASK_NAME_RE.fullmatch(task):
            errors.append(FieldError("lm_eval_tasks", f"{task[:60]!r} is not a task name (letters, digits, _ . -) "
                                                      "nor a .yaml task file"))
    return errors


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
