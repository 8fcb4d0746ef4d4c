"""HTTP API providers run as durable jobs (transport "http") through the one job path."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import structlog

from gateway.config import Settings
from gateway.jobs.requests import SubmitRequest
from gateway.model import ErrorKind, GatewayError, JobStatus
from tests.fakes.fake_api_server import FakeApiServer, Script, run_fake_api_server
from tests.jobs.conftest import MakeSettings, StartGateway
from tests.waiting import scaled

pytestmark = pytest.mark.anyio

KEY_ENV = "GATEWAY_TEST_API_KEY"
KEY = "sk-test-SECRET-4f9a1c2b7d"


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with run_fake_api_server() as fake:
        yield fake


@pytest.fixture
def http_settings(
    make_settings: MakeSettings, api: FakeApiServer, monkeypatch: pytest.MonkeyPatch,
) -> Settings:
    monkeypatch.setenv(KEY_ENV, KEY)
    return make_settings(api_providers={
        "openrouter": {"kind": "openai", "base_url": api.base_url + "/v1",
                       "api_key_env": KEY_ENV, "default_model": "m-1", "timeout_s": 5},
        "claude_api": {"kind": "anthropic", "base_url": api.base_url,
                       "api_key_env": KEY_ENV, "default_model": "claude-x", "timeout_s": 5},
    })


@pytest.mark.parametrize("provider", ["openrouter", "claude_api"])
async def test_an_api_request_streams_to_a_completed_http_job_with_usage(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer, provider: str
) -> None:
    manager = await (await start_gateway(http_settings)).manager()
    sub = await manager.submit(provider, SubmitRequest(prompt="hi"))
    assert sub.job.transport == "http" and sub.job.pid is None
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status == JobStatus.COMPLETED, row.error
    page = await manager.reads.read_result(sub.job.id)
    assert page.output == "Hello, world"
    assert page.parsed is not None
    assert page.parsed["usage"]["input_tokens"] == 11
    assert api.requests[0].body["stream"] is True


async def test_an_api_job_sends_exactly_the_request_its_row_stores(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer,
) -> None:
    manager = await (await start_gateway(http_settings)).manager()
    sub = await manager.submit("openrouter", SubmitRequest(
        prompt="hi", options={"system": "be terse", "temperature": 0.25}))
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status == JobStatus.COMPLETED, row.error
    stored = json.loads(row.request_json)
    body = api.requests[0].body
    assert body["model"] == stored["model"] == "m-1"
    assert body["temperature"] == stored["temperature"] == 0.25
    assert body["messages"] == [{"role": "system", "content": stored["system"]},
                                *stored["messages"]]


async def test_identical_api_requests_are_deduplicated(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer,
) -> None:
    manager = await (await start_gateway(http_settings)).manager()
    a = await manager.submit("openrouter", SubmitRequest(prompt="same", options={"temperature": 0.5}))
    await manager.reads.wait(a.job.id, 20)
    b = await manager.submit("openrouter", SubmitRequest(prompt="same", options={"temperature": 0.5}))
    c = await manager.submit("openrouter", SubmitRequest(prompt="same", options={"temperature": 0.7}))
    assert b.deduplicated and b.job.id == a.job.id and not c.deduplicated
    await manager.reads.wait(c.job.id, 20)
    assert len(api.requests) == 2


async def test_a_401_fails_the_job_as_auth_and_429_then_500_are_retried(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer
) -> None:
    manager = await (await start_gateway(http_settings)).manager()
    api.push(Script(status=401))
    bad = await manager.submit("openrouter", SubmitRequest(prompt="denied"))
    row = await manager.reads.wait(bad.job.id, 20)
    assert row.status == JobStatus.FAILED and row.error_kind == ErrorKind.AUTH
    assert row.error is not None
    assert KEY_ENV in row.error and KEY not in row.error
    api.push(Script(status=429, headers={"Retry-After": "1"}), Script(status=500), Script())
    ok = await manager.submit("openrouter", SubmitRequest(prompt="retry me"))
    row = await manager.reads.wait(ok.job.id, 30)
    assert row.status == JobStatus.COMPLETED, row.error


async def test_a_hanging_api_times_out_and_a_cancel_aborts_mid_stream(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer
) -> None:
    manager = await (await start_gateway(http_settings)).manager()
    api.push(Script(hang=True))
    slow = await manager.submit("openrouter", SubmitRequest(prompt="hang", timeout_s=1))
    row = await manager.reads.wait(slow.job.id, 20)
    assert row.status == JobStatus.TIMED_OUT and row.error_kind == ErrorKind.TIMEOUT
    api.push(Script(stall_after=1))
    sub = await manager.submit("openrouter", SubmitRequest(prompt="stall"))
    requests = await api.wait_for_requests(2)
    out = await manager.cancel(sub.job.id)
    assert out.job.status == JobStatus.CANCELLED
    with anyio.fail_after(scaled(10)):
        await requests[1].disconnected.wait()  # the HTTP request really was aborted


async def test_bad_api_input_is_refused_before_anything_is_stored(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer,
) -> None:
    manager = await (await start_gateway(http_settings)).manager()
    for options in ({"temperature": 9}, {"max_output_tokens": 0}, {"nonsense": 1}):
        with pytest.raises(GatewayError) as err:
            await manager.submit("openrouter", SubmitRequest(prompt="x", options=options))
        assert err.value.kind == ErrorKind.INVALID_INPUT
    assert await manager.reads.list_jobs() == [] and api.requests == []


async def test_the_api_key_reaches_neither_the_store_nor_the_logs(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer, tmp_path: Path, backend: str
) -> None:
    with structlog.testing.capture_logs() as logs:
        manager = await (await start_gateway(http_settings)).manager()
        api.push(Script(status=401, echo_credentials=True), Script())
        for prompt in ("one", "two"):
            sub = await manager.submit("claude_api", SubmitRequest(prompt=prompt))
            await manager.reads.wait(sub.job.id, 20)
        rows = await manager.reads.list_jobs(limit=10)
    assert api.requests[0].headers.get("x-api-key") == KEY  # it was really sent
    dumped = repr([r for r in rows]) + repr(logs)
    assert KEY not in dumped
    if backend == "sqlite":
        for path in (tmp_path / "state").glob("jobs.db*"):
            assert KEY.encode() not in path.read_bytes()


async def test_an_api_call_cut_off_by_detach_is_requeued_once_and_its_row_says_so(
    http_settings: Settings, start_gateway: StartGateway, api: FakeApiServer
) -> None:
    gw = await start_gateway(http_settings)
    manager = await gw.manager()
    api.push(Script(hang=True))  # outlives the drain time: it cannot finish before we leave
    sub = await manager.submit("openrouter", SubmitRequest(prompt="cut off"))
    await api.wait_for_requests(1)
    await gw.stop()  # on_shutdown = "detach": the call gets the drain time, then is dropped
    successor = await (await start_gateway(http_settings)).manager()
    bound = 20.0  # its lease after detach (drain time + HTTP_RELEASE_MARGIN_S), then the call
    with anyio.fail_after(scaled(bound)):
        row = await successor.reads.wait(sub.job.id, bound)
    assert row.status == JobStatus.COMPLETED, row.error
    assert row.requeued_at is not None  # the row shows it was retried
    assert (await successor.reads.read_result(sub.job.id)).output == "Hello, world"
    assert len(api.requests) == 2
