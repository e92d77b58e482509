"""The ``serve`` job's spec: which model sources to serve, where, with which key hash, and for how long.

A serve job runs an existing OpenAI-compatible server (``transformers serve``, or vLLM on a CUDA host with
the ``vllm`` extra; infinity-emb for embedding models, from its own virtual environment) in its own worker
process, behind our key gate (serving/gate.py). The API key itself is
never stored: the spec holds its sha256 only. Nothing here imports the ML stack.

Kept whole: ServeSpec's validation of sources, engine and limits, which must agree with the gate's routes and the
worker's engine choice.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import psutil

from trainer_core import kinds
from trainer_core.host import hardware
from trainer_core.config import FieldError
from trainer_core.specs.model_source import ModelSource, ResolvedSource, SourceError, memory_errors, resolve
from trainer_core.specs.jobspec import JobSpec, register
from trainer_core.launchers import ray as ray_jobs
from trainer_core.protocol import paths
from trainer_core.protocol.status import JobKind

MAX_SOURCES = 8
PURPOSES = ("playground", "endpoint")
ENGINES = ("auto", "transformers", "vllm", "infinity")
TRANSFORMERS, VLLM, INFINITY = "transformers", "vllm", "infinity"
# infinity-emb (the embedding server) pins transformers < 4.58 and sentence-transformers < 4, so it lives in a
# virtual environment of its own beside the studio's (`make install` builds it; the Makefile pins its versions).
EMBED_VENV_ENV = "FINETUNE_STUDIO_EMBED_VENV"
EMBED_INSTALL_FIX = ("the embedding server (infinity-emb) is not installed: run `make install`, which builds "
                     ".venv-embed/ beside the studio's venv (or point FINETUNE_STUDIO_EMBED_VENV at a venv with "
                     "infinity-emb[server,torch]==0.0.78)")
IDLE_MIN_S, IDLE_MAX_S = 5, 7 * 24 * 3600
DEFAULT_IDLE_S = 1800
DEFAULT_MAX_TOKENS_CAP, MAX_TOKENS_CAP_MAX = 2048, 1 << 20
DEFAULT_REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_MIN_S, REQUEST_TIMEOUT_MAX_S = 300, 5, 24 * 3600
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def host_problem(host: str) -> str:
    """Why ``host`` cannot be a bind address ("" when it can)."""
    if not isinstance(host, str) or not host:
        return "an IP address such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface), or a host name"
    try:
        ipaddress.ip_address(host)
        return ""
    except ValueError:
        pass
    if _HOSTNAME_RE.fullmatch(host):
        return ""
    return f"{host[:60]!r} is neither an IP address nor a host name; use 127.0.0.1 (this machine only) or 0.0.0.0"


WILDCARDS = ("0.0.0.0", "::")  # every interface


def is_loopback(host: str) -> bool:
    """Whether a bind address only this machine can reach ("localhost" included)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_http_warning(host: str) -> str:
    """What to tell whoever binds a server without TLS to ``host`` ("" for loopback)."""
    if is_loopback(host):
        return ""
    return (f"{host} is reachable from the network and the server speaks plain HTTP: the API key and every "
            "prompt and answer cross the network unencrypted. Give it a TLS certificate (tls_certfile and "
            "tls_keyfile; --tls-cert/--tls-key on the CLI), put it behind an HTTPS proxy, or keep it on 127.0.0.1 "
            "and reach it through the studio's shared URL (make share) or an SSH tunnel.")


# A server on a Ray node listens on the node's network address: the advice above (keep it on 127.0.0.1) does not apply.
CLUSTER_PLAIN_HTTP = ("On the cluster the endpoint listens on a node's network address and speaks plain HTTP: the API "
                      "key and every prompt and answer cross the cluster's network unencrypted. Give it a TLS "
                      "certificate (tls_certfile and tls_keyfile, on the shared storage; --tls-cert/--tls-key on the "
                      "CLI) where that network is not trusted.")


def consumer_token() -> str:
    """This process as a serve job's consumer: "host:pid:start time" (pids are reused; the start time is not)."""
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def parse_consumer(token: str) -> tuple[str, int, float] | None:
    """(host, pid, start time) of a consumer token, None when it is not one."""
    try:
        host, pid, started = token.rsplit(":", 2)
        return host, int(pid), float(started)
    except (AttributeError, ValueError):
        return None


def consumer_gone(token: str) -> str:
    """Why the consumer named by ``token`` is gone: "" while it runs (or when it runs on another host, which
    cannot be checked)."""
    parsed = parse_consumer(token)
    if parsed is None:
        return "the process that asked for it cannot be identified"
    host, pid, started = parsed
    if host != socket.gethostname():
        return ""
    try:
        alive = abs(psutil.Process(pid).create_time() - started) < 1.0
    except psutil.Error:
        alive = False
    return "" if alive else f"the process that asked for it (pid {pid}) has exited"


def embed_python() -> Path:
    """The Python of the embedding server's venv: FINETUNE_STUDIO_EMBED_VENV, else .venv-embed beside this venv."""
    venv = os.environ.get(EMBED_VENV_ENV) or str(Path(sys.prefix).parent / ".venv-embed")
    return Path(venv) / "bin" / "python"


def is_embedding(resolved: ResolvedSource) -> bool:
    """Whether the source turns text into vectors: a run of the embedding method, the bundled all-MiniLM-L6-v2,
    or a sentence-transformers folder (modules.json) as a base model."""
    if resolved.config is not None:
        return resolved.output == "embedding"
    from trainer_core.evaluation.retrieval import is_embedding_model  # reads config files only

    return is_embedding_model(resolved.base_model) is True


def embedding_folder(resolved: ResolvedSource) -> Path:
    """The sentence-transformers folder infinity loads for an embedding source (a run's saved model, the bundled
    model's folder, or a base model's folder under the allowed roots)."""
    from trainer_core.methods import embedding

    if resolved.model_dir is not None:
        return resolved.model_dir
    if resolved.base_model.strip() == embedding.BUNDLED_MODEL:
        folder = embedding.bundled_model_dir()
        if folder is None:
            raise SourceError(embedding.BUNDLED_FIX, "model")
        return folder
    return paths.resolve_inside(resolved.base_model.strip(), paths.allowed_data_roots())


def embedding_problem(resolved: ResolvedSource) -> str | None:
    """Why an embedding source cannot be served by infinity (None when it can)."""
    if resolved.adapter_dir is not None:  # the export does not merge an embedding adapter either
        return resolved.not_a_writer("served at /v1/embeddings from its LoRA adapter (infinity loads whole "
                                     "sentence-transformers folders): train it with adapter full to serve it")
    if not embed_python().exists():
        return EMBED_INSTALL_FIX
    return None


def served_names(resolved: list[ResolvedSource]) -> list[str]:
    """The model name each source is served under: its ``served_name``, made unique with -2, -3, ..."""
    names: list[str] = []
    for item in resolved:
        name, n = item.served_name, 2
        while name in names:
            name, n = f"{item.served_name}-{n}", n + 1
        names.append(name)
    return names


def adapter_rank(adapter_dir: Path) -> int:
    try:
        return int(json.loads((adapter_dir / "adapter_config.json").read_text()).get("r", 0))
    except (OSError, ValueError, TypeError):
        return 0


def vllm_fits(resolved: list[ResolvedSource]) -> str:
    """Why vLLM cannot serve these sources in one server ("" when it can): one base model, with adapters
    (LoRA) on it; full fine-tunes of their own and several bases need the transformers engine, and so do speech
    models (transformers serve's /v1/audio/transcriptions)."""
    if any(is_embedding(r) for r in resolved):
        return kinds.get("embedding").vllm
    refused = next((r.kind.vllm for r in resolved if r.kind.vllm), "")  # the row says why (and what serves it)
    if refused:
        return refused
    if any(r.model_dir is not None for r in resolved):
        return "a full fine-tune is a model of its own: vLLM serves one base with adapters"
    bases = {r.base_model for r in resolved}
    if len(bases) > 1:
        return f"the sources have {len(bases)} different base models: vLLM serves one base with adapters"
    return ""


def serve_problem(resolved: ResolvedSource) -> str | None:
    """Why ``resolved`` cannot be served (None when it can): it writes answers, transcribes or embeds, or it cannot."""
    if is_embedding(resolved):
        return embedding_problem(resolved)
    kind = resolved.kind
    if kind.served:
        return None
    return resolved.not_a_writer(kind.not_served or "served")


def choose_serve_engine(requested: str, resolved: list[ResolvedSource]) -> str:
    """The serving engine, chosen here only (like training's engines.choose_engine): vLLM on a CUDA host
    with the ``vllm`` extra installed when the sources fit one vLLM server, transformers serve otherwise; infinity
    for embedding models (ServeSpec.validate refuses another engine for them)."""
    if resolved and all(is_embedding(r) for r in resolved):
        return INFINITY
    if requested == TRANSFORMERS:
        return TRANSFORMERS
    usable = hardware.cuda_available() and hardware.has_module("vllm")
    if requested == VLLM:
        return VLLM
    return VLLM if usable and not vllm_fits(resolved) else TRANSFORMERS


@register
@dataclass
class ServeSpec(JobSpec):
    """Serve up to MAX_SOURCES model sources over one OpenAI-compatible API."""

    KIND: ClassVar[JobKind] = JobKind.SERVE
    sources: list[ModelSource] = field(default_factory=list)
    host: str = "127.0.0.1"  # loopback: only this machine; 0.0.0.0 for teammates on the network
    port: int = 0  # 0: a free port picked when the server starts (endpoint.json says which)
    api_key_hash: str = ""  # sha256 hex of the API key; the key is shown once and never stored
    idle_timeout_s: int = DEFAULT_IDLE_S  # the server ends after this long without a request; 0 = never
    engine: str = "auto"  # auto | transformers | vllm (auto: vLLM on a CUDA host with the vllm extra)
    purpose: str = "playground"  # playground (the dashboard's own) | endpoint (for teammates)
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP  # the longest answer one request may ask for (tokens)
    request_timeout_s: int = DEFAULT_REQUEST_TIMEOUT_S  # a request still running after this long is ended; 0 = never
    tls_certfile: str = ""  # a PEM certificate (under the allowed roots): the server speaks HTTPS
    tls_keyfile: str = ""  # its PEM private key (under the allowed roots)
    consumer: str = ""  # "host:pid:start" of the process whose exit ends this job (a CLI's serve/chat); "" = none
    # "local": on this host; "ray": a single-worker Ray job on the server's cluster (RAY_ADDRESS), listening on its
    # node's cluster address (host 127.0.0.1, the default) or every interface of the node (0.0.0.0), behind the same
    # key gate; endpoint.json in the job folder on the shared storage says where (docs/ray.md).
    launcher: str = "local"
    ray_gpus_per_worker: float = 0.0  # launcher ray: the GPUs Ray gives the server on its node (0: it serves on CPU)
    # Keep each chat completion (request and answer) in the job folder, so the app using the endpoint can rate it
    # (POST /v1/feedback with the same key) and the ratings become votes (docs/feedback.md); off unless asked for.
    store_completions: bool = False

    def model_sources(self) -> list[ModelSource]:
        return list(self.sources) if isinstance(self.sources, list) else []

    def __post_init__(self) -> None:
        if self.sources and isinstance(self.sources[0], ModelSource):
            self.source = self.sources[0]

    @property
    def model_label(self) -> str:
        return ", ".join(s.key for s in self.sources)[:500]

    def resolved(self) -> list[ResolvedSource]:
        """Every source found on disk (SourceError for the first that is not)."""
        return [resolve(s) for s in self.sources]

    def validate(self) -> list[FieldError]:
        errors = super().validate()  # name, devices, and sources[0] (the inherited ``source``)
        if not self.sources:
            errors.append(FieldError("sources", "pick at least one model source to serve"))
        elif len(self.sources) > MAX_SOURCES:
            errors.append(FieldError("sources", f"at most {MAX_SOURCES} model sources in one server, "
                                                f"not {len(self.sources)}"))
        keys = [s.key for s in self.sources if isinstance(s, ModelSource)]
        if len(set(keys)) != len(keys):
            errors.append(FieldError("sources", "a model source is listed twice: list each once"))
        resolved = []
        for i, source in enumerate(self.sources[:MAX_SOURCES]):
            if not isinstance(source, ModelSource):
                errors.append(FieldError(f"sources[{i}]", "a model source (base, run or checkpoint)"))
                continue
            try:
                resolved.append(resolve(source))
            except SourceError as exc:
                if i > 0:  # sources[0] is ``source``: the base class reported it
                    errors.append(FieldError(exc.field, str(exc)))
                continue
            # the server answers chat and completion requests, and transcription requests for a speech model
            problem = serve_problem(resolved[-1])
            if problem:
                errors.append(FieldError("source" if i == 0 else f"sources[{i}]", problem))
        embedders = [r.served_name for r in resolved if is_embedding(r)]
        if embedders and len(embedders) != len(resolved):
            errors.append(FieldError("sources", f"embedding models ({', '.join(embedders)}) and models that write "
                                                "answers or transcribe cannot share one server (infinity serves the "
                                                "first, transformers serve or vLLM the others): start one server for "
                                                "the embedding models and another for the rest"))
        problem = host_problem(self.host)
        if problem:
            errors.append(FieldError("host", problem))
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not (self.port == 0 or 1024 <= self.port <= 65535):
            errors.append(FieldError("port", f"0 (pick a free port) or a port from 1024 to 65535, not {self.port!r}"))
        if not isinstance(self.api_key_hash, str) or not re.fullmatch(r"[0-9a-f]{64}", self.api_key_hash):
            errors.append(FieldError("api_key_hash", "the sha256 hex digest of the API key (64 hex digits); "
                                                     "start servers through Orchestrator.start_server"))
        timeout = self.idle_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int) or not (timeout == 0 or IDLE_MIN_S <= timeout <= IDLE_MAX_S):
            errors.append(FieldError("idle_timeout_s", f"0 (never) or {IDLE_MIN_S} to {IDLE_MAX_S:,} seconds, "
                                                       f"not {timeout!r}"))
        cap = self.max_tokens_cap
        if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_TOKENS_CAP_MAX:
            errors.append(FieldError("max_tokens_cap", f"a whole number of tokens from 1 to {MAX_TOKENS_CAP_MAX:,}, "
                                                       f"not {cap!r:.40}"))
        limit = self.request_timeout_s
        if isinstance(limit, bool) or not isinstance(limit, int) or \
                not (limit == 0 or REQUEST_TIMEOUT_MIN_S <= limit <= REQUEST_TIMEOUT_MAX_S):
            errors.append(FieldError("request_timeout_s", f"0 (never) or {REQUEST_TIMEOUT_MIN_S} to "
                                                          f"{REQUEST_TIMEOUT_MAX_S:,} seconds, not {limit!r:.40}"))
        errors += self._tls_errors()
        errors += self._ray_errors()
        if not isinstance(self.consumer, str) or (self.consumer and parse_consumer(self.consumer) is None):
            errors.append(FieldError("consumer", "empty, or the host:pid:start of the process the job serves; "
                                                 "start servers through Orchestrator.start_server"))
        if self.purpose not in PURPOSES:
            errors.append(FieldError("purpose", f"one of {', '.join(PURPOSES)}, not {self.purpose!r}"))
        if self.engine not in ENGINES:
            errors.append(FieldError("engine", f"one of {', '.join(ENGINES)}, not {self.engine!r}"))
        elif embedders and self.engine not in ("auto", INFINITY):
            errors.append(FieldError("engine", f"embedding models are served by infinity, not {self.engine}: use "
                                               "auto or infinity"))
        elif self.engine == INFINITY and resolved and not embedders:
            errors.append(FieldError("engine", "infinity serves embedding models only: use auto, transformers or "
                                               "vllm"))
        elif self.engine == VLLM and self.launcher == "ray":  # the node has the GPU, not this host
            if not (isinstance(self.ray_gpus_per_worker, (int, float)) and self.ray_gpus_per_worker > 0):
                errors.append(FieldError("engine", "vLLM needs a GPU, and on the cluster the server gets one only when "
                                                   "it asks: set ray_gpus_per_worker to 1, or use auto or transformers"))
            elif resolved and vllm_fits(resolved):
                errors.append(FieldError("engine", vllm_fits(resolved) + "; use auto or transformers"))
        elif self.engine == VLLM:
            if not (hardware.cuda_available() and hardware.has_module("vllm")):
                errors.append(FieldError("engine", "vLLM needs a CUDA GPU and the vllm extra "
                                                   "(pip install -e '.[vllm]'); use auto or transformers"))
            elif resolved and vllm_fits(resolved):
                errors.append(FieldError("engine", vllm_fits(resolved) + "; use auto or transformers"))
        if not errors and self.launcher != "ray":  # on the cluster Ray places the job: this host's memory says nothing
            errors += memory_errors(self.sources, self.gpu_ids, "serve")
        return errors

    def _ray_errors(self) -> list[FieldError]:
        """On the cluster: what spec_problems checks for every job (a cluster, the shared storage, no gpu_ids), a
        bind address a node can have, and TLS files the node can read. A serve job needs no secret (env_names)."""
        errors = ray_jobs.spec_problems(self)  # ray_gpus_per_worker too
        if self.launcher != "ray":
            return errors
        if isinstance(self.host, str) and not (is_loopback(self.host) or self.host in WILDCARDS):
            errors.append(FieldError("host", f"Ray places the server on a node, so {self.host[:60]!r} cannot be bound "
                                             "there: leave 127.0.0.1 (it listens on the node's cluster address) or "
                                             "use 0.0.0.0 (every interface of the node), or run it on this host "
                                             "(launcher: local)"))
        shared, source = ray_jobs.shared_storage()  # the environment's, else Settings'; none: spec_problems said so
        source = "saved in Settings" if source == "Settings" else source
        for name in ("tls_certfile", "tls_keyfile"):
            value = getattr(self, name)
            if shared and isinstance(value, str) and value and \
                    not Path(value).expanduser().resolve().is_relative_to(Path(shared).resolve()):
                errors.append(FieldError(name, f"launcher: ray: the server reads it on a node of the cluster, and "
                                               f"{value[:200]} is not on the shared storage {shared} "
                                               f"({source}): put it under it"))
        return errors

    def _tls_errors(self) -> list[FieldError]:
        """A certificate and its key come together, as readable files under the allowed roots."""
        errors: list[FieldError] = []
        given = {name: getattr(self, name) for name in ("tls_certfile", "tls_keyfile")}
        for name, value in given.items():
            if not isinstance(value, str):
                errors.append(FieldError(name, f"a file path (text), not {value!r:.40}"))
        if errors or not any(given.values()):
            return errors
        for name, value in given.items():
            other = "tls_keyfile" if name == "tls_certfile" else "tls_certfile"
            if not value:
                errors.append(FieldError(name, f"{other} is set: give both the certificate and its private key"))
                continue
            try:
                path = paths.resolve_inside(value, paths.allowed_data_roots())
            except paths.UnsafePathError as exc:
                errors.append(FieldError(name, f"{exc}: put the file under the data root or an allowed folder"))
                continue
            if not path.is_file():
                errors.append(FieldError(name, f"{value[:200]} is not a file: give the path of a PEM file"))
            elif not os.access(path, os.R_OK):
                errors.append(FieldError(name, f"{value[:200]} cannot be read by this user: check its permissions"))
        return errors

    @property
    def scheme(self) -> str:
        return "https" if self.tls_certfile else "http"


COMPLETIONS_FILE = "completions.jsonl"  # in the serve job's folder, when store_completions is on
FEEDBACK_FILE = "feedback.jsonl"  # ratings posted to the endpoint's /v1/feedback


def feedback_files(run_dir: Path, spec: ServeSpec) -> dict[str, str]:
    """The gate's completions_file and feedback_file for a serve job (empty unless it stores completions)."""
    if not spec.store_completions:
        return {}
    return {"completions_file": str(run_dir / COMPLETIONS_FILE), "feedback_file": str(run_dir / FEEDBACK_FILE)}
