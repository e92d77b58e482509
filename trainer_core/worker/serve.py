"""The serve worker: one process per serve job, running an existing OpenAI-compatible server.

Lifecycle, top to bottom: read the spec, resolve every model source, bind the port (a port in use is a
clear error at once), make each source a plain model folder (an adapter is merged once into its run's
``serving/`` folder, since transformers serve cannot load adapter folders), expose the folders under their
served names in ``models/``, then serve until Stop/Cancel, SIGTERM or the idle timeout:

* transformers (default, CPU): transformers serve's own FastAPI app (its ``build_server``), run by uvicorn
  in this process on the bound socket, wrapped by our key gate (serving/gate.py);
* vLLM (CUDA host with the ``vllm`` extra): ``vllm serve BASE --enable-lora --lora-modules ...`` as a child
  process, with the same gate added through vLLM's ``--middleware`` (the key is never on its command line:
  the gate reads the key's hash from a file named in its environment);
* infinity (embedding models): infinity-emb's app from its own venv (.venv-embed), started as a child process by
  serving/infinity_app.py, which wraps it in the same gate (configured through the same file) and serves
  POST /v1/embeddings.

When it listens, ``endpoint.json`` (url, models, engine, pid; never the key) is written in the job folder
and a ``ServeReadyEvent`` emitted. The worker heartbeats like the training worker, so a restarted dashboard
adopts it.

Kept whole: the serve worker's lifecycle around one supervised server process, with the engine choice (transformers
serve, vLLM, infinity) that decides how that process is started.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from trainer_core.auth import access
from trainer_core.host import hardware
from trainer_core.specs.model_source import ResolvedSource, SourceError
from trainer_core.specs.jobspec import read_spec
from trainer_core.protocol import control, events as ev
from trainer_core.protocol.status import RunStatus
from trainer_core.worker import safe_prompt, serve_tools
from trainer_core.worker.job import JobWorker
from trainer_core.serving import endpoint as endpoint_file
from trainer_core.serving.endpoint import NODE_ADDRESS_ENV, NODE_ID_ENV
from trainer_core.serving.gate import ENGINE_DEFAULT_MAX_TOKENS, GATE_ENV, Activity, GateConfig, KeyGate
from trainer_core.serving import infinity_app
from trainer_core.serving.spec import (CLUSTER_PLAIN_HTTP, INFINITY, VLLM, WILDCARDS, ServeSpec, adapter_rank, choose_serve_engine,
                                      consumer_gone, embed_python, embedding_folder, feedback_files, plain_http_warning,
                                      served_names)

WATCH_S = 0.25  # how often Stop/Cancel and the idle timeout are checked
VLLM_READY_S = 900.0  # a large model takes minutes to load into vLLM
INFINITY_READY_S = 300.0  # importing torch and sentence-transformers, then loading the models
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


class Cancelled(Exception):
    pass


class PortInUse(OSError):
    pass


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one). PortInUse names the fix."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        raise OSError(f"cannot bind to {host!r}: {exc.strerror}; use 127.0.0.1 or 0.0.0.0") from None
    try:
        sock = socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        if exc.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
            raise PortInUse(f"port {port} is in use: pick another or 0 (a free port)") from None
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock


def listen_host(spec: ServeSpec) -> str:
    """Where the server binds: the spec's host on this host; on a Ray node, the node's cluster address (its loopback
    would reach nobody: the dashboard host and the clients are elsewhere) unless the spec asks for every interface.
    The key gate runs in front of the engine either way."""
    if spec.launcher != "ray" or spec.host in WILDCARDS:
        return spec.host
    address = os.environ.get(NODE_ADDRESS_ENV, "")
    if not address:
        raise RuntimeError(f"this serve job runs on the Ray cluster but was not told its node's address "
                           f"({NODE_ADDRESS_ENV}): it is started by trainer_core.worker.ray_entry")
    return address


def public_host(host: str) -> str:
    """The host a client uses: loopback for a wildcard bind, brackets around IPv6."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1" if host != "::" else "::1"
    return f"[{host}]" if ":" in host else host


def merged_target(resolved: ResolvedSource) -> Path:
    """Where an adapter source is merged: ``runs/<src>/serving/final`` or ``serving/checkpoint-<step>``."""
    from trainer_core.protocol import paths

    leaf = "final" if resolved.source.checkpoint is None else f"checkpoint-{resolved.source.checkpoint}"
    return paths.run_dir(resolved.source.run_id) / "serving" / leaf


def vllm_command(base: str, base_name: str, adapters: list[tuple[str, Path]], host: str, port: int,
                 max_rank: int, vllm_bin: str = "", extra: list[str] | None = None) -> list[str]:
    """``vllm serve`` for one base model and its LoRA adapters, gated by our KeyGate (no key on argv); ``extra``: the
    chat template and tool-call arguments (serve_tools.vllm_tool_args)."""
    command = [vllm_bin or shutil.which("vllm") or "vllm", "serve", base, "--host", host, "--port", str(port),
               "--served-model-name", base_name, "--middleware", "trainer_core.serving.gate.KeyGate",
               "--disable-uvicorn-access-log"]
    if adapters:
        rank = next((r for r in VLLM_LORA_RANKS if r >= max_rank), VLLM_LORA_RANKS[-1])
        command += ["--enable-lora", "--max-loras", str(len(adapters)), "--max-lora-rank", str(rank),
                    "--lora-modules", *(f"{name}={folder}" for name, folder in adapters)]
    return command + (extra or [])


class ServeWorker(JobWorker):
    def __init__(self, run_dir: Path):
        super().__init__(run_dir)
        self.engine = ""
        self.host = ""  # the bind address (listen_host)
        self.end_reason: tuple[RunStatus, str] | None = None

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        self.begin()
        sock = None
        try:
            spec = read_spec(self.run_dir)
            assert isinstance(spec, ServeSpec), type(spec)
            self.check_cancel(spec)  # queued by a CLI that has exited since: nobody could use it
            self.status(RunStatus.STARTING, "finding the models")
            resolved = spec.resolved()
            names = served_names(resolved)
            self.engine = choose_serve_engine(spec.engine, resolved)
            self.host = listen_host(spec)
            sock = bind(self.host, spec.port)
            port = sock.getsockname()[1]
            self.check_cancel(spec)
            if self.engine in (VLLM, INFINITY):
                sock.close()  # the child server binds the port itself; ours only proved it free
                sock = None
                serve = self.serve_vllm if self.engine == VLLM else self.serve_infinity
                serve(spec, resolved, names, port)
            else:
                self.serve_transformers(spec, resolved, names, sock)
            if self.end_reason is None and self.sigterm.is_set():  # uvicorn re-raises SIGTERM after its shutdown
                self.end_reason = (RunStatus.CANCELLED, "terminated (SIGTERM)")
            status, reason = self.end_reason or (RunStatus.COMPLETED, "the server ended")
            self.log(f"finished: {status.value} ({reason})")
            self.events.emit(ev.CompleteEvent(status=status.value))
            return 0
        except Cancelled:
            self.events.emit(ev.CompleteEvent(status=RunStatus.CANCELLED.value))
            return 0
        except BaseException as exc:  # process boundary: report every failure, then exit non-zero
            self.fail(exc)
            return 1
        finally:
            if sock is not None:
                sock.close()
            endpoint_file.remove(self.run_dir)
            self.end()

    # ------------------------------------------------------------------ transformers serve
    def serve_transformers(self, spec: ServeSpec, resolved: list[ResolvedSource], names: list[str],
                           sock: socket.socket) -> None:
        import uvicorn

        from trainer_core.worker.sources import base_folder, merge_adapter

        device = "cuda" if hardware.cuda_available() else "cpu"
        merge_dtype = "float32" if device == "cpu" else "bfloat16"
        folders = []
        for item in resolved:
            self.check_cancel(spec)
            if item.adapter_dir is not None:
                self.status(RunStatus.STARTING, f"merging the adapter of {item.label}")
                folders.append(merge_adapter(item, merged_target(item), merge_dtype, log=self.log))
            elif item.model_dir is not None:
                folders.append(item.model_dir)
            else:
                folders.append(Path(base_folder(item, log=self.log)))
        models_dir = self.link_models(names, folders)
        os.chdir(models_dir)  # transformers serve resolves a request's relative model path against cwd
        self.status(RunStatus.STARTING, "loading the models")
        app, manager = build_transformers_app(device)
        vision = []
        for name in names:
            self.check_cancel(spec)
            model, processor = manager.load_model_and_processor(manager.process_model_name(name))
            safe_prompt.guard(processor)  # a "<|im_start|>system" a client sends is text, not a turn of its own
            parser = serve_tools.enable(processor, model)
            if parser:
                self.log(f"{name}: answers tool_calls (calls parsed from {parser})")
            if sees_images(manager, model, processor):
                vision.append(name)
        activity = Activity()
        config = GateConfig(key_hash=spec.api_key_hash, models=dict(zip(names, map(str, folders))),
                            translate_sampling=True, max_tokens_cap=spec.max_tokens_cap,
                            request_timeout_s=spec.request_timeout_s,
                            speech_models=[n for n, r in zip(names, resolved) if r.output == "speech"],
                            vision_models=vision, **feedback_files(self.run_dir, spec))
        if vision:
            self.log(f"taking images (data: URLs) for: {', '.join(vision)}")
        gated = KeyGate(app, config, activity, limits=prompt_limits(manager))
        tls = {"ssl_certfile": spec.tls_certfile, "ssl_keyfile": spec.tls_keyfile} if spec.tls_certfile else {}
        server = uvicorn.Server(uvicorn.Config(gated, log_level="warning", access_log=False,
                                               timeout_graceful_shutdown=5, lifespan="on", **tls))
        watcher = threading.Thread(target=self.watch, args=(spec, activity.idle_s, lambda: setattr(server, "should_exit", True)),
                                   daemon=True, name="serve-watch")
        announced = threading.Thread(target=self._announce_when_started,
                                     args=(server, spec, resolved, names, sock.getsockname()[1]), daemon=True)
        watcher.start()
        announced.start()
        server.run(sockets=[sock])

    def _announce_when_started(self, server, spec, resolved, names, port) -> None:
        while not server.started and not self.done.is_set() and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            self.announce(spec, resolved, names, port)

    # ------------------------------------------------------------------ vLLM
    def serve_vllm(self, spec: ServeSpec, resolved: list[ResolvedSource], names: list[str], port: int) -> None:
        from trainer_core.worker.sources import base_folder

        base = base_folder(resolved[0], log=self.log)
        vision = names if folder_is_vision(base) else []  # one base: every served name is the same kind
        base_name = next((n for n, r in zip(names, resolved) if r.adapter_dir is None), "base")
        adapters = [(n, r.adapter_dir) for n, r in zip(names, resolved) if r.adapter_dir is not None]
        activity_file = self.run_dir / "activity"
        activity_file.touch()
        gate_file = self.run_dir / "gate.json"
        gate_file.write_text(GateConfig(key_hash=spec.api_key_hash, models={n: "" for n in names},
                                        translate_sampling=False, activity_file=str(activity_file),
                                        max_tokens_cap=spec.max_tokens_cap,
                                        request_timeout_s=spec.request_timeout_s, vision_models=vision,
                                        **feedback_files(self.run_dir, spec)).to_json())
        tool_args, warnings = serve_tools.vllm_tool_args(base, adapters, self.run_dir)
        for warning in warnings:
            self.warn(warning)
        command = vllm_command(base, base_name, adapters, self.host, port,
                               max((adapter_rank(a) for _, a in adapters), default=0), extra=tool_args)
        if spec.tls_certfile:
            command += ["--ssl-certfile", spec.tls_certfile, "--ssl-keyfile", spec.tls_keyfile]
        self.log("starting: " + " ".join(command))
        self.status(RunStatus.STARTING, "loading the models into vLLM")
        env = {**os.environ, GATE_ENV: str(gate_file)}
        self.supervise(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL), "vLLM", VLLM_READY_S,
                       spec, resolved, names, port, activity_file)

    # ------------------------------------------------------------------ infinity (embedding models)
    def serve_infinity(self, spec: ServeSpec, resolved: list[ResolvedSource], names: list[str], port: int) -> None:
        python = embed_python()
        if not python.exists():
            raise RuntimeError(f"{python} is missing: the embedding server (infinity-emb) is installed by "
                               "`make install` into .venv-embed/")
        folders = [str(embedding_folder(r)) for r in resolved]
        activity_file = self.run_dir / "activity"
        activity_file.touch()
        gate_file = self.run_dir / "gate.json"
        gate_file.write_text(GateConfig(key_hash=spec.api_key_hash, models=dict(zip(names, folders)),
                                        translate_sampling=False, activity_file=str(activity_file),
                                        request_timeout_s=spec.request_timeout_s,
                                        embedding_models=list(names)).to_json())
        launch_file = self.run_dir / "infinity.json"
        launch_file.write_text(json.dumps({
            "models": [{"name": n, "folder": f, "trust_remote_code": bool(r.config and r.config.trust_remote_code)}
                       for n, f, r in zip(names, folders, resolved)], "host": self.host, "port": port,
            "device": "cpu", "tls_certfile": spec.tls_certfile, "tls_keyfile": spec.tls_keyfile}))
        command = [str(python), infinity_app.__file__, str(launch_file)]
        self.log("starting: " + " ".join(command) + " (" + ", ".join(f"{n} = {f}" for n, f in zip(names, folders)) + ")")
        self.status(RunStatus.STARTING, "loading the embedding models into infinity")
        # the model folders are local: nothing to download, and no usage statistics sent from the child
        # no secret either: offline, the embedding server needs no hub token; and no remote code (infinity's default)
        env = {**{k: v for k, v in os.environ.items() if k not in access.RUN_SECRET_ENV}, GATE_ENV: str(gate_file),
               "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
               "INFINITY_TRUST_REMOTE_CODE": "false"}
        env.pop("PYTHONPATH", None)  # the studio's packages would shadow the embedding venv's transformers
        self.supervise(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL), "infinity", INFINITY_READY_S,
                       spec, resolved, names, port, activity_file)

    def supervise(self, child: subprocess.Popen, what: str, ready_s: float, spec: ServeSpec,
                  resolved: list[ResolvedSource], names: list[str], port: int, activity_file: Path) -> None:
        """Wait until the child server answers, announce it, then serve until Stop/Cancel/idle or its exit."""
        import httpx

        url = f"{spec.scheme}://{public_host(self.reachable_host(spec))}:{port}"
        try:
            deadline = time.monotonic() + ready_s
            while True:  # any HTTP answer (401 from the gate) means the server is up: its models are loaded
                if child.poll() is not None:
                    raise RuntimeError(f"{what} exited with code {child.returncode} while loading; worker.log says why")
                self.check_cancel(spec)
                try:
                    httpx.get(f"{url}/health", timeout=2.0, verify=False)  # our own server: only "does it answer"
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{what} did not answer within {ready_s:.0f} s") from None
                    time.sleep(1.0)
            self.announce(spec, resolved, names, port)

            def idle_s() -> float:
                try:
                    return time.time() - activity_file.stat().st_mtime
                except OSError:
                    return 0.0

            stop = threading.Event()
            watcher = threading.Thread(target=self.watch, args=(spec, idle_s, stop.set), daemon=True)
            watcher.start()
            while not stop.is_set() and child.poll() is None:
                stop.wait(WATCH_S)
            if child.poll() is not None and self.end_reason is None:
                raise RuntimeError(f"{what} exited with code {child.returncode}; worker.log says why")
        finally:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()

    # ------------------------------------------------------------------ shared steps
    def link_models(self, names: list[str], folders: list[Path]) -> Path:
        """``models/<served name>`` -> model folder, so a request's ``model`` is a short name."""
        models_dir = self.run_dir / "models"
        models_dir.mkdir(exist_ok=True)
        for name, folder in zip(names, folders):
            link = models_dir / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(Path(folder).resolve(), target_is_directory=True)
        return models_dir

    def reachable_host(self, spec: ServeSpec) -> str:
        """The host the dashboard reaches the server at: the bind address, or for every interface this machine's
        loopback, and on a Ray node the node's cluster address (the dashboard runs on another host)."""
        node_address = os.environ.get(NODE_ADDRESS_ENV, "") if spec.launcher == "ray" else ""
        return node_address if node_address and self.host in WILDCARDS else self.host

    def announce(self, spec: ServeSpec, resolved: list[ResolvedSource], names: list[str], port: int) -> None:
        url = f"{spec.scheme}://{public_host(self.reachable_host(spec))}:{port}/v1"
        # Bound to every interface of this host: teammates use its name (url stays the loopback one for us). On a Ray
        # node url already names the node, as the dashboard host reaches it.
        wildcard = self.host in WILDCARDS and spec.launcher != "ray"
        share_url = f"{spec.scheme}://{socket.getfqdn()}:{port}/v1" if wildcard else url
        node = ""
        if spec.launcher == "ray":
            node = f"{os.environ.get(NODE_ADDRESS_ENV, '?')} ({os.environ.get(NODE_ID_ENV, '?')[:12]})"
        models = [{"name": n, "label": r.label, "source_key": r.source.key} for n, r in zip(names, resolved)]
        endpoint_file.write(self.run_dir, url=url, models=models, engine=self.engine, pid=os.getpid(),
                            share_url=share_url, node=node)
        self.log(f"serving at {url}: {', '.join(names)}" + (f" on Ray node {node}" if node else ""))
        warning = CLUSTER_PLAIN_HTTP if spec.launcher == "ray" else plain_http_warning(self.host)
        if not spec.tls_certfile and warning:
            self.warn(warning)
        self.events.emit(ev.ServeReadyEvent(url=url, models={m["name"]: m["label"] for m in models},
                                            engine=self.engine))

    def watch(self, spec: ServeSpec, idle_s, stop) -> None:
        """Ends the server on Stop/Cancel, SIGTERM or the idle timeout."""
        while not self.done.wait(WATCH_S):
            action = control.read(self.run_dir)
            gone = consumer_gone(spec.consumer) if spec.consumer else ""
            if self.sigterm.is_set() or action is control.Action.CANCEL:
                self.end_reason = (RunStatus.CANCELLED, "cancelled")
            elif gone:
                self.end_reason = (RunStatus.CANCELLED, f"{gone}: nobody else has its key")
                self.warn(f"Stopping: {gone}, and nobody else has this server's key.")
            elif action is control.Action.STOP:
                self.end_reason = (RunStatus.STOPPED, "stopped on request")
            elif spec.idle_timeout_s and idle_s() > spec.idle_timeout_s:
                self.end_reason = (RunStatus.COMPLETED, f"no request for {spec.idle_timeout_s} s")
            if self.end_reason is not None:
                self.status(RunStatus.STOPPING, f"shutting down: {self.end_reason[1]}")
                stop()
                return

    def check_cancel(self, spec: ServeSpec) -> None:
        if self.sigterm.is_set() or control.read(self.run_dir) is not None:
            raise Cancelled()
        gone = consumer_gone(spec.consumer) if spec.consumer else ""
        if gone:
            self.warn(f"Not serving: {gone} before the server was ready, and nobody else has its key.")
            raise Cancelled()

    def status(self, status: RunStatus, phase: str, message: str = "", **fields: str) -> None:
        super().status(status, phase, message, engine=self.engine, **fields)

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
            message = (f"not enough memory to load the models ({type(exc).__name__}): serve fewer sources at once, "
                       "or stop the job that holds the memory")
        elif isinstance(exc, (SourceError, OSError, RuntimeError)) and str(exc):
            message = str(exc)  # ours name what and the fix (a missing run, a port in use, vLLM exiting)
        else:
            message = f"{type(exc).__name__}: {exc}"
        self.report_error(message, exc)


def build_transformers_app(device: str):
    """transformers serve's own FastAPI app (as ``transformers serve`` builds it), every model kept loaded."""
    import transformers

    try:
        from transformers.cli.serving.chat_completion import ChatCompletionHandler
        from transformers.cli.serving.completion import CompletionHandler
        from transformers.cli.serving.model_manager import ModelManager
        from transformers.cli.serving.response import ResponseHandler
        from transformers.cli.serving.server import build_server
        from transformers.cli.serving.systemone import SystemOneHandler

        from trainer_core.worker.serve_generate import CancellableGenerationState
        from trainer_core.worker.serve_transcribe import ClipTranscriptionHandler
    except ImportError as exc:
        raise RuntimeError(f"transformers {transformers.__version__} has no usable serving app ({exc}): install "
                           "'transformers[serving]>=5.24', or the vllm extra on a CUDA host") from None

    # float32 on CPU: bf16 matmuls are slow there, and the merged adapters are float32 (same answers).
    manager = ModelManager(device=device, dtype="float32" if device == "cpu" else "auto", model_timeout=-1)
    # Its managers stop a non-streaming generate() when the gate cancels the request (client gone, timeout).
    state = CancellableGenerationState(continuous_batching=False, compile=False, cb_config=None)
    app = build_server(
        manager, ChatCompletionHandler(model_manager=manager, generation_state=state),
        completion_handler=CompletionHandler(model_manager=manager, generation_state=state),
        response_handler=ResponseHandler(model_manager=manager, generation_state=state),
        # the clip decoded from its bytes, never opened by the name its base64 spells (serve_transcribe.py)
        transcription_handler=ClipTranscriptionHandler(manager, state),
        systemone_handler=SystemOneHandler(model_manager=manager, generation_state=state),
        generation_state=state)
    return app, manager


def sees_images(manager, model, processor) -> bool:
    """True when transformers serve hands this model a request's image parts (VLM or multimodal), as it decides."""
    from transformers.cli.serving.utils import Modality

    try:
        return manager.get_model_modality(model, processor=processor) in (Modality.VLM, Modality.MULTIMODAL)
    except ValueError:  # a class transformers serve does not classify: it would refuse the request itself
        return False


def folder_is_vision(folder: str) -> bool:
    from transformers import AutoConfig

    from trainer_core.worker.model_resolver import is_vision_config

    return is_vision_config(AutoConfig.from_pretrained(folder))


def context_length(config) -> int | None:
    """The context length of a text model, or of a vision model's language model (LLaVA keeps it in text_config)."""
    found = getattr(config, "max_position_embeddings", None)
    if not found and getattr(config, "text_config", None) is not None:
        found = getattr(config.text_config, "max_position_embeddings", None)
    return int(found) if found else None


def text_of_images(messages: list, config) -> tuple[list, int]:
    """``messages`` with each image part as the template's ``{"type": "image"}``, and the tokens the images add
    beyond the one placeholder each (the config's ``image_seq_length`` when it has one; else a lower bound)."""
    per_image = max(int(getattr(config, "image_seq_length", 1) or 1) - 1, 0)
    images, out = 0, []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    images += 1
                    part = {"type": "image"}
                parts.append(part)
            message = {**message, "content": parts}
        out.append(message)
    return out, images * per_image


def prompt_limits(manager):
    """The gate's token count: (prompt tokens with the chat template, the model's context length)."""
    def limits(name: str, body: dict):
        loaded = manager.loaded_models.get(name)
        if loaded is None or loaded.model is None:
            return None
        context = context_length(loaded.model.config)
        tokenizer = getattr(loaded.processor, "tokenizer", loaded.processor)
        if not context:
            return None
        if _surely_fits(body, int(context)):
            return None  # no need to tokenize (a few ms on every request's path)
        try:
            if isinstance(body.get("messages"), list) and tokenizer is not loaded.processor:
                # a processor's template renders image parts; its tokenizer counts one token per placeholder
                messages, extra = text_of_images(body["messages"], loaded.model.config)
                text = loaded.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                return len(ids) + extra, int(context)
            if isinstance(body.get("messages"), list):
                ids = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True,
                                                    return_dict=True)["input_ids"]
            elif isinstance(body.get("prompt"), str):
                ids = tokenizer(body["prompt"])["input_ids"]
            else:
                return None
        except Exception:  # noqa: BLE001 - a malformed conversation: the engine answers with its own error
            return None
        return len(ids), int(context)

    return limits


TEMPLATE_TOKENS_PER_MESSAGE = 64  # role markers and separators: generous for any chat template
TEMPLATE_TOKENS = 512  # a default system prompt some templates add


def _surely_fits(body: dict, context: int) -> bool:
    """True when the prompt cannot exceed the context whatever the tokenizer: a token covers at least one
    byte of text, so the byte count (plus a generous allowance for the template) bounds the token count."""
    messages = body.get("messages")
    if isinstance(messages, list):
        try:
            if any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image_url"
                                                               for p in m["content"]) for m in messages):
                return False  # an image's tokens are not bounded by its bytes (nor its bytes by its tokens)
            size = sum(len(json.dumps(m.get("content"), ensure_ascii=False).encode()) + TEMPLATE_TOKENS_PER_MESSAGE
                       for m in messages)
        except (AttributeError, TypeError, ValueError):
            return False
    elif isinstance(body.get("prompt"), str):
        size = len(body["prompt"].encode())
    else:
        return False
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    asked = asked if isinstance(asked, int) and not isinstance(asked, bool) else ENGINE_DEFAULT_MAX_TOKENS
    return size + TEMPLATE_TOKENS + asked <= context


def main(run_dir: Path) -> int:
    return ServeWorker(Path(run_dir)).run()
