"""``python -m trainer_core chat`` and ``serve``: a serve job started through the orchestrator, like
``runs start`` starts a training run, then a terminal chat or an endpoint for teammates.

Exit codes: 0 done, 1 the server failed or died, 2 bad input or refused, 3 interrupted while starting.
Every failure is one clear line on stderr, never a traceback.

The serve job lives only as long as this command: Ctrl-C, SIGTERM and SIGHUP all stop it (a queued one leaves
the queue), and the job itself ends when this process is gone (its spec names it as the consumer), so a
killed CLI never leaves a server holding the device with a key nobody knows.
"""
from __future__ import annotations

import signal
import sys
import time
from typing import Callable

from trainer_core.specs import model_source
from trainer_core.config import ConfigError
from trainer_core.specs.model_source import ModelSource, SourceError
from trainer_core.protocol.status import JobKind, RunStatus
from trainer_core.serving.client import Sampling, ServeError, stream_chat
from trainer_core.serving.endpoint import Endpoint
from trainer_core.serving.spec import CLUSTER_PLAIN_HTTP, INFINITY, plain_http_warning

READY_POLL_S = 0.25
STOP_WAIT_S = 60.0


class CliError(Exception):
    """A message for stderr and an exit code."""

    def __init__(self, message: str, code: int = 2):
        self.code = code
        super().__init__(message)


def source_for(store, ref: str, find: Callable, checkpoint: int | None, base: bool) -> ModelSource:
    """The model source RUN [--checkpoint STEP | --base] names, checked on disk (CliError says why not)."""
    run = find(store, ref)
    if run is None:
        raise CliError("", 2)  # find printed why
    if run.kind is not JobKind.TRAIN:
        raise CliError(f"{run.name!r} is a {run.kind.label.lower()} job, not a training run: pick a run that "
                       "trained a model (`python -m trainer_core runs`)")
    try:
        if base:
            source = ModelSource(model=model_source.run_config(run.id).model_name)
        else:
            source = ModelSource(run_id=run.id, checkpoint=checkpoint)
        model_source.resolve(source, run_name=run.name)
    except SourceError as exc:
        raise CliError(str(exc)) from None
    return source


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_on_signals() -> dict:
    """SIGTERM (kill, systemd, ``timeout``) and SIGHUP (the terminal closed) mean what Ctrl-C means, and Ctrl-C
    means KeyboardInterrupt whatever handler the process had before (an earlier command in the same process, a
    test); returns the handlers to put back."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def interrupt(*_):
        raise KeyboardInterrupt

    for sig in STOP_SIGNALS:
        signal.signal(sig, interrupt)
    return previous


def restore_signals(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def start(orch, sources: list[ModelSource], actor, purpose: str, **options) -> tuple[str, str]:
    """Start (or queue) a serve job tied to this process; returns (job id, key). CliError lists the problems."""
    try:
        return orch.start_server(sources, actor=actor, purpose=purpose, tied=True, **options)
    except ConfigError as exc:
        raise CliError("; ".join(f"{e.field}: {e.message}" for e in exc.errors)) from None


def wait_ready(orch, job_id: str) -> Endpoint:
    """Wait until the job answers, printing its phase on stderr as it changes."""
    shown = ""
    while True:
        run = orch.get_run(job_id)
        endpoint = orch.endpoint(job_id)
        if endpoint is not None:
            return endpoint
        if run is not None and run.status.is_terminal():
            detail = run.error or f"it ended {run.status.label.lower()} before serving"
            raise CliError(f"the model server (job {job_id}) did not start: {detail}", 1)
        phase = "waiting for its device (a job holds it)" if run and run.status is RunStatus.QUEUED else (
            run.phase if run else "")
        if phase and phase != shown:
            print(f"model server {job_id}: {phase}", file=sys.stderr, flush=True)
            shown = phase
        time.sleep(READY_POLL_S)


def stop(orch, job_id: str, actor) -> None:
    """Stop the job (a queued one leaves the queue) and wait a while for it to end; a second Ctrl-C only
    cuts the wait short: the request is already written, and the job ends without this process too."""
    orch.stop(job_id, actor=actor)
    try:
        orch.wait(job_id, timeout=STOP_WAIT_S, interval=0.25)
    except (TimeoutError, KeyboardInterrupt):
        print(f"note: the model server {job_id} is still stopping", file=sys.stderr)


def answer(endpoint: Endpoint, key: str, messages: list[dict], sampling: Sampling) -> str:
    """Stream one answer to stdout; returns its text (ServeError when the server fails)."""
    stream = stream_chat(endpoint.url, key, endpoint.models[0].name, messages, sampling, timeout_s=120.0)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    stats = stream.stats
    rate = f", {stats.tokens_per_s:.1f} tokens/s" if stats.tokens_per_s else ""
    ttft = f", first token after {stats.ttft_s:.2f} s" if stats.ttft_s is not None else ""
    print(f"({stats.tokens} tokens{ttft}{rate})", file=sys.stderr, flush=True)
    return stream.text


def image_message(text: str, path: str) -> dict:
    """A user message showing the image at ``path`` (under the allowed folders, within the serve gate's limits) as a
    ``data:`` URL image part, then ``text``; CliError names what is wrong with the file."""
    import base64
    import io

    from PIL import Image, UnidentifiedImageError

    from trainer_core.protocol import paths
    from trainer_core.serving.gate import MAX_IMAGE_BYTES, GateConfig, RequestRefused, image_size_problem

    try:
        found = paths.resolve_inside(path, paths.allowed_data_roots())
    except paths.UnsafePathError as exc:
        raise CliError(f"--image: {exc}: put the image under the data root or an allowed folder") from None
    if not found.is_file():
        raise CliError(f"--image: {path} is not a file")
    if found.stat().st_size > MAX_IMAGE_BYTES:
        raise CliError(f"--image: {path} is {found.stat().st_size:,} bytes; at most {MAX_IMAGE_BYTES:,} are sent: "
                       "resize or compress it")
    data = found.read_bytes()
    try:
        with Image.open(io.BytesIO(data)) as image:  # the header only
            fmt = image.format or ""
    except (UnidentifiedImageError, OSError, ValueError):
        raise CliError(f"--image: {path} is not an image (PNG, JPEG, WebP or GIF)") from None
    url = f"data:image/{fmt.lower()};base64,{base64.b64encode(data).decode()}"
    try:
        image_size_problem("--image", {"url": url}, GateConfig(key_hash="", models={}))
    except RequestRefused as exc:
        raise CliError(exc.message) from None
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}


def cmd_chat(args, find: Callable, actor_of: Callable) -> int:
    from db.users import UnknownToken
    from trainer_core.jobs.orchestrator import Orchestrator, RunRefused

    sampling = Sampling(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    problems = sampling.validate()
    if problems:
        for p in problems:
            print(f"error: --{p.field.replace('_', '-')}: {p.message}", file=sys.stderr)
        return 2
    previous = interrupt_on_signals()
    orch = Orchestrator()
    job_id = None
    actor = None
    try:
        image = getattr(args, "image", None)
        first_with_image = (lambda text: image_message(text, image)) if image else None
        if first_with_image is not None:
            first_with_image("")  # a bad file is named before a server starts
        actor = actor_of(orch.store)
        source = source_for(orch.store, args.run, find, args.checkpoint, args.base)
        job_id, key = start(orch, [source], actor, "playground")  # known at once: the finally ends it
        endpoint = wait_ready(orch, job_id)
        print(f"chatting with {endpoint.models[0].label} ({endpoint.url}, model {endpoint.models[0].name})",
              file=sys.stderr, flush=True)
        messages = [{"role": "system", "content": args.system}] if args.system else []
        if args.prompt is not None:
            asked = first_with_image(args.prompt) if first_with_image else {"role": "user", "content": args.prompt}
            answer(endpoint, key, messages + [asked], sampling)
            return 0
        print("type a message, Enter to send; /exit or Ctrl-D to quit", file=sys.stderr)
        while True:
            try:
                text = input("you> ")
            except EOFError:
                print(file=sys.stderr)
                return 0
            if text.strip() in ("/exit", "/quit"):
                return 0
            if not text.strip():
                continue
            if first_with_image is not None:  # the image goes with the first message of the conversation
                messages.append(first_with_image(text))
                first_with_image = None
            else:
                messages.append({"role": "user", "content": text})
            messages.append({"role": "assistant", "content": answer(endpoint, key, messages, sampling)})
    except (CliError, ServeError, RunRefused, UnknownToken, KeyboardInterrupt) as exc:
        return failure(exc)
    finally:
        if job_id is not None:
            stop(orch, job_id, actor)
        orch.close()
        restore_signals(previous)


def failure(exc: BaseException) -> int:
    """How ``chat`` and ``serve`` end on ``exc``: one line on stderr, and the exit code (the CLI's error code, 1
    for a server that failed, 2 for a refusal, 3 for Ctrl-C)."""
    from db.users import UnknownToken
    from trainer_core.jobs.orchestrator import RunRefused

    if isinstance(exc, CliError):
        if str(exc):
            print(f"error: {exc}", file=sys.stderr)
        return exc.code
    if isinstance(exc, ServeError):
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, (RunRefused, UnknownToken)):
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    print("\ninterrupted", file=sys.stderr)
    return 3


def cmd_serve(args, find: Callable, actor_of: Callable) -> int:
    from db.users import UnknownToken
    from trainer_core.jobs.orchestrator import Orchestrator, RunRefused

    previous = interrupt_on_signals()
    orch = Orchestrator()
    job_id = None
    actor = None
    try:
        actor = actor_of(orch.store)
        source = source_for(orch.store, args.run, find, args.checkpoint, args.base)
        on_ray = getattr(args, "launcher", "local") == "ray"
        job_id, key = start(orch, [source], actor, "endpoint", host=args.host, port=args.port,
                            max_tokens_cap=args.max_tokens_cap, request_timeout_s=args.request_timeout,
                            tls_certfile=args.tls_cert or "", tls_keyfile=args.tls_key or "",
                            launcher="ray" if on_ray else "local",
                            ray_gpus_per_worker=getattr(args, "ray_gpus", 0.0) or 0.0,
                            store_completions=bool(getattr(args, "store_completions", False)))
        warning = "" if args.tls_cert or on_ray else plain_http_warning(args.host)
        if warning:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        endpoint = wait_ready(orch, job_id)
        if on_ray and not args.tls_cert:  # a node's network address, whichever node Ray picked
            print(f"warning: {CLUSTER_PLAIN_HTTP}", file=sys.stderr, flush=True)
        print(f"URL:     {endpoint.share_url}" + (f"   (on this machine: {endpoint.url})"
                                                     if endpoint.share_url != endpoint.url else ""))
        if endpoint.node:
            print(f"node:    {endpoint.node}   (Ray cluster)")
        print(f"model:   {endpoint.models[0].name}   ({endpoint.models[0].label})")
        if endpoint.engine == INFINITY:  # an embedding model: no chat route
            print("route:   POST /v1/embeddings (openai client: client.embeddings.create)")
        print(f"API key: {key}")
        print("The key is shown once and never stored. Serving until Ctrl-C "
              f"(job {job_id}; it also stops after 30 minutes without a request).", flush=True)
        del key
        stopping = {"asked": False}

        def on_sigint(*_):
            if not stopping["asked"]:
                stopping["asked"] = True
                print("\nstopping the server", file=sys.stderr, flush=True)
                orch.stop(job_id, actor=actor)

        for sig in STOP_SIGNALS:  # all three mean "stop the server"
            signal.signal(sig, on_sigint)
        snap = orch.wait(job_id, interval=0.5)
        if stopping["asked"] or snap.status in (RunStatus.STOPPED, RunStatus.COMPLETED):
            print(f"model server {job_id} {snap.status.label.lower()}", file=sys.stderr)
            job_id = None
            return 0
        print(f"error: the model server ended: {snap.error or snap.status.label}", file=sys.stderr)
        job_id = None
        return 1
    except (CliError, ServeError, RunRefused, UnknownToken, KeyboardInterrupt) as exc:
        return failure(exc)
    finally:
        if job_id is not None:
            stop(orch, job_id, actor)
        orch.close()
        restore_signals(previous)
