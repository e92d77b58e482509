"""The data-recipe job's spec (job.json): a NeMo Data Designer config, the sources that seed it, the models that
answer its prompts, the checks its rows must pass, and the dataset it writes. No ML stack, no Data Designer.

The recipe format is Data Designer's own (``columns``, ``constraints``, ``processors``, ``seed_config``,
``model_configs``), so a recipe moves to and from Data Designer unchanged; the studio adds what Data Designer
leaves to its caller: where the seed rows come from (documents chunked here, or a dataset file), which endpoint
serves each model alias (a model this studio serves, or an external endpoint whose key an admin declared),
validators, duplicate removal, and how a generated record becomes a training row (``output``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainer_core.config import FieldError
from trainer_core.data import DatasetError
from trainer_core.data import sources as data_sources
from trainer_core.evaluation import endpoint
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind
from trainer_core.recipes import rows as recipe_rows
from trainer_core.recipes import validators as recipe_validators
from trainer_core.rewards import spec as reward_spec
from trainer_core.specs.jobspec import JobSpec, register
from trainer_core.specs.model_source import ModelSource, SourceError, resolve

ALIAS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,39}")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
LLM_COLUMN_TYPES = ("llm-text", "llm-code", "llm-structured", "llm-judge")
# Data Designer's config keys a recipe may hold: its seed rows come from ``documents`` or ``seed_dataset`` (a
# seed_config could name any file or a hub dataset), and its MCP tools start processes: neither is offered.
DD_KEYS = ("columns", "constraints", "processors", "model_configs", "profilers", "library_version")
# Column types a recipe may use: no ``custom`` (a Python generator imported by name) and no image columns (the
# studio's teachers are chat models); validation columns only with Data Designer's code linters.
COLUMN_TYPES = ("sampler", "llm-text", "llm-code", "llm-structured", "llm-judge", "expression", "validation",
                "seed-dataset")
RECIPE_BYTES_MAX = 256 << 10
HUB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
SPLIT_RE = re.compile(r"[A-Za-z0-9_.-]{1,40}(\[[0-9:%+-]{1,20}\])?")
MAX_ROWS = 100_000
MAX_BATCH = 1_000
SEED_COLUMNS = ("source", "page", "chunk", "text")  # what a document chunk gives each record (data/documents.py)
TEACHER_KEY_SECRET = "teacher_key"  # the key of the studio's serve job behind the teachers (memory and env only)
DEFAULT_MODEL = {"alias": "teacher", "source": "", "url": "", "model": "", "key_env": "", "max_parallel_requests": 4,
                 "temperature": 0.7, "max_tokens": 512, "timeout_s": 120}


def recipes_root():
    """Where recipe datasets are published: datasets/recipes/<name>/v<N>/ under the data root."""
    return paths.datasets_dir() / "recipes"


@register
@dataclass
class RecipeSpec(JobSpec):
    """Generate ``num_rows`` records with Data Designer, keep those that pass, publish them as a dataset version."""

    KIND: ClassVar[JobKind] = JobKind.RECIPE
    NEEDS_DEVICE: ClassVar[bool] = False  # it calls endpoints: it never waits for, nor holds, a GPU or the CPU slot
    recipe: dict[str, Any] = field(default_factory=dict)  # Data Designer's config (its own format); model aliases below
    starter: str = ""  # the starter recipe it was made from (trainer_core/recipes/starters/), "" when written by hand
    dataset_name: str = ""  # published as datasets/recipes/<dataset_name>/v<N>/ (data.jsonl, card.json, README.md)
    documents: str = ""  # a folder or file of documents (pdf, docx, html, md, txt) chunked into the seed rows
    chunk_chars: int = 1500
    overlap_chars: int = 200
    seed_dataset: str = ""  # or a dataset file (jsonl, json, csv, parquet) whose rows seed the records
    seed_hub_dataset: str = ""  # or a Hugging Face hub dataset (org/name), read by the worker (it then needs the network)
    seed_hub_split: str = "train"
    # The endpoints behind the recipe's model aliases: a model this studio serves (``source``: base:<model>,
    # run:<id>), started as a serve job when the recipe starts, or an external OpenAI-compatible endpoint (``url``,
    # ``model``, ``key_env``: a variable the admin declared in FINETUNE_STUDIO_JUDGE_KEY_ENVS; never the key).
    models: list[dict[str, Any]] = field(default_factory=lambda: [dict(DEFAULT_MODEL)])
    served_by: str = ""  # the serve job of this studio answering for the ``source`` aliases (filled at start)
    num_rows: int = 50  # records generated; those kept are fewer when some fail a check or repeat another
    batch_size: int = 10  # records per batch: progress, Stop and resume work batch by batch
    validators: list[dict[str, Any]] = field(default_factory=list)  # trainer_core/recipes/validators.py
    dedupe: bool = True
    dedupe_columns: list[str] = field(default_factory=list)  # the output fields compared; empty: every text field
    near_duplicate: float = 0.85  # estimated Jaccard similarity at which a row repeats an earlier one (MinHash)
    judge_min: float = 0.0  # a record whose judge column (llm-judge) scores any criterion under this is set aside
    output: dict[str, Any] = field(default_factory=dict)  # a training row: {field: "{{ column.key }}" templates, nested}
    resume_from: str = ""  # a stopped, cancelled or failed recipe job whose batches and rows this one continues
    launcher: str = "local"

    def __post_init__(self) -> None:
        self._teacher_key = ""  # the serve job's key: memory and the worker's environment only (``secrets``)

    # ---- what the queue, History and the launcher read
    @property
    def model_label(self) -> str:
        return ", ".join(_model_label(m) for m in self.models if isinstance(m, dict))[:200]

    @property
    def dataset_label(self) -> str:
        return f"recipes/{self.dataset_name}" + (f" ← {self.starter}" if self.starter else "")

    @property
    def total_steps(self) -> int:
        return self.num_rows if isinstance(self.num_rows, int) else 0

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.pop("source", None)  # a recipe loads no model of its own: its models are endpoints (``models``)
        return data

    def model_sources(self) -> list[ModelSource]:
        return [ModelSource.from_key(m["source"]) for m in self.models
                if isinstance(m, dict) and isinstance(m.get("source"), str) and m.get("source")]

    def with_teacher_key(self, key: str) -> "RecipeSpec":
        self._teacher_key = key
        return self

    def secrets(self) -> dict[str, str]:
        return {TEACHER_KEY_SECRET: self._teacher_key} if self._teacher_key else {}

    def env_names(self) -> list[str]:
        return [m["key_env"] for m in self.models if isinstance(m, dict) and m.get("url") and m.get("key_env")
                and endpoint.key_env_problem(str(m["key_env"])) is None]

    def admin_only(self) -> list[str]:
        reasons = super().admin_only()
        parsed, _ = recipe_validators.parse_validators(self.validators, "validators", check_files=False)
        if recipe_validators.needs_admin(parsed):
            reasons.append("validators: a Python validator is code run on this host: only an admin may use one; "
                           "ask an admin, or use json_schema, regex, length or sql validators")
        return reasons

    def writable_paths(self) -> list[Path]:
        return [self.output_dir(Path())] if isinstance(self.dataset_name, str) and NAME_RE.fullmatch(self.dataset_name) \
            else []

    def output_dir(self, job_dir: Path) -> Path:
        """Where its dataset versions are published (the pump accepts the artifact it names there)."""
        return recipes_root() / self.dataset_name

    def needs_network(self) -> bool:
        return self.uses_teacher()

    def uses_teacher(self) -> bool:
        columns = self.recipe.get("columns") if isinstance(self.recipe, dict) else None
        return any(isinstance(c, dict) and c.get("column_type") in LLM_COLUMN_TYPES for c in columns or [])

    # ---- checks
    def validate(self) -> list[FieldError]:
        """Every problem at once, each naming its field and the fix. The recipe's columns are Data Designer's to
        check in depth (the worker reports its message); here what the studio relies on is checked."""
        errors: list[FieldError] = []
        if not isinstance(self.name, str) or len(self.name) > 80 or "\x00" in self.name:
            errors.append(FieldError("name", "at most 80 characters, no NUL"))
        if not isinstance(self.dataset_name, str) or not NAME_RE.fullmatch(self.dataset_name):
            errors.append(FieldError("dataset_name", "a name for the dataset: lowercase letters, digits, - and _ "
                                                     "(at most 64), e.g. docs-qa"))
        errors += self._recipe_errors() + self._source_errors() + self._model_errors()
        if not isinstance(self.num_rows, int) or not 1 <= self.num_rows <= MAX_ROWS:
            errors.append(FieldError("num_rows", f"how many records to generate: 1 to {MAX_ROWS:,}"))
        if not isinstance(self.batch_size, int) or not 1 <= self.batch_size <= MAX_BATCH:
            errors.append(FieldError("batch_size", f"records per batch: 1 to {MAX_BATCH}"))
        _, problems = recipe_validators.parse_validators(self.validators, "validators")
        errors += [FieldError(where, message) for where, message in problems]
        if not isinstance(self.judge_min, float) or not 0 <= self.judge_min <= 100:
            errors.append(FieldError("judge_min", "the lowest judge score a kept row may have (0: keep every score)"))
        if not isinstance(self.near_duplicate, float) or not 0 < self.near_duplicate <= 1:
            errors.append(FieldError("near_duplicate", "a similarity between 0 (exclusive) and 1, e.g. 0.85; 1 "
                                                       "removes exact repeats only"))
        errors += [FieldError("output" + where, message) for where, message in recipe_rows.template_problems(
            self.output, self._column_names())]
        if not isinstance(self.dedupe_columns, list) or not all(isinstance(c, str) for c in self.dedupe_columns):
            errors.append(FieldError("dedupe_columns", "a list of output field names"))
        if self.resume_from and not (isinstance(self.resume_from, str) and paths.RUN_ID_RE.fullmatch(self.resume_from)
                                     and paths.runs_dir().joinpath(self.resume_from, "job.json").is_file()):
            errors.append(FieldError("resume_from", f"{str(self.resume_from)[:80]!r} is not a recipe job of this "
                                                    "studio: give the id of the stopped or failed recipe job"))
        if self.launcher != "local":
            errors.append(FieldError("launcher", "recipe jobs run on this host (they call endpoints; they need no GPU)"))
        if self.gpu_ids:
            errors.append(FieldError("gpu_ids", "a recipe job holds no device: leave gpu_ids empty"))
        return errors

    def _column_names(self) -> list[str]:
        names = [c.get("name") for c in (self.recipe.get("columns") or []) if isinstance(c, dict)] \
            if isinstance(self.recipe, dict) else []
        seeds = list(SEED_COLUMNS) if self.documents else []
        return [n for n in names if isinstance(n, str)] + seeds + (["*"] if self.seed_dataset or self.seed_hub_dataset
                                                                   else [])

    def _recipe_errors(self) -> list[FieldError]:
        if not isinstance(self.recipe, dict):
            return [FieldError("recipe", "a Data Designer config: an object with `columns` (YAML or JSON)")]
        errors = [FieldError(f"recipe.{k}", f"not offered in a recipe (its keys: {', '.join(DD_KEYS)})" + (
            "; seed rows come from `documents` or `seed_dataset`" if k == "seed_config" else ""))
            for k in list(self.recipe)[:5] if k not in DD_KEYS]
        if len(json.dumps(self.recipe, default=str)) > RECIPE_BYTES_MAX:
            return errors + [FieldError("recipe", f"over {RECIPE_BYTES_MAX >> 10} KiB: a recipe is a few columns and "
                                                  "prompts (put long texts in documents)")]
        columns = self.recipe.get("columns")
        if not isinstance(columns, list) or not columns:
            return errors + [FieldError("recipe.columns", "the columns to generate: a list such as [{name: answer, "
                                                          "column_type: llm-text, prompt: ..., model_alias: teacher}]")]
        aliases = {m.get("alias") for m in self.models if isinstance(m, dict)}
        aliases |= {m.get("alias") for m in self.recipe.get("model_configs") or [] if isinstance(m, dict)}
        seen: set[str] = set()
        for i, column in enumerate(columns):
            at = f"recipe.columns[{i}]"
            if not isinstance(column, dict) or not isinstance(column.get("name"), str) or not column.get("name"):
                errors.append(FieldError(at, "each column is an object with a `name` and a `column_type`"))
                continue
            if column["name"] in seen:
                errors.append(FieldError(f"{at}.name", f"{column['name']!r} is used twice: give each column its own"))
            seen.add(column["name"])
            if column.get("column_type") not in COLUMN_TYPES:
                errors.append(FieldError(f"{at}.column_type", f"{str(column.get('column_type'))[:40]!r} is not "
                                                              f"offered; use one of {', '.join(COLUMN_TYPES)}"))
            elif column.get("column_type") == "validation" and column.get("validator_type", "code") != "code":
                errors.append(FieldError(f"{at}.validator_type", "only Data Designer's code validators run in a "
                                                                 "recipe; check rows with `validators` instead"))
            alias = column.get("model_alias")
            if column.get("column_type") in LLM_COLUMN_TYPES and alias not in aliases:
                errors.append(FieldError(f"{at}.model_alias", f"{alias!r} is none of the recipe's models "
                                                              f"({', '.join(sorted(map(str, aliases)))}): add it to "
                                                              "`models` or use one of those"))
            if column.get("column_type") == "llm-structured" and (problem := _schema_problem(column.get("output_format"))):
                errors.append(FieldError(f"{at}.output_format", problem))
        return errors

    def _source_errors(self) -> list[FieldError]:
        errors = []
        if sum(bool(x) for x in (self.documents, self.seed_dataset, self.seed_hub_dataset)) > 1:
            errors.append(FieldError("seed_dataset", "seed the recipe from documents, a dataset file or a hub dataset: "
                                                     "one of them"))
        if self.seed_hub_dataset and not HUB_ID_RE.fullmatch(str(self.seed_hub_dataset)):
            errors.append(FieldError("seed_hub_dataset", "a hub dataset id such as org/name"))
        if not isinstance(self.seed_hub_split, str) or not SPLIT_RE.fullmatch(self.seed_hub_split):
            errors.append(FieldError("seed_hub_split", "a split name such as train, or train[:500]"))
        for name in ("documents", "seed_dataset"):
            value = getattr(self, name)
            if not value:
                continue
            try:  # user data only: never a run's folder, the database, a cache or the checkout
                paths.resolve_data_ref(data_sources.resolve_source(value, name), paths.allowed_data_roots())
            except DatasetError as exc:
                errors.append(FieldError(exc.field, str(exc)))
            except paths.UnsafePathError as exc:
                errors.append(FieldError(name, f"{exc}: point it at your documents or dataset"))
        if not isinstance(self.chunk_chars, int) or not 200 <= self.chunk_chars <= 20_000:
            errors.append(FieldError("chunk_chars", "characters per document chunk: 200 to 20,000"))
        elif not isinstance(self.overlap_chars, int) or not 0 <= self.overlap_chars < self.chunk_chars // 2:
            errors.append(FieldError("overlap_chars", "characters shared by neighbouring chunks: 0 up to half of "
                                                      "chunk_chars"))
        return errors

    def _model_errors(self) -> list[FieldError]:
        if not isinstance(self.models, list) or not all(isinstance(m, dict) for m in self.models):
            return [FieldError("models", "a list of {alias, source} or {alias, url, model, key_env} objects")]
        errors: list[FieldError] = []
        aliases: set = set()
        for i, model in enumerate(self.models):
            at = f"models[{i}]"
            unknown = sorted(set(model) - set(DEFAULT_MODEL))
            if unknown:
                errors.append(FieldError(f"{at}.{unknown[0]}", f"unknown setting (known: {', '.join(DEFAULT_MODEL)})"))
            alias = model.get("alias")
            if not isinstance(alias, str) or not ALIAS_RE.fullmatch(alias) or alias in aliases:
                errors.append(FieldError(f"{at}.alias", "a name the recipe's columns use (model_alias), unique, "
                                                        "letters, digits, - and _"))
            aliases.add(alias)
            source, url = model.get("source") or "", model.get("url") or ""
            if bool(source) == bool(url):
                errors.append(FieldError(f"{at}.source", "give `source` (a model this studio serves: base:<model> or "
                                                         "run:<id>) or `url` and `model` (an external endpoint)"))
            elif source:
                try:
                    resolve(ModelSource.from_key(str(source)))
                except (SourceError, ValueError) as exc:
                    errors.append(FieldError(f"{at}.source", str(exc)))
            else:
                errors += self._url_errors(at, model)
            errors += _number_errors(at, model)
        return errors

    def _url_errors(self, at: str, model: dict) -> list[FieldError]:
        errors = []
        url, key_env = str(model.get("url")), model.get("key_env") or ""
        if not re.fullmatch(r"https?://[^\s]+", url):
            errors.append(FieldError(f"{at}.url", "the base URL of an OpenAI-compatible endpoint, e.g. "
                                                  "https://api.example.com/v1"))
        elif problem := endpoint.url_problem(url):
            errors.append(FieldError(f"{at}.url", problem))
        if not str(model.get("model") or "").strip():
            errors.append(FieldError(f"{at}.model", "the model name the endpoint should use"))
        if key_env and not (isinstance(key_env, str) and ENV_NAME_RE.fullmatch(key_env)):
            errors.append(FieldError(f"{at}.key_env", "the NAME of an environment variable holding the key (e.g. "
                                                      "TEACHER_API_KEY), never the key itself"))
        elif key_env and (problem := endpoint.key_env_problem(key_env)):
            errors.append(FieldError(f"{at}.key_env", problem))
        return errors


def _number_errors(at: str, model: dict) -> list[FieldError]:
    limits = {"max_parallel_requests": (1, 64, int), "temperature": (0.0, 2.0, float), "max_tokens": (1, 16384, int),
              "timeout_s": (5, 3600, int)}
    errors = []
    for name, (low, high, kind) in limits.items():
        value = model.get(name, DEFAULT_MODEL[name])
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (kind is float or isinstance(value, int))
        if not ok or not low <= value <= high:
            errors.append(FieldError(f"{at}.{name}", f"{name}: {low} to {high}"))
    return errors


def _schema_problem(schema: Any) -> str | None:
    """Why an llm-structured column's output_format is not a JSON Schema the teacher's answers can be checked by (a
    text: a pydantic model's dotted name or JSON, which Data Designer reads and names what is wrong with)."""
    if isinstance(schema, str):
        return None
    if not isinstance(schema, dict):
        return "a JSON Schema object, e.g. {type: object, properties: {answer: {type: string}}, required: [answer]}"
    return reward_spec.schema_problem(schema)


def _model_label(model: dict) -> str:
    if model.get("source"):
        return f"{model.get('alias')}: {str(model['source']).removeprefix('base:')}"
    return f"{model.get('alias')}: {model.get('model')} @ {str(model.get('url'))[:60]}"
