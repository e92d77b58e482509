"""The Playground's logic, without Streamlit: which model sources are offered, the conversation, answers
streaming into columns (one thread per column), the serve job's state as the page shows it, prompt-set
tables and the downloads. ``pages/playground.py`` only lays these out. A vision-language column (a vision run, or
its base) also sees an image attached to a message, sent as a ``data:`` URL image part; the other columns get the
text alone.

The page is a client of a serve job's OpenAI-compatible endpoint (``trainer_core.serving.client``); it
reaches the job only through the orchestrator (``start_server``, ``server_key``, ``endpoint``, ``get_run``),
which is also the seam the tests use to put a fake HTTP server behind the page.

Kept whole: the logic of one page (sources offered, the conversation, streaming columns, the server's state, prompt
sets) kept out of the page so it is tested without Streamlit; its other modes have their own modules
(speech_playground, tts_playground, embedding_playground).
"""
from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from db.entities import RunRecord
from trainer_core import kinds, methods
from trainer_core.kinds.base import CHAT
from trainer_core.specs import model_source
from trainer_core.config import promptsets
from trainer_core.config import BUNDLED_MODEL, FieldError
from trainer_core.specs.model_source import ModelSource, SourceError
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving.client import AnswerStats, Sampling, ServeError, stream_chat
from trainer_core.serving.gate import IMAGE_FORMATS, MAX_IMAGES, GateConfig, RequestRefused, image_size_problem
from ui import image_check
from ui.tool_playground import (MAX_TOOL_STEPS, PERSON, ToolSetup, ToolStep, automatic_step, copy_step,
                                step_messages)

MAX_COLUMNS = 3
OFFERED = (RunStatus.COMPLETED, RunStatus.STOPPED)  # runs that ended with weights to talk to
PIECE_TIMEOUT_S = 120.0  # longest wait for the next piece of an answer (a slow CPU, a long prompt)
MESSAGE_MAX = 32_000  # characters in one user message or the system prompt
IMAGE_TYPES = ("png", "jpg", "jpeg", "webp")  # what the image picker offers

# Answer states. "interrupted": the server failed after part of the answer came; "failed": before any; "calling":
# the model called tools and waits for the person's results (ui/tool_playground.py).
STREAMING, DONE, STOPPED, INTERRUPTED, FAILED, SKIPPED, CALLING = \
    "streaming", "done", "stopped", "interrupted", "failed", "skipped", "calling"


# ====================================================================== sources
def finished_runs(runs: list[RunRecord]) -> list[RunRecord]:
    """Training runs that ended completed or stopped: the ones that can have a final model or checkpoints."""
    return [r for r in runs if r.kind is JobKind.TRAIN and r.status in OFFERED]


def run_modes(orch: Any, runs: list[RunRecord]) -> dict[str, str]:
    """Run id -> the Playground mode of its model kind (trainer_core.kinds: chat, search, transcribe, speak; "" for a
    kind with none, such as a reward model) for the finished runs, from their stored configs (a listing's rows come
    without them: one query reads them all)."""
    full = orch.store.get_runs([r.id for r in finished_runs(runs)])
    return {r.id: mode_of(r) for r in full}


def mode_of(run: RunRecord) -> str:
    """A run's Playground mode, from its stored config; "" when the config is unreadable or its method unknown. A
    vision run chats (its images are told from the base model when it loads: sees_images)."""
    try:
        method = json.loads(run.config_json or "{}").get("method") or "sft"
        return kinds.of_output(methods.get(method).output).playground
    except (ValueError, AttributeError, KeyError):
        return ""


def offered_runs(runs: list[RunRecord], modes: dict[str, str], mode: str = CHAT) -> list[RunRecord]:
    """The finished runs whose model kind has Playground mode ``mode``: chat offers models that write answers (a
    reward, embedding or speech model cannot chat); the other modes offer their kinds' runs."""
    return [r for r in finished_runs(runs) if modes.get(r.id) == mode]


def versions(run_id: str) -> list[int | None]:
    """What of a run can be loaded: its final model (None), then its completed checkpoints, newest first."""
    return [None, *reversed(model_source.checkpoint_steps(run_id))]


def version_label(step: int | None) -> str:
    return "final model" if step is None else f"checkpoint-{step}"


def base_source(run_id: str | None) -> ModelSource:
    """The base model of run ``run_id`` (the model it was trained from), or the bundled model when None."""
    if not run_id:
        return ModelSource(model=BUNDLED_MODEL)
    return ModelSource(model=model_source.run_config(run_id).model_name)


@dataclass(frozen=True)
class Column:
    """One loaded model: its source, the label shown above its answers, and the name the server knows it by."""

    key: str  # ModelSource.key
    label: str
    model: str = ""  # the served model name, known once the server is ready
    vision: bool = False  # a vision-language model: it sees the images attached to messages


def sees_images(resolved: model_source.ResolvedSource) -> bool:
    """True for a vision-language model (a vision run's final model, checkpoints and base), from its config files
    (unreadable here: False, and the server names the problem when it loads the model)."""
    return resolved.sees_images


def check_sources(sources: list[ModelSource | None]) -> tuple[list[Column], list[str]]:
    """Columns for ``sources``, and every problem (a source that cannot be loaded, the same one twice),
    each naming the column and the fix. A None (a column whose picker already said what is missing) is
    skipped, keeping the other columns' numbers."""
    columns: list[Column] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, source in enumerate(sources, 1):
        if source is None:
            continue
        if source.key in seen:
            problems.append(f"Column {i} shows the same model as column {seen[source.key]}: pick another "
                            "model, checkpoint or base")
            continue
        seen[source.key] = i
        try:
            resolved = model_source.resolve(source)
        except SourceError as exc:
            problems.append(f"Column {i}: {exc}")
            continue
        columns.append(Column(source.key, resolved.label, vision=sees_images(resolved)))
    if not sources:
        problems.append("Pick at least one model")
    return columns, problems


# ====================================================================== the serve job, as the page shows it
QUEUED, LOADING, READY, ENDED = "queued", "loading", "ready", "ended"


@dataclass(frozen=True)
class ServerState:
    """Where the serve job stands: ``phase`` is queued / loading / ready / failed / ended; ``message`` says it
    in words (and the fix); ``log_tail`` is the job log's end when it failed."""

    phase: str
    message: str
    url: str = ""
    models: dict[str, str] = field(default_factory=dict)  # source key -> served model name
    log_tail: str = ""

    @property
    def ready(self) -> bool:
        return self.phase == READY


def server_state(orch: Any, job_id: str) -> ServerState:
    """The serve job's state, from its row (status, error, log tail) and, once running, its endpoint."""
    row = orch.get_run(job_id)
    if row is None:
        return ServerState(ENDED, f"The model server job {job_id} is gone (deleted from History): press Load "
                                  "to start a new one.")
    if row.status is RunStatus.QUEUED:
        ahead = orch.active_run_id(kind=None)  # a training run, or another server, on the device
        behind = orch.get_run(ahead) if ahead and ahead != job_id else None
        why = (f"behind '{behind.name or behind.id}' ({behind.kind.label.lower()} job), which holds the device"
               if behind else "until the device is free")
        return ServerState(QUEUED, f"Queued {why}: it starts by itself when that ends (Stop it in History to "
                                   "chat sooner).")
    if row.status is RunStatus.FAILED:
        where = " (its log ends below)" if row.log_tail else ""
        return ServerState(FAILED, f"The model server failed: {row.error or 'no error was reported'}{where}. Fix the "
                                   "cause and press Load again.", log_tail=row.log_tail or "")
    if row.status.is_terminal():
        return ServerState(ENDED, f"The model server has {row.status.value} (stopped on request, or idle too long): "
                                  "press Load to start it again.")
    endpoint = orch.endpoint(job_id)
    if endpoint is None:
        phase_text = f" ({row.phase})" if row.phase else ""
        return ServerState(LOADING, f"Loading the models{phase_text}: the first load of a model can take a minute.")
    return ServerState(READY, f"Ready at {endpoint.url}", url=endpoint.url,
                       models={m.source_key: m.name for m in endpoint.models})


def job_alive(orch: Any, job_id: str) -> bool:
    row = orch.get_run(job_id)
    return row is not None and not row.status.is_terminal()


# ====================================================================== conversation
@dataclass
class Answer:
    """One model's answer to one prompt. ``text`` is untrusted model output: render it as text."""

    key: str
    label: str
    text: str = ""
    status: str = STREAMING
    error: str = ""
    stats: AnswerStats | None = None
    steps: list[ToolStep] = field(default_factory=list)  # tool rounds before ``text`` (the final answer)

    def to_record(self) -> dict[str, Any]:
        stats = asdict(self.stats) if self.stats else {}
        return {"source": self.key, "model": self.label, "status": self.status, "error": self.error, **stats}


@dataclass(frozen=True)
class Attachment:
    """An image attached to one user message (checked by ``check_image``)."""

    name: str
    mime: str
    data: bytes

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"

    def placeholder(self) -> dict[str, Any]:
        """What a downloaded conversation keeps of the image: which one it was, not its bytes."""
        return {"name": self.name, "mime": self.mime, "bytes": len(self.data),
                "sha256": hashlib.sha256(self.data).hexdigest()}


def check_image(name: str, data: bytes, turns: list["Turn"] | None = None) -> tuple[Attachment | None, list[FieldError]]:
    """The attachment for an uploaded image, or the problems (field ``image``): not an image Pillow reads, too
    large in bytes or pixels (the serve gate's own limits), or one image too many for the conversation."""
    try:
        fmt, _ = image_check.header(data)
    except ValueError:
        return None, [FieldError("image", f"{name!r} {image_check.NOT_AN_IMAGE}: attach a PNG, JPEG or WebP")]
    if fmt not in IMAGE_FORMATS:
        return None, [FieldError("image", f"{name!r} is a {fmt} image: attach a PNG, JPEG or WebP")]
    attachment = Attachment(name, f"image/{fmt.lower()}", data)
    errors = []
    try:
        image_size_problem(repr(name), {"url": attachment.data_url()}, GateConfig(key_hash="", models={}))
    except RequestRefused as exc:
        errors.append(FieldError("image", exc.message))
    if turns is not None and sum(t.image is not None for t in turns) >= MAX_IMAGES:
        errors.append(FieldError("image", f"this conversation already holds {MAX_IMAGES} images, the most one "
                                          "request may carry (every earlier image is sent again): start a new "
                                          "conversation"))
    return (None if errors else attachment), errors


@dataclass
class Turn:
    """One user message (and the image attached to it), every model's answer, and the system prompt and sampling
    they were asked with."""

    user: str
    answers: dict[str, Answer] = field(default_factory=dict)  # source key -> answer
    system: str = ""
    sampling: Sampling | None = None
    image: Attachment | None = None


def check_message(text: str, field_name: str = "message") -> list[FieldError]:
    if "\x00" in text:
        return [FieldError(field_name, "contains a NUL character (\\x00): remove it")]
    if len(text) > MESSAGE_MAX:
        return [FieldError(field_name, f"has {len(text):,} characters; the limit is {MESSAGE_MAX:,}")]
    return []


def user_content(text: str, image: Attachment | None, vision: bool) -> str | list[dict]:
    """A user message's content: for a vision model with an image, the image part then the text part; else text."""
    if image is None or not vision:
        return text
    return [{"type": "image_url", "image_url": {"url": image.data_url()}}, {"type": "text", "text": text}]


def messages_for(system: str, turns: list[Turn], key: str, new_user: str | None = None, vision: bool = False,
                 new_image: Attachment | None = None) -> list[dict]:
    """The conversation as column ``key`` saw it: the shared user messages with that model's own answers, each
    image as an image part when the column is a vision model (``vision``). A turn the model did not answer (its
    request failed before any text) is left out, so roles alternate."""
    messages: list[dict] = [{"role": "system", "content": system}] if system.strip() else []
    for turn in turns:
        answer = turn.answers.get(key)
        if answer is None or not answer.text:
            continue
        messages += [{"role": "user", "content": user_content(turn.user, turn.image, vision)},
                     *step_messages(answer.steps), {"role": "assistant", "content": answer.text}]
    if new_user is not None:
        messages.append({"role": "user", "content": user_content(new_user, new_image, vision)})
    return messages


def conversation_jsonl(turns: list[Turn]) -> str:
    """One JSON line per message: role and content. A system line comes first, and again wherever the system
    prompt changed; a user line adds its turn and sampling, and for an attached image a placeholder (name, type,
    size, sha256: the bytes would make the file megabytes of base64, and the picture may be private); an answer its
    turn, source, model, status and stats, and its tool rounds (``tool_steps``) when it called tools."""
    lines: list[dict[str, Any]] = []
    system = ""
    for n, turn in enumerate(turns, 1):
        if turn.system != system:
            system = turn.system
            lines.append({"role": "system", "content": system, "turn": n})
        lines.append({"role": "user", "content": turn.user, "turn": n,
                      **({"image": turn.image.placeholder()} if turn.image else {}),
                      **({"sampling": asdict(turn.sampling)} if turn.sampling else {})})
        for answer in turn.answers.values():
            # the tool rounds before the answer: calls, results (and who gave them, any function's error)
            steps = [{k: v for k, v in asdict(step).items() if v is not None} for step in answer.steps]
            lines.append({"role": "assistant", "content": answer.text, "turn": n, **answer.to_record(),
                          **({"tool_steps": steps} if steps else {})})
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


# ====================================================================== answers streaming into columns
class Batch:
    """Rows of requests, answered by every column at once: one thread per column asks its model row after
    row and streams each answer into ``answers[row][key]``. A chat turn is a batch of one row; a prompt set
    a batch of one row per prompt. ``stop()`` cancels every stream (each ends within the client's poll).

    After a failure that is not the request's own fault (no answer from the server, a 5xx), the column's
    remaining rows are skipped rather than each waiting out a timeout."""

    def __init__(self, url: str, api_key: str, columns: list[Column], rows: list[dict[str, list[dict]]],
                 sampling: Sampling, timeout_s: float = PIECE_TIMEOUT_S, tools: ToolSetup | None = None,
                 start: list[dict[str, Answer]] | None = None):
        self.columns = columns
        self.tools = tools or ToolSetup()
        self.cancel = threading.Event()
        self._lock = threading.Lock()
        self._answers = start or [{c.key: Answer(c.key, c.label) for c in columns} for _ in rows]
        self._threads = [threading.Thread(target=self._answer_column, daemon=True, name=f"playground-{i}",
                                          args=(url, api_key, column, rows, sampling, timeout_s))
                         for i, column in enumerate(columns)]
        for thread in self._threads:
            thread.start()

    def _answer_column(self, url: str, api_key: str, column: Column, rows: list[dict[str, list[dict]]],
                       sampling: Sampling, timeout_s: float) -> None:
        broken = ""
        for index, row in enumerate(rows):
            if broken or self.cancel.is_set():
                self._set(index, column.key, status=STOPPED if self.cancel.is_set() else SKIPPED,
                          error="" if self.cancel.is_set() else f"not asked: {broken}")
                continue
            try:
                broken = self._stream_one(index, url, api_key, column, row[column.key], sampling, timeout_s)
            except Exception as exc:  # noqa: BLE001 - thread boundary: the page must see an end, never "streaming"
                self._set(index, column.key, status=FAILED,
                          error=f"the answer could not be read: {type(exc).__name__}: {exc}")
                broken = "an earlier answer could not be read"

    def _stream_one(self, index: int, url: str, api_key: str, column: Column, messages: list[dict],
                    sampling: Sampling, timeout_s: float) -> str:
        """Stream one answer; returns why the column cannot go on ("" when it can). When the model calls tools,
        each round becomes a step of the answer: answered by the mock replies and Python functions it asks again,
        else it waits for the person (CALLING); at most MAX_TOOL_STEPS rounds."""
        messages = list(messages)
        while True:
            stream = None
            try:
                stream = stream_chat(url, api_key, column.model, messages, sampling, timeout_s=timeout_s,
                                     cancel=self.cancel, tools=self.tools.tools or None)
                for piece in stream:
                    with self._lock:
                        self._answers[index][column.key].text += piece
            except ServeError as exc:
                with self._lock:
                    answer = self._answers[index][column.key]
                    answer.status, answer.error = (INTERRUPTED if answer.text else FAILED), str(exc)
                    answer.stats = stream.stats if stream else None
                return "" if exc.status is not None and exc.status < 500 else "the server failed on an earlier prompt"
            calls = stream.tool_calls if stream.stats.finish_reason is not None else []
            if not calls:
                self._set(index, column.key, status=STOPPED if stream.stats.finish_reason is None else DONE,
                          stats=stream.stats)
                return ""
            with self._lock:
                content = self._answers[index][column.key].text
            # mock replies and Python functions (a sandboxed child: outside the lock, the page keeps drawing)
            step = automatic_step(content, calls, self.tools, self.cancel) if self.tools.answers_itself(calls) \
                else ToolStep(content, calls)
            with self._lock:
                answer = self._answers[index][column.key]
                answer.text, answer.stats = "", stream.stats
                if step is None:  # Stop came while the tool functions ran
                    answer.steps.append(ToolStep(content, calls))
                    answer.status = STOPPED
                    return ""
                answer.steps.append(step)
                if step.results is None:
                    answer.status = CALLING
                    return ""
                if len(answer.steps) >= MAX_TOOL_STEPS:
                    answer.status, answer.error = STOPPED, (f"the model called tools {MAX_TOOL_STEPS} times in a row: "
                                                            "the Playground stopped asking")
                    return ""
            messages += step_messages([step])

    def _set(self, index: int, key: str, **values: Any) -> None:
        with self._lock:
            answer = self._answers[index][key]
            for name, value in values.items():
                setattr(answer, name, value)

    def answers(self) -> list[dict[str, Answer]]:
        """A copy of every answer as it stands now (the threads keep writing to their own)."""
        with self._lock:
            return [{k: Answer(**{**vars(a), "steps": [copy_step(s) for s in a.steps]}) for k, a in row.items()}
                    for row in self._answers]

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        self.cancel.set()

    def abandon(self, reason: str) -> None:
        """The server is gone: stop, and say why on every answer still streaming."""
        self.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        with self._lock:
            for row in self._answers:
                for answer in row.values():
                    if answer.status in (STREAMING, STOPPED) and not answer.error:
                        answer.status = INTERRUPTED if answer.text else FAILED
                        answer.error = reason


def chat_batch(url: str, api_key: str, columns: list[Column], system: str, turns: list[Turn], user: str,
               sampling: Sampling, image: Attachment | None = None, tools: ToolSetup | None = None) -> Batch:
    rows = [{c.key: messages_for(system, turns, c.key, user, c.vision, image) for c in columns}]
    return Batch(url, api_key, columns, rows, sampling, tools=tools)


def answer_tools(url: str, api_key: str, column: Column, system: str, turns: list[Turn], results: list[str],
                 sampling: Sampling, tools: ToolSetup) -> Batch:
    """Give the last turn's answer of ``column`` (waiting, CALLING) the person's ``results`` and ask its model
    again: the answer goes on from its steps in a batch of its own."""
    turn = turns[-1]
    answer = turn.answers[column.key]
    steps = [copy_step(s) for s in answer.steps]
    steps[-1].results, steps[-1].replied_by = list(results), [PERSON] * len(results)
    messages = messages_for(system, turns[:-1], column.key, turn.user, column.vision, turn.image) + step_messages(steps)
    going_on = Answer(column.key, column.label, steps=steps)
    return Batch(url, api_key, [column], [{column.key: messages}], sampling, tools=tools,
                 start=[{column.key: going_on}])


def prompt_set_batch(url: str, api_key: str, columns: list[Column], system: str, prompts: tuple[str, ...],
                     sampling: Sampling) -> Batch:
    rows = [{c.key: messages_for(system, [], c.key, prompt) for c in columns} for prompt in prompts]
    return Batch(url, api_key, columns, rows, sampling)


# ====================================================================== showing answers
def stats_line(answer: Answer) -> str:
    """``42 tokens · first token 0.31 s · 18.2 tokens/s`` (parts that are unknown are left out)."""
    s = answer.stats
    if s is None:
        return ""
    parts = [f"{s.tokens:,} tokens"]
    if s.ttft_s is not None:
        parts.append(f"first token {s.ttft_s:.2f} s")
    if s.tokens_per_s is not None:
        parts.append(f"{s.tokens_per_s:.1f} tokens/s")
    if s.finish_reason == "length":
        parts.append("cut at max new tokens")
    return " · ".join(parts)


def cell_text(answer: Answer) -> str:
    """An answer in a table cell: its text, marked when it is not whole."""
    if answer.status in (DONE, STREAMING):
        return answer.text
    if answer.status == STOPPED:
        return answer.text + " [stopped]" if answer.text else "[stopped]"
    if answer.status == SKIPPED:
        return f"[{answer.error}]"
    return (answer.text + " " if answer.text else "") + f"[{answer.status}: {answer.error}]"


def prompt_set_table(prompts: tuple[str, ...], columns: list[Column], answers: list[dict[str, Answer]]) -> pd.DataFrame:
    """One row per prompt, one column per model, the answers in the cells."""
    labels = unique_labels(columns)
    return pd.DataFrame([{"Prompt": prompt, **{labels[c.key]: cell_text(row[c.key]) for c in columns}}
                         for prompt, row in zip(prompts, answers)])


def unique_labels(columns: list[Column]) -> dict[str, str]:
    """Column labels made unique (two runs can share a name): a repeated label gets its source key."""
    counts: dict[str, int] = {}
    for c in columns:
        counts[c.label] = counts.get(c.label, 0) + 1
    return {c.key: c.label if counts[c.label] == 1 else f"{c.label} ({c.key})" for c in columns}


def saved_set_names() -> list[str]:
    """Prompt sets saved as files (editable, deletable); one that cannot be read still counts, so it can be deleted."""
    saved = []
    for name in promptsets.names():
        try:
            if not promptsets.load(name).builtin:
                saved.append(name)
        except promptsets.PromptSetError:
            saved.append(name)
    return saved
