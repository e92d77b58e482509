"""The API tests' worker: a training job runs tests/fake_worker.py (and leaves an adapter_config.json where the
adapter goes); a serve job answers chat requests without a
model: ``echo <model>: <last user message>`` from a real HTTP server on loopback that checks the job's key against
its spec's hash (as the serving gate does), writes endpoint.json and reports ready like the real serve worker.
Started by tests.support.FakeLauncher in place of ``-m trainer_core.worker``: ``python fake_jobs.py RUN_DIR``."""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import fake_worker  # noqa: E402
from trainer_core.config import TrainConfig  # noqa: E402
from trainer_core.specs.jobspec import read_spec  # noqa: E402
from trainer_core.protocol import control  # noqa: E402
from trainer_core.protocol import events as ev  # noqa: E402
from trainer_core.protocol.status import JobKind, read_kind  # noqa: E402
from trainer_core.serving import endpoint  # noqa: E402
from trainer_core.serving.spec import hash_key  # noqa: E402

SERVED_NAME = "served-model"


def serve(run_dir: Path) -> int:
    spec = read_spec(run_dir)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            key = self.headers.get("Authorization", "").removeprefix("Bearer ")
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if hash_key(key) != spec.api_key_hash:
                return self._send(401, {"error": {"message": "bad key", "type": "auth", "param": None, "code": None}})
            text = f"echo {body['model']}: {body['messages'][-1]['content']}"
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for word in text.split(" "):
                    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                return None
            return self._send(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                                    "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant", "content": text}}],
                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    out = ev.EventWriter(run_dir / "events.jsonl")
    out.emit(ev.StatusEvent(status="starting", phase="loading the models"))
    endpoint.write(run_dir, url, [{"name": SERVED_NAME, "label": "served", "source_key": spec.sources[0].key}],
                   "transformers", __import__("os").getpid())
    out.emit(ev.ServeReadyEvent(url=url, models={SERVED_NAME: "served"}, engine="transformers"))
    while control.read(run_dir) is None:
        time.sleep(0.05)
    endpoint.remove(run_dir)
    out.emit(ev.CompleteEvent(status="stopped"))
    out.close()
    server.shutdown()
    return 0


def train(run_dir: Path) -> int:
    """The fake training worker, with the adapter folder a serve job resolves and a continuing run starts from (its
    config as peft writes it, of the run's rank; written first: it is there when the run is seen completed)."""
    cfg = TrainConfig.from_yaml((run_dir / "config.yaml").read_text())
    if not cfg.effective_use_lora:  # a full fine-tune saves the whole model
        (run_dir / "model").mkdir(exist_ok=True)
        (run_dir / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
        return fake_worker.main(run_dir)
    (run_dir / "adapter").mkdir(exist_ok=True)
    (run_dir / "adapter" / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": cfg.lora_r, "lora_alpha": cfg.lora_alpha, "task_type": "CAUSAL_LM"}))
    return fake_worker.main(run_dir)


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    sys.exit(serve(folder) if read_kind(folder) is JobKind.SERVE else train(folder))
