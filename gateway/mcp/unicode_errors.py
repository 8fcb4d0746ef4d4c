"""Requests that are JSON but not valid Unicode: answered with an error for their own id.

A lone UTF-16 surrogate (`"\\ud800"`) is legal JSON syntax, but the SDK's parser (pydantic's)
refuses it, and the SDK then has no id to answer: over stdio the message was dropped and the
caller waited for its timeout; over HTTP the answer is a parse error with `id: null`, which a
client cannot match to its call. Python's own JSON parser accepts the text, so the id can
be recovered and the call answered with a parse error that says what to fix. Both
transports use `error_for`: stdio filters the SDK's read stream (`answer_unparsable`), the
HTTP guard rewrites the SDK's 400 answer (`rewrite_parse_error`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from mcp.types import PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError
from starlette.types import Message, Receive, Send

log = structlog.get_logger(__name__)

MESSAGE = ("The request is not valid Unicode: a string in it holds a lone UTF-16 surrogate "
           "(\\ud800-\\udfff without its pair) or bytes that are not UTF-8. Send well-formed "
           "text (pair or drop the surrogate) and call again.")


def error_for(raw: str | bytes) -> JSONRPCError | None:
    """A parse error for the request in `raw`, with its id, when Python's JSON parser can
    read it and it is a request (has a method and an id). None otherwise (nothing to
    answer: a notification, or really not JSON, which the SDK answers itself)."""
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    try:
        message: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    log.warning("request refused: not valid Unicode", action="bad_unicode",
                method=message["method"][:100])
    return JSONRPCError(jsonrpc="2.0", id=request_id,
                        error=ErrorData(code=PARSE_ERROR, message=MESSAGE))


def _unparsable_input(item: Exception) -> str | None:
    if not isinstance(item, ValidationError):
        return None
    for err in item.errors():
        if err.get("type") == "json_invalid" and isinstance(err.get("input"), str | bytes):
            return str(err["input"]) if isinstance(err["input"], str) else err["input"].decode(
                "utf-8", "surrogateescape")
    return None


@contextlib.asynccontextmanager
async def answer_unparsable(
    read_stream: MemoryObjectReceiveStream[SessionMessage | Exception],
    write_stream: MemoryObjectSendStream[SessionMessage],
) -> AsyncIterator[MemoryObjectReceiveStream[SessionMessage | Exception]]:
    """The stdio read stream, minus the lines the SDK could not parse but whose request id
    is known: those are answered on `write_stream` with `error_for`'s parse error."""
    send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def forward() -> None:
        async with send, read_stream:
            async for item in read_stream:
                raw = _unparsable_input(item) if isinstance(item, Exception) else None
                answer = error_for(raw) if raw is not None else None
                if answer is None:
                    await send.send(item)
                    continue
                with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await write_stream.send(SessionMessage(answer))

    async with anyio.create_task_group() as tg:
        tg.start_soon(forward)
        try:
            yield receive
        finally:
            tg.cancel_scope.cancel()


def rewrite_parse_error(receive: Receive, send: Send) -> tuple[Receive, Send]:
    """For one HTTP POST: keep a copy of the body as the SDK reads it, and when the SDK
    answers it with a parse error for `id: null`, answer `error_for(body)` instead."""
    body = bytearray()
    held: Message | None = None

    async def teed_receive() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            body.extend(message.get("body", b""))
        return message

    async def rewriting_send(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message["status"] == 400:
            held = message  # decided once the body says whether it is a parse error
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        start, held = held, None
        answer = error_for(bytes(body)) if _is_null_parse_error(message) else None
        if answer is None:
            await send(start)
            await send(message)
            return
        data = answer.model_dump_json(by_alias=True, exclude_unset=True).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data, "more_body": False})

    return teed_receive, rewriting_send


def _is_null_parse_error(message: Message) -> bool:
    if message.get("more_body"):
        return False
    try:
        answer = json.loads(message.get("body", b""))
    except ValueError:
        return False
    return (isinstance(answer, dict) and answer.get("id") is None
            and isinstance(answer.get("error"), dict)
            and answer["error"].get("code") == PARSE_ERROR)


def unencodable_path(value: Any, path: str = "") -> str | None:
    """Where in a tool's (already parsed) arguments a string cannot be UTF-8 encoded (a lone
    surrogate, as an in-process client or a lenient parser can pass one), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "(value)"
        return None
    if isinstance(value, dict):
        for key, inner in value.items():
            where = unencodable_path(key, f"{path}.<key>") or unencodable_path(
                inner, f"{path}.{key}" if path else str(key))
            if where is not None:
                return where
    elif isinstance(value, list | tuple):
        for index, inner in enumerate(value):
            where = unencodable_path(inner, f"{path}[{index}]")
            if where is not None:
                return where
    return None
