"""What an uploaded fine-tuning file holds, checked line by line with the studio's own readers and format detection.

Three shapes are accepted, each also how the studio's form reads it:

- ``chat``: OpenAI's supervised rows ``{"messages": [...]}`` (and the studio's other layouts: alpaca, sharegpt,
  text), read by ``data.formats`` exactly as a training run reads them;
- ``pairs``: OpenAI's preference rows ``{"input": {"messages": [...]}, "preferred_output": [...],
  "non_preferred_output": [...]}``, converted to the studio's ``{prompt, chosen, rejected}`` message lists
  (``data.preference``), or rows already in that shape;
- ``prompts``: OpenAI's reinforcement rows ``{"messages": [...], "<field>": ...}`` whose messages end before the
  answer (or rows with a ``prompt`` column), read as GRPO reads them (``data.preference``): the other fields are the
  columns its rewards see. OpenAI's ``developer`` messages become ``system`` messages.

The fields a GRPO run would pass to its rewards (``columns``: those every row has, the last assistant turn of chat
rows as ``answer``) are kept with the file, so that a grader naming another field is refused when the job is created.

A problem names the line (1-based, as an editor shows it) and what to fix; the whole file is refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from trainer_core.api.errors import ApiError, invalid
from trainer_core.data import DatasetError, formats, preference, readers

OPENAI_PAIR_KEYS = ("input", "preferred_output", "non_preferred_output")
SHAPES = {"chat": "supervised (chat or text rows)", "pairs": "preference pairs (DPO)",
          "prompts": "prompts for reinforcement (messages without the answer)"}
ROLE_RENAMES = {"developer": "system"}  # OpenAI's name for the system turn


@dataclass
class CheckedFile:
    shape: str  # SHAPES
    format: str  # what the studio detected: chatml, alpaca, sharegpt, text; pairs; prompts
    rows: int
    training_rows: list[dict] | None  # rows to write in the studio's shape; None: the upload itself is read as is
    columns: list[str] | None = None  # the fields a GRPO run's rewards see in every row; None: not prompt rows


def file_error(message: str) -> ApiError:
    return invalid(message, "file", "invalid_file_format")


def check(data: bytes, filename: str) -> CheckedFile:
    """The upload's shape, or an ApiError naming the line that is wrong."""
    if not filename.lower().endswith(".jsonl"):
        raise file_error(f"{filename} is not a .jsonl file: fine-tuning files are JSON Lines, one example per line "
                         "(name the file *.jsonl)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise file_error(f"{filename}: line {line} is not UTF-8 text (byte 0x{data[exc.start]:02x}): "
                         "save the file as UTF-8") from None
    try:
        rows = readers.parse_jsonl(text, filename, "file")
    except DatasetError as exc:
        raise file_error(exc.message) from None
    if not rows:
        raise file_error(f"{filename} has no examples: write one JSON object per line")
    # parse_jsonl skips blank lines: the line each row came from
    lines = [number for number, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if all(key in rows[0] for key in OPENAI_PAIR_KEYS):
        return _openai_pairs(rows, lines, filename)
    if all(key in rows[0] for key in ("chosen", "rejected")):
        return _studio_pairs(rows, lines, filename)
    if _is_prompt_row(rows[0]):
        return _prompts(rows, lines, filename)
    return _chat(rows, lines, filename)


def _is_prompt_row(row: dict) -> bool:
    """A row to generate an answer for: messages that end before the answer, or a prompt (and no completion)."""
    messages = row.get("messages")
    if isinstance(messages, list) and messages:
        return not (isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant")
    return "prompt" in row and not any(key in row for key in ("completion", "chosen", "rejected"))


def _prompts(rows: list[dict], lines: list[int], filename: str) -> CheckedFile:
    renamed = [_renamed_roles(row) for row in rows]
    converted = renamed if renamed != rows else None
    problem = _prompts_problem(renamed)  # the whole file at once; row by row only to name the first bad line
    if problem:
        for row, line in zip(renamed, lines):
            if preference.row_problem(row, "prompts"):
                raise file_error(f"{filename}: line {line}: {preference.row_problem(row, 'prompts')}. Fix or "
                                 "remove that line.")
        raise file_error(f"{filename}: {problem}")  # the rows mix text and message prompts
    return CheckedFile("prompts", "prompts", len(rows), converted, prompt_columns(renamed))


def _renamed_roles(row: dict) -> dict:
    messages = row.get("messages")
    if not isinstance(messages, list) or not any(isinstance(m, dict) and m.get("role") in ROLE_RENAMES
                                                 for m in messages):
        return row
    return {**row, "messages": [{**m, "role": ROLE_RENAMES[m["role"]]}
                                if isinstance(m, dict) and m.get("role") in ROLE_RENAMES else m for m in messages]}


def _prompts_problem(rows: list[dict]) -> str:
    try:
        normalized = preference.normalize(rows, "prompts", field_name="file")
    except DatasetError as exc:
        return exc.message
    return next(iter(normalized.dropped), "")


def prompt_columns(rows: list[dict]) -> list[str] | None:
    """The fields GRPO passes to its rewards that every row has (None when the rows are no prompt rows)."""
    try:
        normalized = preference.normalize(rows, "prompts", field_name="file")
    except DatasetError:
        return None
    keys = [set(row) - {"prompt"} for row in normalized.rows]
    return sorted(set.intersection(*keys)) if keys else []


def _chat(rows: list[dict], lines: list[int], filename: str) -> CheckedFile:
    try:
        fmt, _ = formats.detect_format(rows)
    except DatasetError as exc:
        raise file_error(f"{filename}: {exc.message}") from None
    if _chat_rows_problem(rows, fmt):  # the whole file at once; row by row only to name the first bad line
        for row, line in zip(rows, lines):
            problem = _chat_rows_problem([row], fmt)
            if problem:
                raise file_error(f"{filename}: line {line}: {problem}. Fix or remove that line.")
    return CheckedFile("chat", fmt, len(rows), None, prompt_columns(rows) if fmt == "chatml" else None)


def _chat_rows_problem(rows: list[dict], fmt: str) -> str:
    try:
        converted = formats.convert_rows(rows, fmt, None, "")
    except DatasetError as exc:
        return exc.message
    return next(iter(converted.dropped), "")


def _openai_pairs(rows: list[dict], lines: list[int], filename: str) -> CheckedFile:
    converted = []
    for row, line in zip(rows, lines):
        pair, problem = _openai_pair(row)
        if problem:
            raise file_error(f"{filename}: line {line}: {problem}. Fix or remove that line.")
        converted.append(pair)
    checked = _studio_pairs(converted, lines, filename)
    checked.training_rows = converted
    return checked


def _openai_pair(row: dict) -> tuple[dict, str]:
    missing = [key for key in OPENAI_PAIR_KEYS if key not in row]
    if missing:
        return {}, f"a preference example needs {', '.join(OPENAI_PAIR_KEYS)}; this one has no {', '.join(missing)}"
    prompt = row["input"].get("messages") if isinstance(row["input"], dict) else None
    if not isinstance(prompt, list) or not prompt:
        return {}, "input must be an object with a non-empty messages list"
    for key in ("preferred_output", "non_preferred_output"):
        if not isinstance(row[key], list) or not row[key]:
            return {}, f"{key} must be a non-empty list of assistant messages"
    return {"prompt": prompt, "chosen": row["preferred_output"], "rejected": row["non_preferred_output"]}, ""


def _studio_pairs(rows: list[dict], lines: list[int], filename: str) -> CheckedFile:
    if _pairs_problem(rows):  # the whole file at once; row by row only to name the first bad line
        for row, line in zip(rows, lines):
            problem = _pairs_problem([row])
            if problem:
                raise file_error(f"{filename}: line {line}: {problem}")
    return CheckedFile("pairs", "pairs", len(rows), None)


def _pairs_problem(rows: list[dict]) -> str:
    try:
        normalized = preference.normalize(rows, "pairs", field_name="file")
    except DatasetError as exc:
        return exc.message
    return next(iter(normalized.dropped), "")


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
