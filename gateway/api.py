"""The OpenAI-compatible fine-tuning API over HTTP: ``/v1/files``, ``/v1/fine_tuning/jobs``, ``/v1/chat/completions``
and ``/v1/models`` (the mapping itself, without HTTP, is trainer_core/api/).

    python -m gateway.api --port 8600          # a single host: http://127.0.0.1:8600/v1
    make share                                 # the shared URL: nginx routes /v1/ here

Every request carries a studio API token (``Authorization: Bearer fts_...``, the ``api_key`` of the ``openai``
client; created on the Account page or with ``python -m gateway.api token NAME``): viewers read, operators create,
cancel, pause and resume their own jobs and upload files, admins everything. Every call is logged with who made
it (method, path, status; never a token, a body or a query string). Errors are OpenAI's error objects, also for a
route or feature this server does not have. The server drives the studio's orchestrator like the dashboard and the
CLI do: a job is an ordinary run, and the state lives in the database and the data root, not in this process.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import time
import traceback
from typing import Any, Awaitable, Callable

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from db import users
from db.store import Store
from gateway.api_tokens import VerifiedTokens
from trainer_core.api import catalog, chat as chat_models, files, jobs, servers, timeline
from trainer_core.api.errors import AUTH, ApiError, forbidden, invalid
from trainer_core.auth import access
from trainer_core.jobs.orchestrator import Orchestrator
from trainer_core.protocol import paths

LIST_LIMIT_MAX = 100
UPSTREAM_TIMEOUT_S = 600.0


def log(who: str, method: str, path: str, status: int) -> None:
    print(f"[finetune-studio api] {time.strftime('%Y-%m-%dT%H:%M:%S')} {who} {method} {path} -> {status}",
          file=sys.stderr, flush=True)


def create_app(make_orchestrator: Callable[[], Orchestrator] = Orchestrator) -> Starlette:
    state: dict[str, Any] = {}
    tokens = VerifiedTokens()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state["orch"] = await run_in_threadpool(make_orchestrator)
        state["http"] = httpx.AsyncClient(timeout=httpx.Timeout(UPSTREAM_TIMEOUT_S, connect=10.0))
        try:
            yield
        finally:
            await state["http"].aclose()
            await run_in_threadpool(state["orch"].close)

    def orch() -> Orchestrator:
        return state["orch"]

    def actor_of(request: Request) -> access.Actor:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not token:
            raise ApiError(401, "You didn't provide an API key: send a studio API token (fts_..., from the Account "
                                "page) as 'Authorization: Bearer <token>', the openai client's api_key.", AUTH, None,
                           "missing_api_key")
        return tokens.actor(orch().store, token)

    def route(path: str, handler: Callable[..., Awaitable[Response] | Response], methods: list[str]) -> Route:
        """``handler(request, actor)``: async for what reads the body, else run in a thread (it blocks on the
        database and the run folders). Every answer is logged with who asked."""
        async def endpoint(request: Request) -> Response:
            who, status = "-", 500
            try:
                actor = await run_in_threadpool(actor_of, request)
                who = actor.name
                if inspect.iscoroutinefunction(handler):
                    response = await handler(request, actor)
                else:
                    response = await run_in_threadpool(handler, request, actor)
            except ApiError as exc:
                response = JSONResponse(exc.body(), status_code=exc.status)
            except Exception:  # the process boundary of one request: say it failed, keep serving the others
                traceback.print_exc(file=sys.stderr)
                response = JSONResponse(ApiError(500, "The server had an error while processing your request; the "
                                                      "server's log has the details.", "server_error").body(),
                                        status_code=500)
            status = response.status_code
            log(who, request.method, request.url.path, status)
            return response
        return Route(path, endpoint, methods=methods)

    # ------------------------------------------------------------------ files
    async def upload(request: Request, actor: access.Actor) -> Response:
        allowed = await run_in_threadpool(access.allowed, actor, access.Action.START)
        if not allowed:
            raise forbidden(f"{actor.name} is a viewer and cannot upload files; an admin can make you an operator.")
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > files.max_bytes() + (1 << 20):
            raise invalid(f"the upload is {int(size) / 2**20:.1f} MiB; files are limited to "
                          f"{files.max_bytes() / 2**20:.0f} MiB", "file", "file_too_large")
        try:
            form = await request.form(max_files=1, max_fields=10)
        except Exception as exc:  # a body that is not multipart/form-data (starlette's parser errors vary)
            raise invalid(f"upload the file as multipart/form-data with fields 'file' and 'purpose' ({exc})",
                          "file") from None
        upload_file, purpose = form.get("file"), form.get("purpose")
        if purpose is None:
            raise invalid("purpose is required: 'fine-tune'", "purpose")
        if upload_file is None or isinstance(upload_file, str):
            raise invalid("file is required: the JSONL file, as a multipart file field", "file")
        data = await upload_file.read(files.max_bytes() + 1)
        stored = await run_in_threadpool(files.save, data, upload_file.filename or "", str(purpose), actor.name)
        return JSONResponse(stored.public())

    def list_files(request: Request, actor: access.Actor) -> Response:
        limit = _limit(request, default=10_000)
        found = [f.public() for f in files.list_files(request.query_params.get("purpose"))]
        if request.query_params.get("order") == "asc":
            found.reverse()
        return JSONResponse(jobs.page(jobs.after(found, request.query_params.get("after"), lambda f: f["id"])
                                      [:limit + 1], limit))

    def get_file(request: Request, actor: access.Actor) -> Response:
        return JSONResponse(files.get(request.path_params["file_id"]).public())

    def file_content(request: Request, actor: access.Actor) -> Response:
        stored = files.get(request.path_params["file_id"])
        return FileResponse(stored.path, media_type="application/jsonl", filename=stored.filename)

    def delete_file(request: Request, actor: access.Actor) -> Response:
        stored = files.get(request.path_params["file_id"])
        if not access.allowed(actor, access.Action.DELETE, stored.owner):
            raise forbidden(f"{stored.id} belongs to {stored.owner}; operators delete only their own files "
                            "(an admin can).")
        for record in jobs.all_records():
            if stored.id in (record.request.get("training_file"), record.request.get("validation_file")) and \
                    jobs.status_of(orch(), record) in ("queued", "running"):
                raise ApiError(409, f"{stored.id} is used by job {record.id}, which is still "
                                    f"{jobs.status_of(orch(), record)}: cancel it or wait", "invalid_request_error",
                               "file_id", "file_in_use")
        files.delete(stored)
        return JSONResponse({"id": stored.id, "object": "file", "deleted": True})

    # ------------------------------------------------------------------ jobs
    async def create_job(request: Request, actor: access.Actor) -> Response:
        body = await _json_body(request)
        return JSONResponse(await run_in_threadpool(jobs.create, orch(), body, actor))

    def list_jobs(request: Request, actor: access.Actor) -> Response:
        metadata = {k[9:-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")}
        return JSONResponse(jobs.listing(orch(), request.query_params.get("after"), _limit(request), metadata))

    def get_job(request: Request, actor: access.Actor) -> Response:
        return JSONResponse(jobs.render(orch(), jobs.get(request.path_params["job_id"])))

    def control(action: Callable) -> Callable:
        def handler(request: Request, actor: access.Actor) -> Response:
            return JSONResponse(action(orch(), jobs.get(request.path_params["job_id"]), actor))
        return handler

    def job_events(request: Request, actor: access.Actor) -> Response:
        record = jobs.get(request.path_params["job_id"])
        return JSONResponse(timeline.events_page(orch(), record, request.query_params.get("after"), _limit(request)))

    def job_checkpoints(request: Request, actor: access.Actor) -> Response:
        record = jobs.get(request.path_params["job_id"])
        return JSONResponse(timeline.checkpoints_page(orch(), record, request.query_params.get("after"),
                                                      _limit(request, default=10)))

    # ------------------------------------------------------------------ chat and models
    def store_actor(owner: str | None, caller: access.Actor) -> access.Actor:
        return caller if owner is None else users.actor_for(orch().store, owner)

    async def chat(request: Request, actor: access.Actor) -> Response:
        body = await _json_body(request)
        source, owner = await run_in_threadpool(chat_models.source_of, orch(), body.get("model"),
                                                lambda name: store_actor(name, actor))
        endpoint, key = await run_in_threadpool(servers.endpoint_for, orch(), source, owner)
        asked = body["model"]
        forwarded = {**body, "model": endpoint.name_of(source.key) or asked}
        upstream = state["http"].build_request("POST", endpoint.url.rstrip("/") + "/chat/completions",
                                               json=forwarded, headers={"Authorization": f"Bearer {key}"})
        answer = await state["http"].send(upstream, stream=True)
        if body.get("stream"):
            async def relay():
                renamer = chat_models.StreamRenamer(asked)  # each chunk names the model asked for
                try:
                    async for chunk in answer.aiter_raw():
                        yield renamer.feed(chunk)
                    yield renamer.close()
                finally:
                    await answer.aclose()
            return StreamingResponse(relay(), status_code=answer.status_code,
                                     media_type=answer.headers.get("content-type", "text/event-stream"))
        content = await answer.aread()
        await answer.aclose()
        try:
            data = json.loads(content)
        except ValueError:
            raise ApiError(502, f"the model's server answered with status {answer.status_code} and no JSON",
                           "server_error", "model", "bad_upstream") from None
        if isinstance(data, dict) and "model" in data:
            data["model"] = asked  # the name the client asked for, not the serve job's
        return JSONResponse(data, status_code=answer.status_code)

    def list_models(request: Request, actor: access.Actor) -> Response:
        return JSONResponse(catalog.listing(orch()))

    def get_model(request: Request, actor: access.Actor) -> Response:
        return JSONResponse(catalog.retrieve(orch(), request.path_params["model_id"]))

    routes = [
        route("/v1/files", upload, ["POST"]),
        route("/v1/files", list_files, ["GET"]),
        route("/v1/files/{file_id}", get_file, ["GET"]),
        route("/v1/files/{file_id}", delete_file, ["DELETE"]),
        route("/v1/files/{file_id}/content", file_content, ["GET"]),
        route("/v1/fine_tuning/jobs", create_job, ["POST"]),
        route("/v1/fine_tuning/jobs", list_jobs, ["GET"]),
        route("/v1/fine_tuning/jobs/{job_id}", get_job, ["GET"]),
        route("/v1/fine_tuning/jobs/{job_id}/cancel", control(jobs.cancel), ["POST"]),
        route("/v1/fine_tuning/jobs/{job_id}/pause", control(jobs.pause), ["POST"]),
        route("/v1/fine_tuning/jobs/{job_id}/resume", control(jobs.resume), ["POST"]),
        route("/v1/fine_tuning/jobs/{job_id}/events", job_events, ["GET"]),
        route("/v1/fine_tuning/jobs/{job_id}/checkpoints", job_checkpoints, ["GET"]),
        route("/v1/chat/completions", chat, ["POST"]),
        route("/v1/models", list_models, ["GET"]),
        route("/v1/models/{model_id:path}", get_model, ["GET"]),
    ]

    async def unknown(request: Request, exc: HTTPException) -> Response:
        """A route (or a method of one) this server does not have: OpenAI's own answer for an unknown URL."""
        log("-", request.method, request.url.path, exc.status_code)
        message = (f"Unknown request URL: {request.method} {request.url.path}. This server implements OpenAI's files, "
                   "fine_tuning.jobs, chat.completions and models routes (docs/api.md)."
                   if exc.status_code in (404, 405) else str(exc.detail))
        return JSONResponse(ApiError(exc.status_code, message, "invalid_request_error", None,
                                     "unknown_url" if exc.status_code in (404, 405) else None).body(),
                            status_code=exc.status_code)

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: unknown})


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise invalid("the request body is not valid JSON", None) from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", None)
    return body


def _limit(request: Request, default: int = 20) -> int:
    text = request.query_params.get("limit")
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= max(LIST_LIMIT_MAX, default):
        raise invalid(f"limit must be an integer from 1 to {max(LIST_LIMIT_MAX, default)}", "limit")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Finetune Studio's OpenAI-compatible fine-tuning API")
    sub = parser.add_subparsers(dest="command")
    token = sub.add_parser("token", help="create an API token for a user (created with the role if new); printed once")
    token.add_argument("user")
    token.add_argument("--role", choices=[r.value for r in access.Role], default=access.Role.OPERATOR.value,
                       help="the role of a user seen for the first time (an existing user keeps theirs)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8600)
    args = parser.parse_args(argv)
    paths.data_root()
    if args.command == "token":
        store = Store()
        user = users.ensure_user(store, args.user, access.Role(args.role))
        print(users.create_token(store, user.name, "gateway.api token"))
        print(f"(a token of {user.name}, role {user.role}: it is shown only now)", file=sys.stderr)
        return 0
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning", access_log=False,
                server_header=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
