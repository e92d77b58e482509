"""SQLModel tables. Times are UNIX seconds (float) so SQLite and PostgreSQL agree without tz games."""
from __future__ import annotations

from typing import Optional

from sqlmodel import Field, SQLModel


class Run(SQLModel, table=True):
    id: str = Field(primary_key=True, max_length=64)
    name: str = ""
    status: str = Field(default="queued", index=True)
    phase: str = ""
    model: str = ""
    dataset: str = ""
    method: str = ""  # History's text for it, e.g. "LoRA", "Continued pretraining · Full fine-tuning"
    # A training run's method (sft, cpt, ...) and adapter (lora, qlora, full); "" for other kinds. Rows from
    # before the split are filled from their config_json's training_type when the columns are added.
    method_name: str = ""
    adapter: str = ""
    engine: str = ""
    created_at: float = Field(default=0.0, index=True)  # History lists newest first
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    steps_done: int = 0
    total_steps: int = 0
    epoch: Optional[float] = None
    last_loss: Optional[float] = None
    final_loss: Optional[float] = None
    best_eval_loss: Optional[float] = None
    tokens_seen: Optional[int] = None
    output_dir: str = ""
    config_json: str = "{}"
    error: str = ""
    log_tail: str = ""
    pid: Optional[int] = None
    pid_started_at: Optional[float] = None
    heartbeat_at: Optional[float] = None
    event_offset: int = 0
    # The queue: queued runs start in ascending queue_position once their devices are free.
    queue_position: Optional[float] = None
    devices: str = ""  # "cpu", "gpu*" (all visible GPUs) or "gpu0,gpu1": runs whose sets overlap never run together
    # Resume: the run this one continues, the step it continues from, and the training data it was started on.
    parent_run_id: Optional[str] = Field(default=None, max_length=64, index=True)
    resumed_from_step: Optional[int] = None
    data_fingerprint: str = ""
    needs_secrets: str = ""  # names of secret fields the run was started with (their values are never stored)
    # History's loss sparkline: JSON list of up to 60 train losses, kept current by the pump while the run
    # is active. NULL (runs recorded before the column existed) is computed from the metrics once.
    sparkline: Optional[str] = None
    secrets_holder: str = ""  # "host:pid:start:instance" of the orchestrator holding a queued run's secrets in memory
    owner: str = Field(default="", index=True)  # the user who started it (shared mode: the signed-in name)
    kind: str = "train"  # the job kind (trainer_core.protocol.status.JobKind); rows from before kinds are train
    # A sweep's trial (trainer_core/sweeps): the sweep's id and the Optuna trial number this run trains ("" / None:
    # not a trial). A trial stopped with its sweep and resumed later has several runs with the same number.
    sweep_id: str = Field(default="", index=True, max_length=64)
    sweep_trial: Optional[int] = None


class Metric(SQLModel, table=True):
    run_id: str = Field(primary_key=True, foreign_key="run.id", max_length=64)
    step: int = Field(primary_key=True)
    epoch: Optional[float] = None
    loss: Optional[float] = None
    eval_loss: Optional[float] = None
    learning_rate: Optional[float] = None
    grad_norm: Optional[float] = None
    tokens_seen: Optional[int] = None
    tokens_per_s: Optional[float] = None
    memory_mb: Optional[float] = None
    elapsed_s: Optional[float] = None
    wall_time: Optional[float] = None
    nonfinite: str = ""  # comma-separated field names whose value was NaN/inf (stored as NULL)


class MetricValue(SQLModel, table=True):
    """An open metric: any numeric key a run logs besides the wide columns of ``Metric`` (``rewards/chosen``,
    ``rewards/<function>/mean``, ``eval_runtime``...), one row per run, key and step; finite values only
    (a non-finite one is named in the step's ``Metric.nonfinite`` as ``metrics.<key>``). The key before the
    step: one key's series is one range of the primary key."""

    run_id: str = Field(primary_key=True, foreign_key="run.id", max_length=64)
    key: str = Field(primary_key=True, max_length=200)
    step: int = Field(primary_key=True)
    value: float = 0.0


class RunEvent(SQLModel, table=True):
    """Status changes, warnings, checkpoints and errors: the run's timeline."""

    id: Optional[int] = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="run.id", index=True, max_length=64)
    ts: float = 0.0
    kind: str = ""
    message: str = ""


class User(SQLModel, table=True):
    """A person who signed in (shared mode) or was added by an admin. Roles: viewer, operator, admin."""

    name: str = Field(primary_key=True, max_length=200)
    role: str = "viewer"
    created_at: float = 0.0
    last_seen_at: Optional[float] = None
    # Signed into every session cookie; raising it (sign-out, a lower role) ends all of the user's sessions.
    session_generation: int = 0


class ApiToken(SQLModel, table=True):
    """A CLI token: only an argon2 hash of it is stored; the token itself is shown once when created."""

    id: str = Field(primary_key=True, max_length=32)  # the public part of the token (fts_<id>_<secret>)
    user: str = Field(foreign_key="user.name", index=True, max_length=200)
    label: str = ""
    token_hash: str = ""
    created_at: float = 0.0
    last_used_at: Optional[float] = None


class Sample(SQLModel, table=True):
    """One greedy answer to a sample prompt at a training step (samples during training)."""

    run_id: str = Field(primary_key=True, foreign_key="run.id", max_length=64)
    step: int = Field(primary_key=True)
    idx: int = Field(primary_key=True)  # the prompt's place in the run's sample prompts
    ts: float = 0.0
    prompt: str = ""
    text: str = ""
    new_tokens: int = 0
    flags: str = ""  # JSON object: degeneration kind -> what was found ("" or "{}": none)
    audio: str = ""  # a spoken sample's WAV, relative to the run folder ("": a text answer)
    turns: str = ""  # JSON list: a GRPO rollout's tool-calling turns (protocol.events.SampleEvent; "": none)


class EvalResult(SQLModel, table=True):
    """An eval job's overall result. Created when the job is submitted (metrics_json NULL until it ends), so
    a baseline being computed is found and not queued twice; filled from its eval_result event."""

    job_id: str = Field(primary_key=True, foreign_key="run.id", max_length=64)
    source_key: str = ""  # model_source.ModelSource.key: base:<model>, run:<id> or run:<id>@<step>
    source_run_id: str = Field(default="", index=True, max_length=64)  # "" for a base model
    checkpoint: Optional[int] = None
    base_model: str = ""
    data_fingerprint: str = Field(default="", index=True)
    settings_hash: str = ""
    data_label: str = ""
    metrics_json: Optional[str] = None
    created_at: float = 0.0


class EvalSample(SQLModel, table=True):
    """One scored test sample of an eval job."""

    job_id: str = Field(primary_key=True, foreign_key="run.id", max_length=64)
    index: int = Field(primary_key=True)
    prompt: str = ""
    reference: str = ""
    answer: str = ""
    exact: Optional[float] = None
    rouge_l: Optional[float] = None
    bleu: Optional[float] = None
    loss: Optional[float] = None
    tokens: int = 0
    judge: Optional[float] = None


class Artifact(SQLModel, table=True):
    """A file (or folder) an export job published: written by the pump from the job's artifact events."""

    job_id: str = Field(primary_key=True, max_length=64)  # the export job (its row is in the run table)
    path: str = Field(primary_key=True, max_length=4096)
    source_run_id: str = Field(default="", index=True, max_length=64)  # the run whose model was exported
    kind: str = ""  # adapter, merged, gguf, modelfile, card
    detail: str = ""  # the GGUF type, the merged dtype, ...
    size: int = 0  # bytes (a folder: all its files)
    sha256: str = ""  # of the file; of a folder's SHA256SUMS manifest
    created_at: float = 0.0


class Setting(SQLModel, table=True):
    """A setting an admin saved on the Settings page (db/settings_store.py): the one thing in the database that no
    run folder records, so ``db rebuild`` carries the rows over. Never a secret."""

    key: str = Field(primary_key=True, max_length=100)
    value: str = ""
    saved_by: str = ""
    saved_at: float = 0.0


class Vote(SQLModel, table=True):
    """A person's judgement of answers (issue 34): two answers side by side (``pair``: a_better, b_better, tie,
    both_bad), one answer (``single``: up, down) or an edit (``edit``: ``answer_b`` is the edited answer, the better
    one). Appended to the feedback log in the data root as well (trainer_core/protocol/feedback_log.py), so
    ``db rebuild`` restores it. A withdrawn vote keeps its row (the log has it anyway) and leaves every view."""

    id: str = Field(primary_key=True, max_length=40)
    created_at: float = Field(default=0.0, index=True)
    voter: str = Field(default="", index=True, max_length=200)
    kind: str = ""  # pair, single, edit
    label: str = ""
    messages: str = "[]"  # JSON: the conversation the answers reply to (system, user, assistant..., last user)
    answer_a: str = ""
    answer_b: str = ""  # pair: the other answer; edit: the edited answer; single: ""
    models: str = "[]"  # JSON: one object per answer (source key, label, run id, checkpoint, base model, template)
    sampling: str = "{}"  # JSON: the generation settings the answers were made with
    origin: str = "playground"  # playground, import, second opinion
    pair_key: str = Field(default="", index=True, max_length=64)  # the same answers judged: the same key
    withdrawn_at: Optional[float] = None


class Rating(SQLModel, table=True):
    """A person's rating of one answer of an eval job (judge calibration): pass/fail (0 or 1) or a 1-5 score. One per
    person, sample and scale; rating again replaces it. Kept in the feedback log as well, like votes."""

    job_id: str = Field(primary_key=True, max_length=64)
    index: int = Field(primary_key=True)
    rater: str = Field(primary_key=True, max_length=200)
    scale: str = Field(primary_key=True, max_length=20)  # pass_fail, score5
    value: float = 0.0
    created_at: float = 0.0
