"""What the studio's serving path costs over the engine called directly, on the same greedy request.

    .venv/bin/python bench/chat_latency.py [--rounds 8] [--tokens 64] [--models DIR]

(a) studio: ``Orchestrator.start_server`` -> serve job (worker process: transformers serve's app behind
    our key gate) <- ``serving.client.stream_chat`` from this process;
(b) engine: the same transformers serve app, built by the same function, run by uvicorn in a process of
    its own without our gate, read by the same client code (``ChatStream``) with the body the gate would
    have forwarded;
(c) bare: ``model.generate`` with a ``TextIteratorStreamer`` in a process of its own (no HTTP at all).

All three hold the bundled model in float32 on the CPU and answer the same greedy request; rounds are
interleaved (a b c, b c a, c a b, ...) so load from other processes hits every side alike. Time to first
token is measured from sending the request (for (c), from calling generate) to the first text piece;
tokens/s is the decode rate after it, (tokens - 1) / (total - ttft). The bench process plays the
dashboard: it never imports torch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make trainer_core and db importable

PROMPT = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]

ENGINE_SERVER = """
import socket, sys, uvicorn
from trainer_core.worker.serve import build_transformers_app
folder, port = sys.argv[1], int(sys.argv[2])
app, manager = build_transformers_app("cpu")
manager.load_model_and_processor(manager.process_model_name(folder))
sock = socket.create_server(("127.0.0.1", port))
print("ready", flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
"""

BARE = """
import json, sys, threading, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer
folder, tokens = sys.argv[1], int(sys.argv[2])
messages = json.loads(sys.argv[3])
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
print("ready", flush=True)
for line in sys.stdin:
    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
    start = time.perf_counter()
    thread = threading.Thread(target=model.generate, kwargs=dict(**inputs, streamer=streamer, max_new_tokens=tokens,
                              do_sample=False))
    thread.start()
    first, pieces, text = None, 0, ""
    for piece in streamer:
        if piece:
            first = first or time.perf_counter()
            pieces += 1
            text += piece
    thread.join()
    total = time.perf_counter() - start
    print(json.dumps({"ttft_s": first - start, "total_s": total, "pieces": pieces, "text": text}), flush=True)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rate(tokens: int, ttft: float, total: float) -> float:
    return (tokens - 1) / (total - ttft) if tokens > 1 and total > ttft else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process (OMP_NUM_THREADS); 1 on a small shared machine, where "
                             "idle OpenMP threads of the other sides stall the one being measured")
    parser.add_argument("--models", default=str(ROOT / ".test-cache" / "models"),
                        help="converted-model cache (FINETUNE_STUDIO_MODELS) holding SmolLM2-135M-Instruct")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="chat-latency-"))
    os.environ.update(FINETUNE_STUDIO_HOME=str(home), FINETUNE_STUDIO_MODELS=args.models,
                      FINETUNE_STUDIO_FORCE_CPU="1", OMP_NUM_THREADS=str(args.threads))  # every side inherits it
    os.environ.pop("DATABASE_URL", None)

    from db.store import Store
    from trainer_core.config import BUNDLED_MODEL
    from trainer_core.jobs.orchestrator import Orchestrator
    from trainer_core.specs.model_source import ModelSource
    from trainer_core.serving.client import ChatStream, Sampling, stream_chat
    from trainer_core.serving.gate import GateConfig, KeyGate

    folder = Path(args.models) / "SmolLM2-135M-Instruct"
    sampling = Sampling(max_new_tokens=args.tokens)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    orch = Orchestrator(store=Store())
    job_id, key = orch.start_server([ModelSource(model=BUNDLED_MODEL)], idle_timeout_s=600)  # ends if we are killed
    port = free_port()
    engine = subprocess.Popen([sys.executable, "-c", ENGINE_SERVER, str(folder), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    bare = subprocess.Popen([sys.executable, "-c", BARE, str(folder), str(args.tokens), json.dumps(PROMPT)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().strip() == "ready" and bare.stdout.readline().strip() == "ready"
        while (endpoint := orch.endpoint(job_id)) is None:
            run = orch.get_run(job_id)
            if run.status.is_terminal():
                raise SystemExit(f"the serve job failed: {run.error}")
            time.sleep(0.2)
        name = endpoint.models[0].name
        engine_url = f"http://127.0.0.1:{port}/v1"
        # The body our gate forwards to the engine, with the engine's own model path in it.
        gate = KeyGate(None, GateConfig(key_hash="", models={str(folder): str(folder)}))
        from trainer_core.serving.client import chat_body

        engine_body = gate._rewrite(chat_body(str(folder), PROMPT, sampling))

        def studio():
            stream = stream_chat(endpoint.url, key, name, PROMPT, sampling, timeout_s=120)
            text = "".join(stream)
            return stream.stats.ttft_s, stream.stats.total_s, stream.stats.tokens, text

        def direct():
            stream = ChatStream(engine_url, "", str(folder), engine_body, 120, None)
            text = "".join(stream)
            return stream.stats.ttft_s, stream.stats.total_s, stream.stats.tokens, text

        def bare_generate():
            bare.stdin.write("go\n")
            bare.stdin.flush()
            out = json.loads(bare.stdout.readline())
            return out["ttft_s"], out["total_s"], None, out["text"]

        sides = {"a": studio, "b": direct, "c": bare_generate}
        for fn in sides.values():  # warm-up: first calls pay for lazy initialisation
            fn()
        results: dict[str, list[tuple]] = {k: [] for k in sides}
        order = list(sides)
        for r in range(args.rounds):
            for side in order[r % 3:] + order[:r % 3]:
                results[side].append(sides[side]())
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{s} ttft {results[s][-1][0] * 1000:.0f} ms" for s in order), file=sys.stderr, flush=True)
        texts = {side: {row[3] for row in rows} for side, rows in results.items()}
        tokens = results["a"][0][2]
        print(f"{args.rounds} interleaved rounds, {tokens} greedy tokens, bundled SmolLM2-135M float32 on CPU, "
              f"{args.threads} torch thread(s) per process")
        med = {}
        for side, label in (("a", "studio (client -> serve job + gate)"), ("b", "engine direct (transformers serve)"),
                            ("c", "bare model.generate + streamer")):
            rows = results[side]
            ttft = statistics.median(r[0] for r in rows)
            tps = statistics.median(rate(r[2] or tokens, r[0], r[1]) for r in rows)
            med[side] = (ttft, tps)
            print(f"({side}) {label:40s} ttft {ttft * 1000:7.1f} ms   {tps:6.1f} tokens/s")
        print(f"a/b: ttft {med['a'][0] / med['b'][0]:.3f}x, tokens/s {med['a'][1] / med['b'][1]:.3f}x   "
              f"b/c: ttft {med['b'][0] / med['c'][0]:.3f}x, tokens/s {med['b'][1] / med['c'][1]:.3f}x")
        same = texts["a"] == texts["b"] == texts["c"] and len(texts["a"]) == 1
        print("answers identical on every side and round:", same)
    finally:
        orch.stop(job_id)
        orch.wait(job_id, timeout=60)
        orch.close()
        for proc in (engine, bare):
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
