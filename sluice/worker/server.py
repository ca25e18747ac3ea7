"""The worker's HTTP face: OpenAI-compatible inference plus the probes the controller polls.

Starlette rather than FastAPI keeps start-up light, since instances are launched often.
Every POST under /v1/ passes through `_Accounting`, which counts it from arrival to the last
byte sent (streams included), labels its metrics, stamps `x-sluice-model-version` and records
one row in the samples ring (GET /sluice/samples) that canary analysis reads.

A client that goes away stops its request: a stream's generator is closed (Starlette cancels
it on `http.disconnect`), and a non-streaming generation or embedding runs against the
client's `http.disconnect` and is cancelled by it, so its concurrency slot (or its place in
the queue for one) is free at once. Such a request is counted as `disconnected`, not as an
error: sample status 499, metrics status label `disconnected`, its own /stats counter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.core.errors import NotFound, SluiceError, Unavailable
from sluice.worker import protocol
from sluice.worker.engine import Worker
from sluice.worker.logfile import LogFile
from sluice.worker.protocol import BadRequest, ChunkWriter
from sluice.worker.runtimes import Completion, Embeddings, Endpoint, Runtime, TextRequest
from sluice.worker.samples import SAMPLE_TEXT_CHARS

__all__ = ["build_app"]

_CALL = "sluice.call"
_PATHS = {
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.EMBEDDINGS: "/v1/embeddings",
}
_ROUTED = frozenset(_PATHS.values())
_CLIENT_GONE = 499
"""Sample status of a request whose client went away before its last byte, after nginx's
"client closed request": for canary analysis neither a success nor an error (a 4xx); metrics
label it 'disconnected', and /stats counts it apart."""
_BROKE_OFF = 500
"""Sample status of a request that broke off on the instance's side (a stream that failed
after its head went out): an error, as canary analysis counts them; metrics label it
'error'."""
_SAMPLES_LIMIT = 1000
_T = TypeVar("_T")


@dataclass(slots=True)
class _Call:
    """What the handler learned about one inference request, for the accounting middleware."""

    model: str | None = None
    version: str | None = None
    status: int | None = None
    broken: bool = False
    disconnected: bool = False
    """The client's `http.disconnect` came before the response was complete."""
    started: float = 0.0
    """perf_counter at arrival; time to first token counts from here."""
    ttft_s: float | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    text: str | None = None


class _Accounting:
    """ASGI middleware around the inference routes: exact in-flight count, metrics, header."""

    def __init__(self, app: ASGIApp, worker: Worker) -> None:
        self.app = app
        self.worker = worker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in _ROUTED:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        call = _Call(started=started)
        scope[_CALL] = call

        async def send_stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                call.status = message["status"]
                if call.version is not None:
                    version = (b"x-sluice-model-version", call.version.encode())
                    message = {**message, "headers": [*message.get("headers", []), version]}
            await send(message)

        async def receive_watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                call.disconnected = True  # (uvicorn says so too once the response is done)
            return message

        self.worker.request_started()
        try:
            await self.app(scope, receive_watched, send_stamped)
        except BaseException:
            call.broken = True
            raise
        finally:
            seconds = time.perf_counter() - started
            unfinished = call.broken or call.status is None or call.status == _CLIENT_GONE
            if unfinished and call.disconnected:
                outcome, status = "disconnected", _CLIENT_GONE
            elif unfinished:
                outcome, status = "error", _BROKE_OFF
            else:
                assert call.status is not None
                outcome, status = str(call.status), call.status
            self.worker.request_finished(call.model, outcome, seconds)
            self.worker.samples.record(
                call.model,
                status,
                seconds,
                call.ttft_s,
                call.output_tokens,
                call.finish_reason,
                call.text,
            )


class _ClosingStreamingResponse(StreamingResponse):
    """Closes its generator on every exit path, so a stream's concurrency slot is released
    at once even when the client goes away mid-stream."""

    body_iterator: AsyncGenerator[bytes, None]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


def build_app(worker: Worker) -> Starlette:
    """The ASGI app of one instance; loading starts with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        log_file = worker.config.log_file
        follower = asyncio.create_task(LogFile(log_file).follow()) if log_file else None
        worker.start()
        try:
            yield
        finally:
            await worker.stop()
            if follower is not None:
                follower.cancel()

    async def health(_request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "instance_id": worker.config.instance_id, "group": worker.config.group}
        )

    async def ready(_request: Request) -> Response:
        if worker.ready:
            return JSONResponse({"ready": True})
        body: dict[str, Any] = {"ready": False, "loading": worker.loading()}
        if worker.failure is not None:
            body["error"] = worker.failure
        return JSONResponse(body, status_code=503)

    async def stats(_request: Request) -> Response:
        return JSONResponse(worker.stats())

    async def samples(request: Request) -> Response:
        """`?after=SEQ&limit=N`: the rows after SEQ, oldest first (see worker/samples.py)."""
        after = _int_param(request, "after", 0, 0)
        limit = _int_param(request, "limit", _SAMPLES_LIMIT, 1, worker.samples.capacity)
        return JSONResponse(worker.samples.page(after, limit))

    def sleep_mode() -> None:
        if not worker.can_sleep:
            raise NotFound("this instance has no sleep mode (only sim models have one)")

    async def sleep(request: Request) -> Response:
        """vLLM's POST /sleep?level=N (1: weights to host memory, 2: dropped; the sim's
        are the same): answers once asleep."""
        sleep_mode()
        _int_param(request, "level", 1, 1, 2)
        await worker.sleep()
        return Response(status_code=200)

    async def wake_up(_request: Request) -> Response:
        """vLLM's POST /wake_up: answers once awake."""
        sleep_mode()
        await worker.wake()
        return Response(status_code=200)

    async def is_sleeping(_request: Request) -> Response:
        sleep_mode()
        return JSONResponse({"is_sleeping": worker.is_sleeping})

    async def metrics(_request: Request) -> Response:
        return Response(worker.metrics.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def models(_request: Request) -> Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": int(worker.started_at),
                "owned_by": worker.config.group,
                "runtime": runtime.spec.runtime,
                "version": runtime.spec.version,
                "ready": worker.is_loaded(name),
            }
            for name, runtime in worker.runtimes.items()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def admit(request: Request, endpoint: Endpoint) -> tuple[dict[str, Any], Runtime]:
        """Body, then model, then capability, then readiness: the first failure answers."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("request body is not valid JSON") from None
        except RecursionError:
            raise BadRequest("request body JSON is nested too deeply") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: a model id (string) is required")
        runtime = worker.runtime(model)
        call: _Call = request.scope[_CALL]
        call.model, call.version = model, runtime.spec.version
        if endpoint not in runtime.endpoints:
            serves = ", ".join(sorted(_PATHS[e] for e in runtime.endpoints))
            raise BadRequest(
                f"model {model!r} (runtime {runtime.spec.runtime!r}) does not serve "
                f"{_PATHS[endpoint]}; it serves {serves}"
            )
        if not worker.is_loaded(model):
            raise Unavailable(f"model {model!r} is still loading; retry when /ready is 200")
        if worker.is_sleeping:
            worker.refused_asleep += 1
            raise Unavailable(f"instance is {worker.sleep_state}; POST /wake_up first")
        runtime.inject_fault()
        return body, runtime

    def fingerprint(runtime: Runtime) -> str:
        return f"{runtime.model}:{runtime.spec.version}"

    async def generate(request: Request, chat: bool) -> Response:
        body, runtime = await admit(request, Endpoint.CHAT if chat else Endpoint.COMPLETIONS)
        kind = protocol.ChatRequest if chat else protocol.CompletionRequest
        parsed = protocol.parse(kind, body)
        text = parsed.text_request()
        await runtime.admit(text)
        if parsed.stream:
            writer = ChunkWriter(chat, runtime.model, fingerprint(runtime), parsed.include_usage)
            return _ClosingStreamingResponse(
                stream(request.scope[_CALL], runtime, text, writer),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        call: _Call = request.scope[_CALL]

        async def complete() -> Completion:
            async with worker.slot():
                return await runtime.complete(text)

        result = await _unless_disconnected(request, complete())
        if result is None:
            return _gone()
        call.output_tokens, call.finish_reason = result.completion_tokens, result.finish_reason
        call.text = result.text[:SAMPLE_TEXT_CHARS]
        render = protocol.chat_response if chat else protocol.completion_response
        return JSONResponse(render(runtime.model, fingerprint(runtime), result))

    async def stream(
        call: _Call, runtime: Runtime, text: TextRequest, writer: ChunkWriter
    ) -> AsyncGenerator[bytes, None]:
        """SSE body. Headers go out at once; the slot is taken before the first token."""
        finished = False
        produced = 0
        head: list[str] = []  # the output's first SAMPLE_TEXT_CHARS, for the samples ring
        kept = 0
        try:
            async with worker.slot():
                tokens = await runtime.stream(text)
                opening = writer.opening()
                if opening is not None:
                    yield opening
                async with aclosing(tokens.pieces) as pieces:
                    async for piece in pieces:
                        if produced == 0:
                            call.ttft_s = time.perf_counter() - call.started
                        produced += 1
                        if kept < SAMPLE_TEXT_CHARS:
                            head.append(piece)
                            kept += len(piece)
                        yield writer.piece(piece)
                if tokens.completion_tokens is not None:  # pieces are not one token each
                    produced = tokens.completion_tokens
                call.finish_reason = tokens.finish_reason
                yield writer.finish(tokens.finish_reason)
                if writer.include_usage:
                    yield writer.usage(tokens.prompt_tokens, produced)
            yield protocol.SSE_DONE
            finished = True
        finally:
            call.output_tokens = produced
            call.text = "".join(head)[:SAMPLE_TEXT_CHARS]
            if not finished:
                call.broken = True

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def embeddings(request: Request) -> Response:
        body, runtime = await admit(request, Endpoint.EMBEDDINGS)
        parsed = protocol.parse(protocol.EmbeddingRequest, body)
        inputs = parsed.inputs()

        async def embed() -> Embeddings:
            async with worker.slot():
                return await runtime.embed(inputs)

        result = await _unless_disconnected(request, embed())
        if result is None:
            return _gone()
        width = len(result.vectors[0])
        if parsed.dimensions is not None and parsed.dimensions != width:
            raise BadRequest(f"dimensions: this model's vectors have {width} dimensions")
        return JSONResponse(
            protocol.embedding_response(runtime.model, result, parsed.encoding_format)
        )

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/ready", ready),
            Route("/stats", stats),
            Route("/metrics", metrics),
            Route("/sluice/samples", samples),
            Route("/v1/models", models),
            Route("/sleep", sleep, methods=["POST"]),
            Route("/wake_up", wake_up, methods=["POST"]),
            Route("/is_sleeping", is_sleeping),
            Route(_PATHS[Endpoint.CHAT], chat_completions, methods=["POST"]),
            Route(_PATHS[Endpoint.COMPLETIONS], completions, methods=["POST"]),
            Route(_PATHS[Endpoint.EMBEDDINGS], embeddings, methods=["POST"]),
        ],
        middleware=[Middleware(_Accounting, worker=worker)],
        exception_handlers={
            ClientDisconnect: _client_disconnected,
            SluiceError: _sluice_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, _T]) -> _T | None:
    """`work`'s result, or None if the client disconnected first: then `work` is cancelled
    (and has let go of its slot or its place in the queue for one by the time this returns).
    The body has been read, so the next ASGI message can only be `http.disconnect`."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # (also when this request is cancelled itself)
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()  # finished (or failed) first: answer as usual
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _gone() -> Response:
    """The answer to a client that went away: never sent (uvicorn drops it), but it tells
    the accounting what became of the request."""
    return Response(status_code=_CLIENT_GONE)


def _int_param(request: Request, name: str, default: int, low: int, high: int | None = None) -> int:
    """A whole-number query parameter within [low, high], or a 400 that names it."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}: must be a whole number, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise BadRequest(f"{name}: must be {bound}, got {value}")
    return value


async def _client_disconnected(_request: Request, _exc: Exception) -> Response:
    return _gone()  # it left while its body was being read


async def _sluice_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SluiceError)
    return JSONResponse(exc.to_json(), status_code=exc.http_status)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = exc.detail.lower().replace(" ", "_")
    body = {"error": {"code": code, "message": exc.detail}}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _internal_error(_request: Request, _exc: Exception) -> Response:
    body = {"error": {"code": "internal_error", "message": "internal error in the worker"}}
    return JSONResponse(body, status_code=500)
