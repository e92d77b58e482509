"""The embedding server: infinity-emb's own FastAPI app behind our key gate, run by uvicorn.

It runs in the embedding venv (.venv-embed: infinity-emb 0.0.78 pins transformers < 4.58, which the studio's venv
cannot hold), started by the serve worker (worker/serve.py) as ``<embed python> infinity_app.py <launch.json>``.
That venv does not have the studio installed, so the only studio code it runs is gate.py (standard library and
Pillow), loaded here by its path; the gate's config comes from the file named by GATE_ENV, as for vLLM.

launch.json: {"models": [{"name": served name, "folder": sentence-transformers folder}], "host", "port",
"device", "tls_certfile", "tls_keyfile"}. Nothing at module level needs infinity: the studio imports this module
only to know its path.

A folder the studio's sentence-transformers (>= 5) wrote names its modules where 3.x (the one infinity pins) cannot
import them (``sentence_transformers.base.modules.transformer.Transformer``) and renames their settings, so each such
folder is served from a view in the serve job's own folder (``st3-models/<n>/``): the run's files linked, never
edited, with modules.json and the module configs written as 3.x reads them.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

GATE_MODULE = "finetune_studio_gate"
VIEWS_FOLDER = "st3-models"
LEGACY_PREFIX = "sentence_transformers.models."  # where sentence-transformers 3.x keeps its modules
# sentence-transformers >= 5's pooling_mode values -> 3.x's flags
POOLING_FLAGS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                 "mean": "pooling_mode_mean_tokens", "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                 "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}


class LegacyFolderError(ValueError):
    """A module of the folder has no sentence-transformers 3.x counterpart that computes the same vectors."""


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _transformer(folder: Path, path: str) -> dict[str, object]:
    config = _read(folder / path / "sentence_bert_config.json")
    task = config.get("transformer_task", "feature-extraction")
    modalities = set(config.get("modality_config") or {"text": None})
    if task != "feature-extraction" or modalities != {"text"} or config.get("processing_kwargs"):
        raise LegacyFolderError(f"its transformer ({task}, inputs {', '.join(sorted(modalities))}) is not a plain "
                                "text encoder that sentence-transformers 3.x loads")
    # 3.x takes max_seq_length from the tokenizer's model_max_length (where >= 5 keeps it), capped by the model
    return {os.path.join(path, "sentence_bert_config.json"): {"do_lower_case": False}}


def _pooling(folder: Path, path: str) -> dict[str, object]:
    config = _read(folder / path / "config.json")
    modes = config.get("pooling_mode", "mean")
    modes = [modes] if isinstance(modes, str) else list(modes)
    unknown = [m for m in modes if m not in POOLING_FLAGS]
    if unknown:
        raise LegacyFolderError(f"its pooling mode {', '.join(map(str, unknown))} is unknown to "
                                "sentence-transformers 3.x")
    legacy = {"word_embedding_dimension": config.get("embedding_dimension", config.get("word_embedding_dimension")),
              **{flag: mode in modes for mode, flag in POOLING_FLAGS.items()},
              "include_prompt": config.get("include_prompt", True)}
    return {os.path.join(path, "config.json"): legacy}


def _normalize(folder: Path, path: str) -> dict[str, object]:
    return {}  # 3.x's Normalize reads no file


def _dense(folder: Path, path: str) -> dict[str, object]:
    config = _read(folder / path / "config.json")
    if config.get("use_residual") or config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise LegacyFolderError("its Dense layer (a residual, or one on token embeddings) is unknown to "
                                "sentence-transformers 3.x")
    keep = ("in_features", "out_features", "bias", "activation_function")
    return {os.path.join(path, "config.json"): {k: config[k] for k in keep if k in config}}


# class name -> (folder, module path) -> {file in the view: the JSON 3.x reads there}
TRANSLATIONS = {"Transformer": _transformer, "Pooling": _pooling, "Normalize": _normalize, "Dense": _dense}


def _modern(type_ref: str) -> bool:
    """A module type sentence-transformers >= 4 wrote (custom code, not sentence_transformers', is left alone)."""
    return type_ref.startswith("sentence_transformers.") and not type_ref.startswith(LEGACY_PREFIX)


def legacy_view(folder: Path, view: Path) -> Path:
    """``folder`` itself when sentence-transformers 3.x loads it, else ``view``: its files linked and the JSON that
    names and configures its modules written as 3.x reads them. LegacyFolderError names a module it cannot
    translate."""
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8")) \
        if (folder / "modules.json").is_file() else []
    if not any(_modern(m.get("type", "")) for m in modules):
        return folder
    written: dict[str, object] = {}
    for module in modules:
        if not _modern(module["type"]):
            continue
        name = module["type"].rpartition(".")[2]
        if name not in TRANSLATIONS:
            raise LegacyFolderError(f"{folder}: its module {module['type']} has no sentence-transformers 3.x "
                                    "counterpart (the embedding server's version)")
        try:
            written.update(TRANSLATIONS[name](folder, module.get("path", "")))
        except LegacyFolderError as exc:
            raise LegacyFolderError(f"{folder}: {exc}") from None
        module["type"] = LEGACY_PREFIX + name
    written["modules.json"] = modules
    if view.exists():
        shutil.rmtree(view)  # a view of our own from an earlier start (rmtree does not follow the links)
    for root, _, files in os.walk(folder):
        relative = Path(root).relative_to(folder)
        (view / relative).mkdir(parents=True, exist_ok=True)
        for file in files:
            if str(relative / file) not in written:
                # the folder's path as given: that is where the sandbox shows it (a resolved path may not be)
                (view / relative / file).symlink_to(Path(root) / file)
    for file, content in written.items():
        target = view / os.path.normpath(file)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(content, indent=2), encoding="utf-8")
    return view


def with_legacy_views(launch: dict, job_dir: Path) -> dict:
    """The launch with each model folder sentence-transformers 3.x cannot load replaced by its view."""
    models = []
    for number, model in enumerate(launch["models"]):
        folder = legacy_view(Path(model["folder"]), job_dir / VIEWS_FOLDER / str(number))
        if str(folder) != model["folder"]:
            print(f"{model['name']}: serving {model['folder']} through {folder} (its modules as "
                  "sentence-transformers 3.x names them)", file=sys.stderr, flush=True)
        models.append({**model, "folder": str(folder)})
    return {**launch, "models": models}


def load_gate():
    """serving/gate.py as a module of its own (the package around it is not importable in this venv)."""
    spec = importlib.util.spec_from_file_location(GATE_MODULE, Path(__file__).with_name("gate.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[GATE_MODULE] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def build_app(launch: dict):
    """infinity's app for the launch's models (its routes under /v1, as OpenAI's), wrapped by the key gate."""
    from infinity_emb.args import EngineArgs
    from infinity_emb.infinity_server import create_server
    from infinity_emb.primitives import Device, InferenceEngine

    engines = [EngineArgs(model_name_or_path=m["folder"], served_model_name=m["name"], engine=InferenceEngine.torch,
                          device=Device[launch.get("device", "cpu")], bettertransformer=False, model_warmup=False,
                          # infinity's default is True: a folder's auto_map code would run with no one opting in
                          trust_remote_code=bool(m.get("trust_remote_code", False)))
               for m in launch["models"]]
    # api_key "": the gate checks the key before infinity sees the request (and infinity never learns it)
    app = create_server(engine_args_list=engines, url_prefix="/v1", api_key="", preload_only=False,
                        permissive_cors=False, redirect_slash="")
    return load_gate().KeyGate(app)


def main(argv: list[str]) -> int:
    import uvicorn

    launch_file = Path(argv[1])
    try:
        launch = with_legacy_views(json.loads(launch_file.read_text()), launch_file.parent)
    except LegacyFolderError as exc:
        print(f"cannot serve {exc}", file=sys.stderr, flush=True)
        return 3
    tls = {"ssl_certfile": launch["tls_certfile"], "ssl_keyfile": launch["tls_keyfile"]} \
        if launch.get("tls_certfile") else {}
    uvicorn.run(build_app(launch), host=launch["host"], port=int(launch["port"]), log_level="warning",
                access_log=False, lifespan="on", timeout_graceful_shutdown=5, **tls)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
