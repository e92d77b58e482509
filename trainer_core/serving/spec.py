"""The ``serve`` job's spec: which model sources to serve, where, with which key hash, and for how long.

A serve job runs an existing OpenAI-compatible server (``transformers serve``, or vLLM on a CUDA host with
the ``vllm`` extra) in its own worker process, behind our key gate (serving/gate.py). The API key itself is
never stored: the spec holds its sha256 only. Nothing here imports the ML stack.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from trainer_core import hardware
from trainer_core.config import FieldError
from trainer_core.jobspec import JobSpec, ModelSource, ResolvedSource, SourceError, memory_errors, register, resolve
from trainer_core.protocol.status import JobKind

MAX_SOURCES = 8
PURPOSES = ("playground", "endpoint")
ENGINES = ("auto", "transformers", "vllm")
TRANSFORMERS, VLLM = "transformers", "vllm"
IDLE_MIN_S, IDLE_MAX_S = 5, 7 * 24 * 3600
DEFAULT_IDLE_S = 1800
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
    (LoRA) on it; full fine-tunes of their own and several bases need the transformers engine."""
    if any(r.model_dir is not None for r in resolved):
        return "a full fine-tune is a model of its own: vLLM serves one base with adapters"
    bases = {r.base_model for r in resolved}
    if len(bases) > 1:
        return f"the sources have {len(bases)} different base models: vLLM serves one base with adapters"
    return ""


def choose_serve_engine(requested: str, resolved: list[ResolvedSource]) -> str:
    """The serving engine, chosen here only (like training's engines.choose_engine): vLLM on a CUDA host
    with the ``vllm`` extra installed when the sources fit one vLLM server, transformers serve otherwise."""
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
        if self.purpose not in PURPOSES:
            errors.append(FieldError("purpose", f"one of {', '.join(PURPOSES)}, not {self.purpose!r}"))
        if self.engine not in ENGINES:
            errors.append(FieldError("engine", f"one of {', '.join(ENGINES)}, not {self.engine!r}"))
        elif self.engine == VLLM:
            if not (hardware.cuda_available() and hardware.has_module("vllm")):
                errors.append(FieldError("engine", "vLLM needs a CUDA GPU and the vllm extra "
                                                   "(pip install -e '.[vllm]'); use auto or transformers"))
            elif resolved and vllm_fits(resolved):
                errors.append(FieldError("engine", vllm_fits(resolved) + "; use auto or transformers"))
        if not errors:  # every source loads as a model of its own (merged adapters included)
            errors += memory_errors(self.sources, self.gpu_ids, "serve")
        return errors
