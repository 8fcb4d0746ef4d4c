"""A real HTTP server on 127.0.0.1 that speaks just enough of two model APIs for the tests.

It answers `POST .../chat/completions` like an OpenAI-compatible API and `POST .../messages`
like the Anthropic Messages API, streamed (SSE) when the request says `"stream": true`.
Tests script each request in advance (`push(Script(...))`: answer normally, stream, fail with
a status, hang, stall mid-stream, cut the connection...) and afterwards read what the server
received (`requests`: path, headers, JSON body, arrival time, whether the client hung up).

It runs uvicorn in the test's own event loop; `run_fake_api_server()` is the only way in.
The ASGI app is written by hand (no framework) so a disconnect is observed exactly: uvicorn's
`receive()` returns `http.disconnect` the moment the client closes its connection.
"""

from __future__ import annotations

import json
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn

from tests.waiting import scaled

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

STARTUP_TIMEOUT_S = 10.0  # uvicorn binds an already-open socket: this only guards a hang
SHUTDOWN_TIMEOUT_S = 5  # every handler is released on stop, so shutdown is quick
STARTUP_POLL_S = 0.005  # uvicorn exposes `started` as a flag only, so it is polled


class CutConnection(Exception):
    """Raised inside the app after the response started: uvicorn then drops the connection."""


@dataclass
class Script:
    """What the server does with one request. The defaults are a normal successful answer."""

    status: int = 200
    chunks: tuple[str, ...] = ("Hello", ", ", "world")
    input_tokens: int = 11
    output_tokens: int = 3
    cache_read_tokens: int = 0
    model: str | None = None  # None: echo the model the request named
    stop_reason: str | None = None  # None: the kind's normal end ("stop" / "end_turn")
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers
    body: str | None = None  # raw body of an error answer (None: a kind-shaped error JSON)
    echo_credentials: bool = False  # put the received auth header values in the error body
    stream: bool | None = None  # None: stream exactly when the request asked to
    hang: bool = False  # never answer; return when the client hangs up
    stall_after: int | None = None  # stream this many chunks, then wait for the hang-up
    cut_after: int | None = None  # stream this many chunks, then drop the connection
    omit_end: bool = False  # finish the body without the closing events
    error_event: str | None = None  # after the chunks, send an in-stream error of this type


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # the parsed JSON body (None when not JSON)
    raw_body: bytes
    received_at: float  # time.monotonic() when the whole body had arrived
    disconnected: anyio.Event = field(default_factory=anyio.Event)  # client hung up early


class FakeApiServer:
    """The ASGI app plus the test-facing controls. Build with `run_fake_api_server()`."""

    def __init__(self) -> None:
        self.base_url = ""  # "http://127.0.0.1:<port>", set once listening
        self.requests: list[RecordedRequest] = []
        self._scripts: deque[Script] = deque()
        self._arrived = anyio.Event()
        self._closing = anyio.Event()

    # -- test-facing ---------------------------------------------------------------

    def push(self, *scripts: Script) -> None:
        """Queue how the next requests are answered, in order (then: the default Script)."""
        self._scripts.extend(scripts)

    async def wait_for_requests(self, count: int) -> list[RecordedRequest]:
        """Return once at least `count` requests arrived (the caller bounds the wait)."""
        while len(self.requests) < count:
            self._arrived = anyio.Event()
            if len(self.requests) >= count:
                break
            await self._arrived.wait()
        return self.requests

    # -- the ASGI app --------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = RecordedRequest(
            method=scope["method"],
            path=scope["path"],
            headers={k.decode().lower(): v.decode() for k, v in scope["headers"]},
            body=body,
            raw_body=raw,
            received_at=time.monotonic(),
        )
        self.requests.append(record)
        self._arrived.set()
        script = self._scripts.popleft() if self._scripts else Script()
        kind = "anthropic" if scope["path"].endswith("/messages") else "openai"
        if script.hang:
            await self._until_hang_up(receive, record)
        elif script.status != 200:
            await self._send_error(send, kind, script, record)
        elif script.stream if script.stream is not None else bool((body or {}).get("stream")):
            await self._send_stream(send, receive, kind, script, record)
        else:
            await self._send_json(send, 200, _full_answer(kind, script, body or {}), script.headers)

    async def _until_hang_up(self, receive: Receive, record: RecordedRequest) -> None:
        """Wait until the client closes the connection (or the server stops)."""
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                record.disconnected.set()
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await self._closing.wait()
            tg.cancel_scope.cancel()

    async def _send_json(self, send: Send, status: int, payload: Any,
                         headers: dict[str, str]) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"),
                        *((k.encode(), v.encode()) for k, v in headers.items())],
        })
        await send({"type": "http.response.body", "body": data})

    async def _send_error(self, send: Send, kind: str, script: Script,
                          record: RecordedRequest) -> None:
        if script.body is not None:
            payload: Any = script.body.encode()
        else:
            message = f"fake error {script.status}"
            if script.echo_credentials:
                # What a careless API might do: quote the credentials it was given.
                message += (f" (got authorization={record.headers.get('authorization')!r}"
                            f" x-api-key={record.headers.get('x-api-key')!r})")
            payload = ({"type": "error", "error": {"type": "api_error", "message": message}}
                       if kind == "anthropic"
                       else {"error": {"message": message, "type": "api_error", "code": None}})
        await self._send_json(send, script.status, payload, script.headers)

    async def _send_stream(self, send: Send, receive: Receive, kind: str, script: Script,
                           record: RecordedRequest) -> None:
        events = (_anthropic_events if kind == "anthropic" else _openai_events)(
            script, record.body or {})
        await send({
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-cache"),
                        *((k.encode(), v.encode()) for k, v in script.headers.items())],
        })
        chunks_sent = 0
        for name, payload in events:
            if name == "chunk":
                if chunks_sent == script.stall_after:
                    await self._until_hang_up(receive, record)
                    return
                if chunks_sent == script.cut_after:
                    raise CutConnection("scripted connection cut")
                chunks_sent += 1
            if name == "end" and script.omit_end:
                break
            await send({"type": "http.response.body", "body": payload, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


# -- answer bodies in each API's shape ----------------------------------------------


def _sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def _full_answer(kind: str, script: Script, request: dict[str, Any]) -> dict[str, Any]:
    model = script.model or request.get("model")
    text = "".join(script.chunks)
    if kind == "anthropic":
        return {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": script.stop_reason or "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": script.input_tokens, "output_tokens": script.output_tokens,
                      "cache_read_input_tokens": script.cache_read_tokens,
                      "cache_creation_input_tokens": 0},
        }
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": script.stop_reason or "stop"}],
        "usage": {"prompt_tokens": script.input_tokens,
                  "completion_tokens": script.output_tokens,
                  "total_tokens": script.input_tokens + script.output_tokens,
                  "prompt_tokens_details": {"cached_tokens": script.cache_read_tokens}},
    }


def _openai_events(script: Script, request: dict[str, Any]) -> list[tuple[str, bytes]]:
    model = script.model or request.get("model")
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
            "model": model}
    events = [("head", _sse({**base, "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}))]
    for text in script.chunks:
        events.append(("chunk", _sse({**base, "choices": [
            {"index": 0, "delta": {"content": text}, "finish_reason": None}]})))
    if script.error_event:
        events.append(("error", _sse({"error": {"message": "fake in-stream failure",
                                                "type": script.error_event}})))
    events.append(("end", _sse({**base, "choices": [
        {"index": 0, "delta": {}, "finish_reason": script.stop_reason or "stop"}]})))
    if (request.get("stream_options") or {}).get("include_usage"):
        events.append(("end", _sse({**base, "choices": [], "usage": {
            "prompt_tokens": script.input_tokens, "completion_tokens": script.output_tokens,
            "total_tokens": script.input_tokens + script.output_tokens,
            "prompt_tokens_details": {"cached_tokens": script.cache_read_tokens}}})))
    events.append(("end", _sse("[DONE]")))
    return events


def _anthropic_events(script: Script, request: dict[str, Any]) -> list[tuple[str, bytes]]:
    model = script.model or request.get("model")
    events = [
        ("head", _sse({"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": script.input_tokens, "output_tokens": 1,
                      "cache_read_input_tokens": script.cache_read_tokens,
                      "cache_creation_input_tokens": 0}}}, "message_start")),
        ("head", _sse({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}, "content_block_start")),
        ("head", _sse({"type": "ping"}, "ping")),
    ]
    for text in script.chunks:
        events.append(("chunk", _sse({"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "text_delta", "text": text}},
                                     "content_block_delta")))
    if script.error_event:
        events.append(("error", _sse({"type": "error", "error": {
            "type": script.error_event, "message": "fake in-stream failure"}}, "error")))
    events += [
        ("end", _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")),
        ("end", _sse({"type": "message_delta",
                      "delta": {"stop_reason": script.stop_reason or "end_turn",
                                "stop_sequence": None},
                      "usage": {"output_tokens": script.output_tokens}}, "message_delta")),
        ("end", _sse({"type": "message_stop"}, "message_stop")),
    ]
    return events


# -- running it ----------------------------------------------------------------------


def free_loopback_port() -> int:
    """A port nothing listens on right now (for connection-refused tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def run_fake_api_server() -> AsyncIterator[FakeApiServer]:
    """Serve a FakeApiServer on 127.0.0.1 (a free port) for the duration of the block."""
    app = FakeApiServer()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    app.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(app, lifespan="off", http="h11", log_level="critical",
                            access_log=False, timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S)
    server = uvicorn.Server(config)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(scaled(STARTUP_TIMEOUT_S)):
                while not server.started:
                    await anyio.sleep(STARTUP_POLL_S)
            try:
                yield app
            finally:
                app._closing.set()
                server.should_exit = True
                server.force_exit = True
    finally:
        sock.close()
