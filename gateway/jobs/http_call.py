"""One call to an HTTP model API as a job runs it: keys, retries, timeouts, errors.

The HTTP twin of `gateway/jobs/run/runner.py`. `await call_api(name, config, request,
on_progress=..., client=...)` makes one streamed call, with retries, and returns a
`ProviderResult` or raises `GatewayError`; a job calls `call_normalized` with the request
its target normalized once (the dict its row stores). The request model and its secret-free
description live in `providers/http/request.py`, the wire formats in
`providers/http/openai.py` and `providers/http/anthropic.py`.

The API key is read from `os.environ[config.api_key_env]` at call time and lives only in the
request headers: it is never stored, logged, or quoted in an error (error bodies are scrubbed
of it, because some APIs echo the credentials they were given).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import anyio
import httpx2
import structlog

from gateway.backoff import Backoff
from gateway.config import ApiProviderConfig
from gateway.model import ErrorKind, GatewayError
from providers.base import InvalidRequest, ProviderResult
from providers.http import anthropic, openai
from providers.http.request import (
    ApiRequest,
    is_loopback_url,
    normalized_request,
    parse_retry_after,
    redact_url,
    scrub,
)
from providers.http.wire import (
    AnswerSummary,
    StreamFailure,
    StreamParser,
    WireFormat,
    error_detail,
)

log = structlog.get_logger(__name__)

# Retry defaults follow the anchor gateway (3 attempts for HTTP, 1 s x 2^n capped at 30 s).
MAX_ATTEMPTS = 3  # one try plus two retries: rides out a blip, stays bounded in an outage
BACKOFF_BASE_S = 1.0  # the first retry waits about this long; each later one doubles it
BACKOFF_MAX_S = 30.0  # no single backoff wait grows beyond this
BACKOFF_JITTER = 0.5  # a wait is drawn from [1 - jitter, 1] x backoff so clients spread out
MAX_RETRY_AFTER_S = 120.0  # a server asking for a longer pause fails the call instead
CONNECT_TIMEOUT_S = 10.0  # a host that does not accept a connection this fast is retried
ERROR_BODY_MAX_BYTES = 8192  # read no more of an error body than this
ERROR_EXCERPT_CHARS = 300  # how much of an error body a message quotes
MIN_SCRUB_LEN = 6  # configured header values shorter than this are not scrubbed from text


_WIRES: dict[str, WireFormat] = {"openai": openai, "anthropic": anthropic}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently `call_api` retries connection errors, 429 and 5xx.

    Tests pass a fast policy (`RetryPolicy(base_delay_s=0.01)`); production uses the default.
    A server's Retry-After is always honoured (up to `max_retry_after_s`), whatever the policy.
    """

    max_attempts: int = MAX_ATTEMPTS
    base_delay_s: float = BACKOFF_BASE_S
    max_delay_s: float = BACKOFF_MAX_S
    jitter: float = BACKOFF_JITTER
    max_retry_after_s: float = MAX_RETRY_AFTER_S

    def backoff(self, failed_attempts: int) -> float:
        """The wait before the next attempt after `failed_attempts` failures (>= 1)."""
        return Backoff(self.base_delay_s, self.max_delay_s, self.jitter).wait(failed_attempts)


DEFAULT_RETRY_POLICY = RetryPolicy()


def _read_api_key(name: str, config: ApiProviderConfig) -> str | None:
    """The key from the environment now, or None when none is needed or configured.

    Raises GatewayError(AUTH) naming the variable when a remote API's key is missing.
    """
    if config.api_key_env is None:
        return None  # keyless endpoint, or auth given in [api_providers.<name>] headers
    key = os.environ.get(config.api_key_env, "").strip()
    if key:
        return key
    if is_loopback_url(config.base_url):
        return None  # a local server (Ollama, LM Studio) usually needs no key
    raise GatewayError(
        ErrorKind.AUTH,
        f"api provider '{name}' needs an API key: set the environment variable "
        f"{config.api_key_env} for the gateway process (MCP clients do not pass your shell's "
        f"variables: put it in the client's `env` for this server)")


# -- one call ------------------------------------------------------------------------------


class _Retry(Exception):
    """An attempt failed in a way a new attempt may cure; `error` is raised if none is left."""

    def __init__(self, error: GatewayError, reason: str, retry_after: float | None = None):
        super().__init__(error.message)
        self.error = error
        self.reason = reason
        self.retry_after = retry_after


class _Collector:
    """Accumulates the answer's text deltas and reports the running byte count."""

    def __init__(self, on_progress: Callable[[int], None] | None) -> None:
        self._parts: list[str] = []
        self._on_progress = on_progress
        self.bytes = 0

    def add(self, text: str) -> None:
        if not text:
            return
        self._parts.append(text)
        self.bytes += len(text.encode())
        if self._on_progress is not None:
            self._on_progress(self.bytes)

    def take_text(self) -> str:
        text = "".join(self._parts)
        self._parts = []
        return text


@dataclass(slots=True)
class _Call:
    """Everything one `call_api` needs across attempts (the key only inside `headers`)."""

    name: str
    config: ApiProviderConfig
    wire: WireFormat
    url: str
    shown_url: str  # the URL as messages may show it
    headers: httpx2.Headers
    body: dict[str, Any]
    secrets: tuple[str, ...]  # strings scrubbed from every text we quote
    key_sent: bool

    def excerpt(self, text: str) -> str:
        flat = " ".join(scrub(text, self.secrets).split())
        return flat if len(flat) <= ERROR_EXCERPT_CHARS else flat[:ERROR_EXCERPT_CHARS] + "..."


async def call_api(
    name: str,
    config: ApiProviderConfig,
    request: ApiRequest,
    *,
    on_progress: Callable[[int], None] | None = None,
    client: httpx2.AsyncClient | None = None,
    retry: RetryPolicy = DEFAULT_RETRY_POLICY,
) -> ProviderResult:
    """Send `request` to the API provider `name` as one streamed call and collect the answer.

    `on_progress(bytes_so_far)` is called as text arrives (UTF-8 bytes of answer text); an
    exception it raises aborts the call and propagates unchanged. `client` lets the caller
    share a connection pool (it is not closed here); by default a client is made per call.
    The whole call, retries and their waits included, is bounded by `config.timeout_s`.
    Cancelling the task running this aborts the HTTP request (the connection is closed).

    Retries (per `retry`) only connection errors, 429 and 5xx answers, and overload errors
    that arrive before any text; honours Retry-After. Never retries after text arrived.

    Raises GatewayError with kind:
    - INVALID_INPUT: no model, a value out of range, or an unusable base_url;
    - AUTH: the key's env var is not set, or the API answered 401/403 (the message names the
      env var to check, never the key);
    - TIMEOUT: `config.timeout_s` passed;
    - PROVIDER_ERROR: any other 4xx, 429/5xx/connection errors after the last attempt, an
      error inside the stream, or a stream that ended before the answer was complete.
    """
    try:
        normalized = normalized_request(name, config, request)
    except InvalidRequest as exc:
        raise GatewayError(ErrorKind.INVALID_INPUT, str(exc)) from None
    return await call_normalized(name, config, normalized, on_progress=on_progress,
                                 client=client, retry=retry)


async def call_normalized(
    name: str,
    config: ApiProviderConfig,
    normalized: Mapping[str, Any],
    *,
    on_progress: Callable[[int], None] | None = None,
    client: httpx2.AsyncClient | None = None,
    retry: RetryPolicy = DEFAULT_RETRY_POLICY,
) -> ProviderResult:
    """`call_api` for a request already normalized by `normalized_request` with this
    `config`: a job's HTTP target carries it (the row stores it), so a job's call sends
    exactly what was stored and normalizes nothing again. Same behaviour and errors."""
    wire = _WIRES[config.kind]
    api_key = _read_api_key(name, config)
    headers = httpx2.Headers(wire.auth_headers(api_key))
    for header, value in config.headers.items():
        headers[header] = value  # configured headers win (e.g. another anthropic-version)
    secrets = tuple(s for s in (api_key, *config.headers.values())
                    if s and (s == api_key or len(s) >= MIN_SCRUB_LEN))
    url = wire.endpoint(config.base_url)
    call = _Call(name=name, config=config, wire=wire, url=url, shown_url=redact_url(url),
                 headers=headers, body=wire.build_body(normalized), secrets=secrets,
                 key_sent=api_key is not None)
    collector = _Collector(on_progress)
    try:
        with anyio.fail_after(config.timeout_s) as scope:
            async with _http_client(client) as http:
                summary, status, attempts = await _with_retries(call, http, collector, retry,
                                                                scope.deadline)
    except TimeoutError:
        raise GatewayError(
            ErrorKind.TIMEOUT,
            f"api provider '{name}' did not finish within {config.timeout_s:g} s "
            f"(raise timeout_s in [api_providers.{name}] for long generations)") from None
    model = summary.model or normalized["model"]
    log.info("api call finished", action="http_api_done", provider=name, model=model,
             http_status=status, attempts=attempts, output_bytes=collector.bytes,
             stop_reason=summary.stop_reason)
    return ProviderResult(
        text=collector.take_text(),
        usage=summary.usage.found(),
        extra={"model": model, "stop_reason": summary.stop_reason, "http_status": status,
               "attempts": attempts, "response_id": summary.response_id},
    )


@asynccontextmanager
async def _http_client(client: httpx2.AsyncClient | None) -> AsyncIterator[httpx2.AsyncClient]:
    if client is not None:
        yield client
        return
    async with httpx2.AsyncClient(timeout=_timeouts(), follow_redirects=False) as owned:
        yield owned


def _timeouts() -> httpx2.Timeout:
    # Only connecting has its own limit; reads may pause for as long as a model thinks,
    # and the whole call is bounded by config.timeout_s around it.
    return httpx2.Timeout(None, connect=CONNECT_TIMEOUT_S)


async def _with_retries(call: _Call, http: httpx2.AsyncClient, collector: _Collector,
                        policy: RetryPolicy, deadline: float) -> tuple[AnswerSummary, int, int]:
    """Run attempts until one succeeds, one fails for good, or retrying is pointless."""
    attempt = 0
    while True:
        attempt += 1
        try:
            summary, status = await _attempt(call, http, collector)
            return summary, status, attempt
        except _Retry as failure:
            error = failure.error
            if attempt >= policy.max_attempts:
                raise GatewayError(error.kind, f"{error.message} (gave up after {attempt} "
                                               "attempts)") from None
            delay = policy.backoff(attempt)
            if failure.retry_after is not None:
                if failure.retry_after > policy.max_retry_after_s:
                    raise GatewayError(
                        error.kind, f"{error.message} (the API asked to wait "
                        f"{failure.retry_after:g} s before retrying; try again later)") from None
                delay = max(delay, failure.retry_after)
            if delay >= deadline - anyio.current_time():
                raise GatewayError(
                    error.kind, f"{error.message} (a retry in {delay:.3g} s would pass "
                    f"timeout_s = {call.config.timeout_s:g} s)") from None
            log.warning("retrying api call", action="http_api_retry", provider=call.name,
                        attempt=attempt, reason=failure.reason, delay_s=round(delay, 3))
            await anyio.sleep(delay)


async def _attempt(call: _Call, http: httpx2.AsyncClient,
                   collector: _Collector) -> tuple[AnswerSummary, int]:
    """One HTTP exchange. Raises _Retry for what a new attempt may cure."""
    try:
        async with http.stream("POST", call.url, json=call.body, headers=call.headers,
                               timeout=_timeouts()) as response:
            status = response.status_code
            if status >= 300:
                raise await _status_error(call, response)
            content_type = response.headers.get("content-type", "").partition(";")[0].strip()
            if content_type.lower() == "text/event-stream":
                return await _read_stream(call, response, collector), status
            return await _read_whole_answer(call, response, collector), status
    except (httpx2.NetworkError, httpx2.RemoteProtocolError, httpx2.ConnectTimeout,
            httpx2.ProxyError) as exc:
        what = f"{type(exc).__name__}: {call.excerpt(str(exc)) or 'connection failed'}"
        if collector.bytes == 0:
            raise _Retry(GatewayError(
                ErrorKind.PROVIDER_ERROR,
                f"could not get an answer from api provider '{call.name}' at "
                f"{call.shown_url} ({what})"), reason=type(exc).__name__) from None
        raise GatewayError(
            ErrorKind.PROVIDER_ERROR,
            f"the connection to api provider '{call.name}' broke after {collector.bytes} "
            f"bytes of answer ({what})") from None
    except httpx2.TimeoutException:
        # Only a caller-supplied client's own read/write/pool limits can land here.
        raise GatewayError(ErrorKind.TIMEOUT,
                           f"api provider '{call.name}' stopped answering "
                           "(an HTTP read or write timed out)") from None
    except httpx2.InvalidURL:
        raise GatewayError(ErrorKind.INVALID_INPUT,
                           f"base_url of [api_providers.{call.name}] is not a valid URL: "
                           f"{call.shown_url}") from None
    except (httpx2.HTTPError, httpx2.StreamError) as exc:
        raise GatewayError(
            ErrorKind.PROVIDER_ERROR,
            f"the HTTP exchange with api provider '{call.name}' failed "
            f"({type(exc).__name__}: {call.excerpt(str(exc))}); check base_url "
            f"{call.shown_url}") from None


async def _status_error(call: _Call, response: httpx2.Response) -> Exception:
    """The error (a GatewayError, or a _Retry for 429/5xx) for a non-2xx answer."""
    status = response.status_code
    head = bytearray()
    async with aclosing(response.aiter_bytes()) as chunks:
        async for chunk in chunks:
            head += chunk
            if len(head) >= ERROR_BODY_MAX_BYTES:
                break
    text = bytes(head[:ERROR_BODY_MAX_BYTES]).decode("utf-8", errors="replace")
    try:
        detail = error_detail(json.loads(text)) or text
    except ValueError:
        detail = text
    detail = call.excerpt(detail) or response.reason_phrase or "no details"
    name = call.name
    if status in (401, 403):
        env = call.config.api_key_env
        if env is None:
            hint = (f"set api_key_env in [api_providers.{name}] to the NAME of the environment "
                    "variable that holds the API key")
        elif not call.key_sent:
            hint = f"set the environment variable {env} for the gateway (it is not set)"
        else:
            hint = (f"check that the environment variable {env} holds a valid API key "
                    f"for {urlsplit(call.url).hostname}")
        return GatewayError(ErrorKind.AUTH, f"api provider '{name}' refused the credentials "
                                            f"(HTTP {status}: {detail}); {hint}")
    if status == 429 or status >= 500:
        what = "rate limited" if status == 429 else "failed"
        return _Retry(GatewayError(ErrorKind.PROVIDER_ERROR,
                                   f"api provider '{name}' {what} (HTTP {status}: {detail})"),
                      reason=f"http_{status}", retry_after=parse_retry_after(response.headers))
    if 300 <= status < 400:
        return GatewayError(ErrorKind.PROVIDER_ERROR,
                            f"api provider '{name}' answered with a redirect (HTTP {status}); "
                            f"check base_url ({redact_url(call.config.base_url)})")
    hint = "; check base_url and the model name" if status == 404 else ""
    return GatewayError(ErrorKind.PROVIDER_ERROR,
                        f"api provider '{name}' rejected the request (HTTP {status}: "
                        f"{detail}){hint}")


async def _read_stream(call: _Call, response: httpx2.Response,
                       collector: _Collector) -> AnswerSummary:
    """Parse the SSE answer event by event; text goes to the collector as it arrives."""
    parser = call.wire.new_stream_parser()
    # EventSource iterates as an async generator; aclosing finalizes it even on break/cancel.
    events_iter = cast(AsyncGenerator[httpx2.ServerSentEvent, None],
                       httpx2.EventSource(response).__aiter__())
    async with aclosing(events_iter) as events:
        async for event in events:
            # on_progress runs outside _feed, so its exceptions propagate unchanged.
            collector.add(_feed(call, parser, event, collector.bytes))
            if parser.summary.ended:
                break
    if not parser.summary.complete:
        error = GatewayError(ErrorKind.PROVIDER_ERROR,
                             f"the answer stream of api provider '{call.name}' ended before "
                             f"the answer was complete (after {collector.bytes} bytes)")
        if collector.bytes == 0:
            raise _Retry(error, reason="stream_ended_early")
        raise error
    return parser.summary


def _feed(call: _Call, parser: StreamParser, event: httpx2.ServerSentEvent,
          bytes_so_far: int) -> str:
    """One event through the parser, its failures turned into gateway errors."""
    try:
        return parser.feed(event)
    except StreamFailure as exc:
        error = GatewayError(ErrorKind.PROVIDER_ERROR,
                             f"api provider '{call.name}' reported an error mid-answer: "
                             f"{call.excerpt(str(exc))}")
        if exc.retryable and bytes_so_far == 0:
            raise _Retry(error, reason="stream_error") from None
        raise error from None
    except ValueError as exc:
        raise GatewayError(ErrorKind.PROVIDER_ERROR,
                           f"api provider '{call.name}' sent an unreadable stream event "
                           f"({call.excerpt(str(exc))})") from None


async def _read_whole_answer(call: _Call, response: httpx2.Response,
                             collector: _Collector) -> AnswerSummary:
    """A server that ignored `stream: true` and sent one JSON answer."""
    raw = await response.aread()
    try:
        body = json.loads(raw)
        if isinstance(body, Mapping) and "error" in body:
            raise GatewayError(ErrorKind.PROVIDER_ERROR,
                               f"api provider '{call.name}' answered with an error: "
                               f"{call.excerpt(error_detail(body) or '')}")
        text, summary = call.wire.parse_answer(body)
    except ValueError as exc:
        raise GatewayError(ErrorKind.PROVIDER_ERROR,
                           f"api provider '{call.name}' sent an answer that is not the "
                           f"expected JSON ({call.excerpt(str(exc))})") from None
    collector.add(text)
    return summary
