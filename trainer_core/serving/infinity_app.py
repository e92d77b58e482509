"""The embedding server: infinity-emb's own FastAPI app behind our key gate, run by uvicorn.

It runs in the embedding venv (.venv-embed: infinity-emb 0.0.78 pins transformers < 4.58, which the studio's venv
cannot hold), started by the serve worker (worker/serve.py) as ``<embed python> infinity_app.py <launch.json>``.
That venv does not have the studio installed, so the only studio code it runs is gate.py (standard library and
Pillow), loaded here by its path; the gate's config comes from the file named by GATE_ENV, as for vLLM.

launch.json: {"models": [{"name": served name, "folder": sentence-transformers folder}], "host", "port",
"device", "tls_certfile", "tls_keyfile"}. Nothing at module level needs infinity: the studio imports this module
only to know its path.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

GATE_MODULE = "finetune_studio_gate"


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

    launch = json.loads(Path(argv[1]).read_text())
    tls = {"ssl_certfile": launch["tls_certfile"], "ssl_keyfile": launch["tls_keyfile"]} \
        if launch.get("tls_certfile") else {}
    uvicorn.run(build_app(launch), host=launch["host"], port=int(launch["port"]), log_level="warning",
                access_log=False, lifespan="on", timeout_graceful_shutdown=5, **tls)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
