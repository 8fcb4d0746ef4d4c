"""HTTP model-API providers against a real local HTTP server (tests/fakes/fake_api_server.py).

Every test sends real HTTP to 127.0.0.1 and asserts both what call_api returned or raised
and what the server actually received (headers, body, arrival times, hang-ups).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import pytest
import structlog
from pydantic import ValidationError

from gateway.config import ApiProviderConfig
from gateway.jobs.http_call import RetryPolicy, call_api
from gateway.model import ErrorKind, GatewayError
from providers.base import InvalidRequest
from providers.http.request import ApiMessage, ApiRequest, normalized_request, parse_retry_after
from tests.fakes.fake_api_server import (
    FakeApiServer,
    Script,
    free_loopback_port,
    run_fake_api_server,
)
from tests.waiting import scaled, wait_for

pytestmark = pytest.mark.anyio

KEY = "sk-test-0123456789abcdefSECRET"
KEY_ENV = "ACG_TEST_HTTP_API_KEY"
FAST = RetryPolicy(base_delay_s=0.01, max_delay_s=0.05)  # keeps retry tests quick
WAIT_S = 10  # bound on every wait for the server to observe something


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    async with run_fake_api_server() as fake:
        yield fake


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY


def config_for(server: FakeApiServer, kind: str, **overrides: Any) -> ApiProviderConfig:
    base = server.base_url + ("/v1" if kind == "openai" else "")
    values: dict[str, Any] = {"kind": kind, "base_url": base, "api_key_env": KEY_ENV,
                              "default_model": f"{kind}-default-model", "timeout_s": 30}
    values.update(overrides)
    return ApiProviderConfig(**values)


def remote_config(kind: str = "openai", **overrides: Any) -> ApiProviderConfig:
    """A config for a non-loopback API (nothing is sent: it fails before the network)."""
    values: dict[str, Any] = {"kind": kind, "base_url": "https://api.example.com/v1",
                              "api_key_env": KEY_ENV, "default_model": "m"}
    values.update(overrides)
    return ApiProviderConfig(**values)


KINDS = pytest.mark.parametrize("kind", ["openai", "anthropic"])


# -- the request model and its normal form ---------------------------------------------------


def test_api_request_needs_exactly_one_of_prompt_or_messages() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        ApiRequest()
    with pytest.raises(ValidationError, match="exactly one"):
        ApiRequest.model_validate({"prompt": "hi",
                                   "messages": [{"role": "user", "content": "hi"}]})
    assert ApiRequest(prompt="hi").prompt == "hi"
    assert ApiRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}]}).messages is not None


def test_api_request_rejects_unknown_fields_and_out_of_range_values() -> None:
    with pytest.raises(ValidationError):
        ApiRequest.model_validate({"prompt": "hi", "top_k": 3})
    with pytest.raises(ValidationError):
        ApiRequest(prompt="hi", temperature=2.5)
    with pytest.raises(ValidationError):
        ApiRequest(prompt="hi", max_output_tokens=0)
    with pytest.raises(ValidationError):
        ApiRequest.model_validate({"messages": [{"role": "system", "content": "be terse"}]})


def test_api_request_fields_are_described_for_an_agent() -> None:
    properties = ApiRequest.model_json_schema()["properties"]
    assert set(properties) == {"prompt", "messages", "model", "system", "temperature",
                               "max_output_tokens"}
    assert all(properties[name].get("description") for name in properties)


def test_normalized_request_turns_a_prompt_into_one_user_message_with_the_default_model() -> None:
    config = remote_config()
    normal = normalized_request("oa", config, ApiRequest(prompt="hello", system="be terse",
                                                         temperature=0.2))
    assert normal == {
        "transport": "http", "provider": "oa", "kind": "openai",
        "base_url": "https://api.example.com/v1", "model": "m", "system": "be terse",
        "messages": [{"role": "user", "content": "hello"}], "temperature": 0.2,
        "max_output_tokens": None, "headers": {},
    }
    same = normalized_request("oa", config, ApiRequest.model_validate(
        {"messages": [{"role": "user", "content": "hello"}], "system": "be terse",
         "temperature": 0.2}))
    assert json.dumps(same, sort_keys=True) == json.dumps(normal, sort_keys=True)
    assert normalized_request("oa", config, ApiRequest(prompt="hello", model="x"))["model"] == "x"


def test_normalized_request_records_the_max_tokens_anthropic_will_be_sent() -> None:
    normal = normalized_request("an", remote_config("anthropic"), ApiRequest(prompt="hi"))
    assert normal["max_output_tokens"] == 4096


def test_normalized_request_without_any_model_is_invalid_input() -> None:
    with pytest.raises(InvalidRequest) as info:
        normalized_request("oa", remote_config(default_model=None), ApiRequest(prompt="hi"))
    assert "default_model" in str(info.value) and "[api_providers.oa]" in str(info.value)


def test_anthropic_temperature_above_one_is_invalid_input() -> None:
    with pytest.raises(InvalidRequest, match="out of range"):
        normalized_request("an", remote_config("anthropic"),
                           ApiRequest(prompt="hi", temperature=1.5))


def test_normalized_request_holds_no_secret_header_value_or_url_secret() -> None:
    config = remote_config(
        base_url="https://user:pw-SECRET-1@api.example.com/v1?api-version=2&key=qs-SECRET-2",
        headers={"X-Custom-Token": "hdr-SECRET-3", "anthropic-beta": "tools-2024"})
    text = json.dumps(normalized_request("oa", config, ApiRequest(prompt="hi")))
    for secret in ("pw-SECRET-1", "qs-SECRET-2", "hdr-SECRET-3", KEY):
        assert secret not in text
    normal = json.loads(text)
    assert normal["headers"] == {"anthropic-beta": "tools-2024", "X-Custom-Token": "[redacted]"}
    assert "api-version=2" in normal["base_url"]


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"retry-after": "7"}, now) == 7
    assert parse_retry_after({"retry-after": "1.5"}, now) == 1.5
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"retry-after": date}, now) == 30
    assert parse_retry_after({"retry-after": format_datetime(now - timedelta(seconds=5),
                                                             usegmt=True)}, now) == 0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}, now) == 0.25
    assert parse_retry_after({"retry-after": "soon"}, now) is None
    assert parse_retry_after({"retry-after": "nan"}, now) is None
    assert parse_retry_after({}, now) is None


# -- successful calls --------------------------------------------------------------------------


@KINDS
async def test_a_streamed_answer_concatenates_deltas_and_reads_usage(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(chunks=("Hel", "lo ", "wörld"), input_tokens=21, output_tokens=4,
                       cache_read_tokens=5))
    progress: list[int] = []
    result = await call_api("p", config_for(server, kind), ApiRequest(prompt="say hello"),
                            on_progress=progress.append, retry=FAST)
    assert result.text == "Hello wörld"
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (21, 4)
    assert result.usage.cache_read_tokens == 5
    assert result.extra["model"] == f"{kind}-default-model"
    assert result.extra["stop_reason"] == ("stop" if kind == "openai" else "end_turn")
    assert result.extra["http_status"] == 200
    assert progress == [3, 6, len("Hello wörld".encode())]
    (sent,) = server.requests
    assert sent.body["stream"] is True


async def test_openai_request_is_streamed_with_usage_and_bearer_auth(
        server: FakeApiServer, api_key: str) -> None:
    config = config_for(server, "openai", headers={"X-Org": "team-a"})
    await call_api("oa", config, ApiRequest(prompt="hi", system="be terse", temperature=0.3,
                                            max_output_tokens=50, model="gpt-test"), retry=FAST)
    (sent,) = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["x-org"] == "team-a"
    assert sent.body == {
        "model": "gpt-test",
        "messages": [{"role": "system", "content": "be terse"},
                     {"role": "user", "content": "hi"}],
        "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.3, "max_tokens": 50,
    }


async def test_anthropic_request_uses_x_api_key_version_and_top_level_system(
        server: FakeApiServer, api_key: str) -> None:
    config = config_for(server, "anthropic")
    await call_api("an", config, ApiRequest(
        messages=[ApiMessage(role="user", content="hi"),
                  ApiMessage(role="assistant", content="yo"),
                  ApiMessage(role="user", content="again")], system="be terse"), retry=FAST)
    (sent,) = server.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.body == {
        "model": "anthropic-default-model",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                     {"role": "user", "content": "again"}],
        "max_tokens": 4096, "stream": True, "system": "be terse",
    }


@KINDS
async def test_a_bad_usage_figure_from_an_api_is_left_out_and_the_answer_kept(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    """#38: a negative or absurd token count is refused where the stream is parsed."""
    server.push(Script(chunks=("still ", "here"), input_tokens=-5, output_tokens=10**30))
    result = await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert result.text == "still here"
    assert result.usage is not None
    assert result.usage.input_tokens is None and result.usage.output_tokens is None
    assert set(result.usage.refused) == {"input_tokens", "output_tokens"}


@KINDS
async def test_a_server_that_ignores_stream_still_yields_text_usage_and_stop_reason(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(stream=False, chunks=("all at once",), input_tokens=8, output_tokens=3,
                       model="served-model", stop_reason="length"))
    progress: list[int] = []
    result = await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"),
                            on_progress=progress.append, retry=FAST)
    assert result.text == "all at once"
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (8, 3)
    assert result.extra["model"] == "served-model"
    assert result.extra["stop_reason"] == "length"
    assert result.extra["http_status"] == 200
    assert progress == [len("all at once")]


async def test_a_loopback_server_is_called_without_a_key_when_the_env_var_is_unset(
        server: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    result = await call_api("ollama", config_for(server, "openai"), ApiRequest(prompt="hi"),
                            retry=FAST)
    assert result.text == "Hello, world"
    (sent,) = server.requests
    assert "authorization" not in sent.headers


async def test_a_shared_client_is_used_and_left_open(server: FakeApiServer,
                                                     api_key: str) -> None:
    import httpx2

    async with httpx2.AsyncClient() as client:
        first = await call_api("p", config_for(server, "openai"), ApiRequest(prompt="a"),
                               client=client, retry=FAST)
        second = await call_api("p", config_for(server, "anthropic"), ApiRequest(prompt="b"),
                                client=client, retry=FAST)
        assert not client.is_closed
    assert first.text == second.text == "Hello, world"
    assert len(server.requests) == 2


# -- errors and retries --------------------------------------------------------------------------


@KINDS
async def test_401_is_an_auth_error_naming_the_env_var_and_never_the_key(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(status=401, echo_credentials=True))
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert info.value.kind == ErrorKind.AUTH
    assert KEY_ENV in info.value.message
    assert "401" in info.value.message
    assert KEY not in info.value.message and KEY not in str(info.value)
    assert len(server.requests) == 1  # never retried


async def test_a_missing_key_env_var_fails_before_any_request_and_names_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(GatewayError) as info:
        await call_api("remote", remote_config(), ApiRequest(prompt="hi"), retry=FAST)
    assert info.value.kind == ErrorKind.AUTH
    assert KEY_ENV in info.value.message


async def test_429_with_retry_after_waits_at_least_that_long_then_succeeds(
        server: FakeApiServer, api_key: str) -> None:
    server.push(Script(status=429, headers={"Retry-After": "1"}), Script())
    result = await call_api("p", config_for(server, "openai"), ApiRequest(prompt="hi"),
                            retry=FAST)
    assert result.text == "Hello, world"
    first, second = server.requests
    # Behaviour, not a timing target: the retry must not arrive before the server allowed it.
    assert second.received_at - first.received_at >= 1.0
    assert result.extra["attempts"] == 2


@KINDS
async def test_a_500_then_success_is_retried_transparently(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(status=500), Script(chunks=("second", " try")))
    result = await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert result.text == "second try"
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


async def test_persistent_5xx_gives_up_after_the_policy_attempts(
        server: FakeApiServer, api_key: str) -> None:
    server.push(*[Script(status=503)] * 5)
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, "openai"), ApiRequest(prompt="hi"),
                       retry=RetryPolicy(max_attempts=3, base_delay_s=0.01))
    assert info.value.kind == ErrorKind.PROVIDER_ERROR
    assert "503" in info.value.message and "3 attempts" in info.value.message
    assert len(server.requests) == 3


async def test_a_retry_after_beyond_the_timeout_fails_at_once_instead_of_waiting(
        server: FakeApiServer, api_key: str) -> None:
    server.push(Script(status=429, headers={"Retry-After": "30"}))
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, "openai", timeout_s=5), ApiRequest(prompt="hi"),
                       retry=FAST)
    assert info.value.kind == ErrorKind.PROVIDER_ERROR
    assert "429" in info.value.message
    assert len(server.requests) == 1


@KINDS
async def test_400_is_a_provider_error_with_status_and_excerpt_and_no_retry(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(status=400, body=json.dumps(
        {"error": {"type": "invalid_request_error", "message": "model not supported"}})))
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert info.value.kind == ErrorKind.PROVIDER_ERROR
    assert "400" in info.value.message and "model not supported" in info.value.message
    assert len(server.requests) == 1


async def test_a_long_error_body_is_quoted_only_briefly(server: FakeApiServer,
                                                        api_key: str) -> None:
    server.push(Script(status=422, body="x" * 50_000))
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, "openai"), ApiRequest(prompt="hi"), retry=FAST)
    assert "422" in info.value.message
    assert len(info.value.message) < 600


@pytest.mark.slow  # binds a port (the address nobody listens on)
async def test_connection_refused_is_retried_then_reported(api_key: str) -> None:
    config = ApiProviderConfig(kind="openai", base_url=f"http://127.0.0.1:{free_loopback_port()}",
                               api_key_env=KEY_ENV, default_model="m")
    with pytest.raises(GatewayError) as info:
        await call_api("p", config, ApiRequest(prompt="hi"), retry=FAST)
    assert info.value.kind == ErrorKind.PROVIDER_ERROR
    assert "could not get an answer" in info.value.message
    assert "3 attempts" in info.value.message


@KINDS
async def test_a_stream_cut_before_any_text_is_retried(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(cut_after=0), Script(chunks=("fine",)))
    result = await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert result.text == "fine"
    assert len(server.requests) == 2


@KINDS
async def test_a_stream_cut_after_text_is_an_error_and_not_retried(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(chunks=("a", "b", "c"), cut_after=2))
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert info.value.kind == ErrorKind.PROVIDER_ERROR
    assert "broke after 2 bytes" in info.value.message
    assert len(server.requests) == 1


@KINDS
async def test_a_stream_without_its_end_after_text_is_not_taken_as_complete(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(omit_end=True))
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert info.value.kind == ErrorKind.PROVIDER_ERROR
    assert "ended before the answer was complete" in info.value.message


@KINDS
async def test_an_overload_error_event_before_any_text_is_retried(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(chunks=(), error_event="overloaded_error"), Script(chunks=("ok",)))
    result = await call_api("p", config_for(server, kind), ApiRequest(prompt="hi"), retry=FAST)
    assert result.text == "ok"
    assert len(server.requests) == 2


async def test_an_error_event_after_text_fails_without_retry(
        server: FakeApiServer, api_key: str) -> None:
    server.push(Script(chunks=("partial",), error_event="overloaded_error"))
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, "anthropic"), ApiRequest(prompt="hi"),
                       retry=FAST)
    assert info.value.kind == ErrorKind.PROVIDER_ERROR
    assert "mid-answer" in info.value.message
    assert len(server.requests) == 1


# -- timeout and cancellation ----------------------------------------------------------------------


@KINDS
async def test_an_api_that_never_answers_times_out_and_the_connection_is_closed(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(hang=True))
    # The call's whole budget: it must outlast the request reaching the server (which shares
    # this event loop), so it grows with the load: at load 20 a fixed 0.5 s ran out before
    # the server had read the request, and there was no connection left to see closed.
    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, kind, timeout_s=scaled(0.5)),
                       ApiRequest(prompt="hi"), retry=FAST)
    assert info.value.kind == ErrorKind.TIMEOUT
    assert "timeout_s" in info.value.message
    (hung,) = await wait_for(lambda: server.requests)
    with anyio.fail_after(scaled(WAIT_S)):
        await hung.disconnected.wait()


@KINDS
async def test_cancelling_the_task_mid_stream_closes_the_connection(
        server: FakeApiServer, api_key: str, kind: str) -> None:
    server.push(Script(chunks=("first", "never sent"), stall_after=1))
    got_text = anyio.Event()
    task = asyncio.create_task(call_api(
        "p", config_for(server, kind), ApiRequest(prompt="hi"),
        on_progress=lambda n: got_text.set(), retry=FAST))
    with anyio.fail_after(scaled(WAIT_S)):
        await got_text.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with anyio.fail_after(scaled(WAIT_S)):
        await server.requests[0].disconnected.wait()
    assert len(server.requests) == 1  # a cancel is never retried


async def test_an_exception_from_on_progress_aborts_the_call_unchanged(
        server: FakeApiServer, api_key: str) -> None:
    server.push(Script(chunks=("a", "b"), stall_after=1))

    def over_limit(n: int) -> None:
        raise GatewayError(ErrorKind.OUTPUT_LIMIT, "too much")

    with pytest.raises(GatewayError) as info:
        await call_api("p", config_for(server, "openai"), ApiRequest(prompt="hi"),
                       on_progress=over_limit, retry=FAST)
    assert info.value.kind == ErrorKind.OUTPUT_LIMIT
    with anyio.fail_after(scaled(WAIT_S)):
        await server.requests[0].disconnected.wait()


# -- the key stays secret ------------------------------------------------------------------------


async def test_the_api_key_never_reaches_logs_errors_or_the_normalized_request(
        server: FakeApiServer, api_key: str, caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(server, "openai", headers={"X-Extra-Secret": "hdr-SECRET-value"})
    request = ApiRequest(prompt="hi")
    server.push(Script(status=429, headers={"Retry-After": "0"}), Script(status=500),
                Script(), Script(status=403, echo_credentials=True),
                Script(status=400, echo_credentials=True))
    caplog.set_level(logging.DEBUG)
    messages: list[str] = []
    with structlog.testing.capture_logs() as captured:
        result = await call_api("p", config, request, retry=FAST)
        for _ in range(2):
            with pytest.raises(GatewayError) as info:
                await call_api("p", config, request, retry=FAST)
            messages.append(info.value.message)
    assert result.text == "Hello, world"
    assert server.requests[-1].headers["authorization"] == f"Bearer {KEY}"  # it was sent
    assert "got authorization=" in messages[1]  # the body echoing it was quoted...
    assert any(entry.get("action") == "http_api_retry" for entry in captured)
    everything = "\n".join([*messages, repr(captured), caplog.text,
                            json.dumps(normalized_request("p", config, request)),
                            repr(result)])
    for secret in (KEY, "hdr-SECRET-value"):
        assert secret not in everything  # ...with the key itself scrubbed out
