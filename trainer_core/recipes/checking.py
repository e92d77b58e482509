"""What a recipe job (and its preview) does around Data Designer: the seed rows, the endpoints behind the model
aliases, and every generated record checked into a training row or set aside with its reason."""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

from trainer_core.data import documents, tool_calls, tool_schema
from trainer_core.data import readers, sources as data_sources
from trainer_core.data import DatasetError
from trainer_core.protocol import paths
from trainer_core.recipes import rows as recipe_rows
from trainer_core.recipes.dedupe import Deduper
from trainer_core.recipes.spec import RecipeSpec
from trainer_core.recipes import user_code
from trainer_core.recipes.validators import RowChecker, parse_validators
from trainer_core.serving import endpoint as endpoint_file
from trainer_core.specs.model_source import ModelSource

SEEDS_FILE, SOURCES_FILE = "seeds.jsonl", "sources.json"
TEACHER_KEY_ENV = "FINETUNE_STUDIO_TEACHER_KEY"  # trainer_core/protocol/secrets.py: the spec's teacher_key
MAX_SEED_ROWS = 200_000
JUDGE_TYPE = "llm-judge"


class RecipeError(Exception):
    """The recipe cannot go on; the message names the field or the row, and the fix."""


# ---------------------------------------------------------------------- seeds
def prepare_seeds(spec: RecipeSpec, folder: Path, warn: Callable[[str], None]) -> Path | None:
    """The seed rows as JSONL in ``folder`` (kept when already there: a resumed job samples the same seeds);
    None when the recipe has no seed (Data Designer's samplers only)."""
    if not (spec.documents or spec.seed_dataset or spec.seed_hub_dataset):
        return None
    seeds = Path(folder) / SEEDS_FILE
    if seeds.is_file():
        return seeds
    if spec.documents:
        rows = _document_rows(spec, Path(folder), warn)
    elif spec.seed_hub_dataset:
        rows = _hub_rows(spec)
    else:
        try:
            rows = readers.read_rows(data_sources.resolve_source(spec.seed_dataset, "seed_dataset"), "seed_dataset")
        except DatasetError as exc:
            raise RecipeError(f"{exc.field}: {exc}") from None
        if not rows:
            raise RecipeError(f"seed_dataset: {spec.seed_dataset} has no rows")
        rows = _nested_as_json(rows[:MAX_SEED_ROWS])
    tmp = seeds.with_name(".seeds.jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, default=str).replace("\\u0000", "") + "\n")
    os.replace(tmp, seeds)
    return seeds


def _hub_rows(spec: RecipeSpec) -> list[dict]:
    """A hub dataset's split as seed rows (Hugging Face datasets, in the worker; the hub's cache is shared)."""
    from datasets import load_dataset  # the worker side only: the dashboard never reads hub data itself

    try:
        data = load_dataset(spec.seed_hub_dataset, split=spec.seed_hub_split)
    except Exception as exc:  # noqa: BLE001 - the hub's errors are many (offline, gated, no such split): named
        raise RecipeError(f"seed_hub_dataset: {spec.seed_hub_dataset} ({spec.seed_hub_split}) cannot be read: "
                          f"{type(exc).__name__}: {str(exc)[:300]}") from None
    rows = [dict(row) for _, row in zip(range(MAX_SEED_ROWS), data)]
    if not rows:
        raise RecipeError(f"seed_hub_dataset: the split {spec.seed_hub_split} of {spec.seed_hub_dataset} has no rows")
    return _nested_as_json(rows)


def _nested_as_json(rows: list[dict]) -> list[dict]:
    """A nested value (a tool's schema, a conversation) kept as JSON text in the seed rows; the output template reads
    it back as its value (rows.render)."""
    return [{k: json.dumps(v, ensure_ascii=False, default=str) if isinstance(v, (dict, list)) else v
             for k, v in row.items()} for row in rows]


def _document_rows(spec: RecipeSpec, folder: Path, warn: Callable[[str], None]) -> list[dict]:
    try:
        where = data_sources.resolve_source(spec.documents, "documents")
    except DatasetError as exc:
        raise RecipeError(f"documents: {exc}") from None
    chunks, problems = documents.read_documents(where, chunk_chars=spec.chunk_chars, overlap_chars=spec.overlap_chars,
                                                roots=paths.allowed_data_roots())
    for problem in problems:
        warn(f"documents: {problem.source}: {problem.message}")
    files = sorted({c.source for c in chunks})
    (folder / SOURCES_FILE).write_text(json.dumps({
        "documents": spec.documents, "files": files, "chunks": len(chunks),
        "problems": [{"source": p.source, "message": p.message} for p in problems]}, indent=1))
    if not chunks:
        named = "; ".join(f"{p.source}: {p.message}" for p in problems[:3])
        raise RecipeError(f"documents: no readable text in {spec.documents}" + (f" ({named})" if named else
                          " (supported: " + ", ".join(documents.SUPPORTED_SUFFIXES) + ")"))
    return [c.as_row() for c in chunks[:MAX_SEED_ROWS]]


# ---------------------------------------------------------------------- endpoints
def endpoints(spec: RecipeSpec, folder: Path, wait_s: float,
              interrupt: Callable[[], None]) -> tuple[list[dict], list[dict], dict[str, str]]:
    """(Data Designer's providers, its model configs, the keys by environment variable) for the recipe's models.
    A model this studio serves is waited for (its serve job loads it) up to ``wait_s``, ``interrupt`` called each
    second (it raises to end the wait); an external endpoint is asked for its models once, so a wrong URL or a
    server that is down is named before any generation."""
    providers, configs, keys = [], [], {}
    given = {m.get("alias"): m for m in (spec.recipe.get("model_configs") or []) if isinstance(m, dict)}
    for i, model in enumerate(spec.models):
        at = f"models[{i}]"
        if model.get("source"):
            url, name = _served(spec, str(model["source"]), at, wait_s, interrupt)
            key_env = TEACHER_KEY_ENV
        else:
            url, name, key_env = str(model["url"]).rstrip("/"), str(model["model"]), str(model.get("key_env") or "")
            _answers(url, os.environ.get(key_env, "") if key_env else "", at)
        if key_env and os.environ.get(key_env):
            keys[key_env] = os.environ[key_env]
        providers.append({"name": model["alias"], "endpoint": url, "key_env": key_env})
        params = {"temperature": model.get("temperature", 0.7), "max_tokens": model.get("max_tokens", 512),
                  "max_parallel_requests": model.get("max_parallel_requests", 4), "timeout": model.get("timeout_s", 120)}
        params.update((given.get(model["alias"]) or {}).get("inference_parameters") or {})
        configs.append({"alias": model["alias"], "model": name, "provider": model["alias"],
                        "inference_parameters": params})
    return providers, configs, keys


def _served(spec: RecipeSpec, source: str, at: str, wait_s: float, interrupt: Callable[[], None]) -> tuple[str, str]:
    if not spec.served_by:
        raise RecipeError(f"{at}.source: no serve job was started for {source}: start the recipe from the Data page "
                          "or `finetune-studio data generate`, which start one")
    key = ModelSource.from_key(source).key
    deadline = time.monotonic() + wait_s
    while True:
        interrupt()
        found = endpoint_file.read(paths.run_dir(spec.served_by))
        if found is not None:
            name = found.name_of(key)
            if name is None:
                raise RecipeError(f"{at}.source: serve job {spec.served_by} does not serve {source}")
            return found.url.rstrip("/"), name
        state = paths.run_dir(spec.served_by) / "events.jsonl"
        if time.monotonic() > deadline:
            raise RecipeError(f"{at}.source: {source} was not served within {wait_s:.0f} s (serve job "
                              f"{spec.served_by}; its log says why): start it again, or choose another teacher")
        if not state.parent.is_dir():
            raise RecipeError(f"{at}.source: the serve job {spec.served_by} is gone")
        time.sleep(1.0)


def _answers(url: str, key: str, at: str) -> None:
    request = urllib.request.Request(url + "/models", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            response.read(1 << 16)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise RecipeError(f"{at}.key_env: the endpoint at {url} refused the key ({exc.code}): check the key in "
                              "the variable key_env names") from None
        if exc.code >= 500:
            raise RecipeError(f"{at}.url: the endpoint at {url} answers {exc.code}: it is not serving") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RecipeError(f"{at}.url: the endpoint at {url} does not answer ({reason}): check the URL and that the "
                          "server is up") from None


# ---------------------------------------------------------------------- records -> rows
class Checker:
    """A generated record -> a training row (the output template, provenance when seeded from documents), or the
    reason it is set aside: a template it cannot fill, a judge score under the bar, a failed validator, a repeat."""

    def __init__(self, spec: RecipeSpec, run_dir: Path):
        validators, problems = parse_validators(spec.validators, "validators", check_files=False)
        if problems:
            raise RecipeError("; ".join(f"{where}: {message}" for where, message in problems))
        if any(v.kind == "python" and not (Path(run_dir) / user_code.FOLDER / f"{v.name}.py").is_file()
               for v in validators):  # hashed and copied once; a resumed job keeps the copies it took over
            try:
                user_code.snapshot(validators, Path(run_dir))
            except ValueError as exc:
                raise RecipeError(f"validators: {exc}") from None
        self.spec = spec
        try:
            self.validators = RowChecker(validators, run_dir)
        except RuntimeError as exc:
            raise RecipeError(f"validators: {exc}") from None
        self.deduper = Deduper(["text"], threshold=spec.near_duplicate) if spec.dedupe else None
        columns = spec.recipe.get("columns", []) if isinstance(spec.recipe, dict) else []
        self.judges = [c["name"] for c in columns if isinstance(c, dict) and c.get("column_type") == JUDGE_TYPE]

    def close(self) -> None:
        self.validators.close()

    def remember(self, kept: Iterable[dict]) -> None:
        """Rows kept before (a resumed job): a new row repeating one of them is a repeat too."""
        if self.deduper is not None:
            for i, row in enumerate(kept):
                self.deduper.add({"text": recipe_rows.texts(_trainable(row), self.spec.dedupe_columns)}, f"kept {i}")

    def check(self, record: dict, row_id: str) -> tuple[dict | None, str | None]:
        try:
            row = recipe_rows.render(self.spec.output, record)
        except recipe_rows.RowError as exc:
            return None, f"output: {exc}"
        if not isinstance(row, dict):
            return None, "output: the template did not make an object"
        problem = _row_problem(row)
        if problem:
            return None, problem
        scores = judge_scores(record, self.judges)
        low = [f"{column}.{criterion} scored {score}" for (column, criterion), score in scores.items()
               if self.spec.judge_min and score < self.spec.judge_min]
        if low:
            return None, f"judge: {low[0]} (< judge_min {self.spec.judge_min:g})"
        reason = self.validators.check(record)
        if reason:
            return None, reason
        if self.deduper is not None:
            text = recipe_rows.texts(row, self.spec.dedupe_columns)
            repeat = self.deduper.check_and_add({"text": text}, row_id)
            if repeat:
                return None, repeat
        if self.spec.documents and "source" in record:
            row[recipe_rows.PROVENANCE] = {"source": record.get("source"), "page": record.get("page"),
                                           "chunk": record.get("chunk")}
        if scores:
            row.setdefault(recipe_rows.PROVENANCE, {})["scores"] = {f"{c}.{k}": v for (c, k), v in scores.items()}
        return row, None

    def check_all(self, records: list[dict], batch: int) -> tuple[list[dict], list[dict]]:
        kept, rejected = [], []
        for i, record in enumerate(records):
            record = {k: _plain(v) for k, v in record.items()}
            row, reason = self.check(record, f"batch {batch} record {i}")
            if row is not None:
                kept.append(row)
            else:
                rejected.append({"reason": reason, "record": record, "batch": batch})
        return kept, rejected


def _row_problem(row: dict) -> str | None:
    """What makes a training row useless whatever the recipe: a preference pair whose answers are the same, a tool
    call to a tool the row does not offer or with arguments that do not fit its schema (tool-call rows are checked
    as the tool-calling runs' data is: trainer_core/data/tool_schema.py)."""
    if "chosen" in row and "rejected" in row and row["chosen"] == row["rejected"]:
        return "pair: the chosen and rejected answers are the same"
    if tool_calls.is_tool_row(row):
        try:
            problems = tool_schema.row_problems(row)
        except (ValueError, TypeError, KeyError) as exc:
            problems = [str(exc)]
        if problems:
            return f"tool call: {problems[0]}"
    return None


def _trainable(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != recipe_rows.PROVENANCE}


def judge_scores(record: dict, judges: list[str]) -> dict[tuple[str, str], float]:
    """The scores of a record's judge columns: Data Designer keeps {criterion: {score, reasoning}} per column."""
    found: dict[tuple[str, str], float] = {}
    for column in judges:
        value = record.get(column)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        for criterion, verdict in (value or {}).items() if isinstance(value, dict) else []:
            score = verdict.get("score") if isinstance(verdict, dict) else verdict
            try:
                found[(column, str(criterion))] = float(score)
            except (TypeError, ValueError):
                continue
    return found


def _plain(value):
    """A parquet value as JSON: numpy arrays and such become lists and numbers."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
