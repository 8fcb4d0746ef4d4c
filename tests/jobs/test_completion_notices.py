"""Completion notices end to end (issue 40): real gateways on one store (SQLite file,
PostgreSQL), the fake CLIs, a loopback webhook and a command sink. Each ended job is told
once per sink whichever gateway ended it; a webhook that is down loses nothing; one that
answers 500 forever ends the notice `failed` after max_attempts; a run that ended with no
gateway alive is told by its finalizer."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.backoff import Backoff
from gateway.jobs.notify import deliver
from gateway.jobs.requests import SubmitRequest
from gateway.model import JobStatus
from gateway.store import open_store
from tests.children import Children
from tests.dashboard.groups import checkout, finished_group
from tests.fakes.fake_webhook import FakeWebhook
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway, store_of
from tests.jobs.test_detach import start_owner
from tests.waiting import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]

REPO = Path(__file__).resolve().parents[2]
SINK_SCRIPT = REPO / "tests" / "fakes" / "notice_sink.py"
SECRET_ENV = "AGENT_GATEWAY_TEST_HOOK_SECRET"
SECRET = "s3cret-for-the-test"
QUICK_RETRY = Backoff(first_s=0.05, max_s=0.2)
DELIVERED_WITHIN_S = 40.0  # a loaded 2-core box; the bound is a hang, not a target


@pytest.fixture
def webhook() -> Any:
    hook = FakeWebhook()
    hook.start()
    yield hook
    hook.stop()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries within a test's time: the backoff rule is the same, its first wait shorter."""
    monkeypatch.setattr(deliver, "RETRY", QUICK_RETRY)
    monkeypatch.setattr(deliver, "POLL_S", 0.1)
    monkeypatch.setattr(deliver, "IDLE_POLL_MAX_S", 0.2)


def notify(hook: FakeWebhook, command_log: Path | None = None, **more: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"webhook_url": hook.url, "webhook_secret_env": SECRET_ENV,
                               "min_duration_s": 0, "timeout_s": 5}
    if command_log is not None:
        section["command"] = [sys.executable, str(SINK_SCRIPT), str(command_log),
                              "{job_id}", "{status}"]
    return {**section, **more}


def command_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_each_job_two_gateways_end_is_told_once_to_the_webhook_and_the_command(
    make_settings: MakeSettings, start_gateway: StartGateway, webhook: FakeWebhook,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    log = tmp_path / "command.jsonl"
    settings = make_settings(notify=notify(webhook, log))
    managers = [await (await start_gateway(settings)).manager() for _ in range(2)]
    jobs = []
    for n in range(6):
        prompt = f"notice me {n} {time.time_ns()}" + (" @exit=3" if n == 5 else "")
        sub = await managers[n % 2].submit("claude", SubmitRequest(prompt=prompt))
        jobs.append(sub.job.id)
    expected = {f"{job}:{'failed' if n == 5 else 'completed'}" for n, job in enumerate(jobs)}

    await wait_for(lambda: expected <= set(webhook.ids()), DELIVERED_WITHIN_S, step=0.05)
    await wait_for(lambda: len(command_lines(log)) >= len(expected), DELIVERED_WITHIN_S)
    store = store_of_any(managers)

    async def settled() -> bool:
        notices = [n for n in await store.list_notices(limit=100) if n.id in expected]
        return len(notices) == len(expected) and all(n.outcome == "delivered" for n in notices)

    await wait_for(settled, DELIVERED_WITHIN_S)
    # Exactly once per sink (no gateway died), whichever gateway ended or delivered it.
    assert Counter(i for i in webhook.ids() if i in expected) == Counter(expected)
    lines = [line for line in command_lines(log) if line["notice"]["id"] in expected]
    assert Counter(line["notice"]["id"] for line in lines) == Counter(expected)
    for line in lines:  # the placeholders, one argument each
        assert line["argv"] == [line["notice"]["job_id"], line["notice"]["status"]]
    for received in webhook.received:  # signed with the secret the env var holds
        want = "sha256=" + hmac.new(SECRET.encode(), received["raw"], hashlib.sha256).hexdigest()
        assert received["headers"]["X-Agent-Gateway-Signature"] == want
    failed = next(r["body"] for r in webhook.received if r["body"]["status"] == "failed")
    assert failed["read_with"] == f"agent-cli-gateway jobs result {failed['job_id']}"
    assert "failed" in failed["summary"]


def store_of_any(managers: list[Any]) -> Any:
    return managers[0].store


async def test_a_webhook_down_for_a_while_loses_nothing(
    make_settings: MakeSettings, start_gateway: StartGateway, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    hook = FakeWebhook()  # not started: down
    settings = make_settings(notify=notify(hook, max_attempts=50))
    gateway = await start_gateway(settings)
    manager = await gateway.manager()
    sub = await manager.submit("claude", SubmitRequest(prompt=f"while down {time.time_ns()}"))
    notice_id = f"{sub.job.id}:completed"
    store = store_of(gateway)

    async def tried_twice() -> bool:
        found = [n for n in await store.list_notices(limit=100) if n.id == notice_id]
        return bool(found) and found[0].attempts >= 2 and found[0].delivered_at is None

    await wait_for(tried_twice, DELIVERED_WITHIN_S)
    hook.start()
    try:
        await wait_for(lambda: notice_id in hook.ids(), DELIVERED_WITHIN_S, step=0.05)
    finally:
        hook.stop()
    assert hook.ids().count(notice_id) == 1


async def test_a_webhook_that_answers_500_forever_ends_the_notice_failed(
    make_settings: MakeSettings, start_gateway: StartGateway, webhook: FakeWebhook,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    webhook.status = 500
    settings = make_settings(notify=notify(webhook, max_attempts=3))
    gateway = await start_gateway(settings)
    manager = await gateway.manager()
    sub = await manager.submit("claude", SubmitRequest(prompt=f"into the void {time.time_ns()}"))
    notice_id = f"{sub.job.id}:completed"
    store = store_of(gateway)

    async def failed() -> bool:
        return notice_id in {n.id for n in await store.list_notices(failed_only=True)}

    await wait_for(failed, DELIVERED_WITHIN_S)
    assert webhook.ids(500).count(notice_id) == 3  # max_attempts, then no more
    (notice,) = [n for n in await store.list_notices(failed_only=True) if n.id == notice_id]
    assert notice.outcome == "failed" and "HTTP 500" in (notice.last_error or "")
    assert await store.count_failed_notices() >= 1


async def test_a_missing_webhook_secret_is_never_sent_unsigned(
    make_settings: MakeSettings, start_gateway: StartGateway, webhook: FakeWebhook,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    settings = make_settings(notify=notify(webhook, max_attempts=1))
    gateway = await start_gateway(settings)
    sub = await (await gateway.manager()).submit(
        "claude", SubmitRequest(prompt=f"unsigned {time.time_ns()}"))
    store = store_of(gateway)

    async def failed() -> list[Any]:
        return [n for n in await store.list_notices(failed_only=True)
                if n.job_id == sub.job.id]

    (notice,) = await wait_for(failed, DELIVERED_WITHIN_S)
    assert SECRET_ENV in (notice.last_error or "")
    assert webhook.received == []


async def test_filtered_ends_are_settled_skipped_and_never_sent(
    make_settings: MakeSettings, start_gateway: StartGateway, webhook: FakeWebhook,
) -> None:
    settings = make_settings(notify={"webhook_url": webhook.url, "min_duration_s": 3600})
    gateway = await start_gateway(settings)
    sub = await (await gateway.manager()).submit(
        "claude", SubmitRequest(prompt=f"too quick {time.time_ns()}"))
    store = store_of(gateway)

    async def skipped() -> list[Any]:
        return [n for n in await store.list_notices() if n.job_id == sub.job.id
                and n.outcome == "skipped"]

    (notice,) = await wait_for(skipped, DELIVERED_WITHIN_S)
    assert "min_duration_s" in (notice.last_error or "")
    assert webhook.received == []


async def test_a_run_that_ended_with_no_gateway_alive_is_told_by_its_finalizer(
    make_settings: MakeSettings, fake_log: FakeLog, tmp_path: Path, children: Children,
    webhook: FakeWebhook,
) -> None:
    settings = make_settings(notify={"webhook_url": webhook.url, "min_duration_s": 0})
    owner, job_id = start_owner(settings, tmp_path, "tell me when nobody is here @sleep=1.5",
                                children)
    await wait_for(lambda: fake_log.spawns(), 10)
    owner.kill()  # no gateway is left on this host
    owner.wait()
    await wait_for(lambda: f"{job_id}:completed" in webhook.ids(), DELIVERED_WITHIN_S,
                   step=0.05)
    store = await open_store(settings)
    try:
        row = await store.get_job(job_id, with_output=False)
        assert row is not None and row.status is JobStatus.COMPLETED

        async def delivered() -> list[Any]:  # the webhook answered before the settle's write
            return [n for n in await store.list_notices() if n.job_id == job_id
                    and n.outcome == "delivered"]

        (notice,) = await wait_for(delivered, DELIVERED_WITHIN_S)
        finalizers = {i.instance_id for i in await store.list_instances()
                      if i.role == "finalizer"}
        assert notice.claimed_by in finalizers
    finally:
        await store.close()


@pytest.mark.slow
async def test_an_attempt_groups_end_is_told_once_with_its_winner(
    make_settings: MakeSettings, start_gateway: StartGateway, webhook: FakeWebhook,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    log = tmp_path / "command.jsonl"
    settings = make_settings(notify=notify(webhook, log))
    gateway = await start_gateway(settings)
    group_id, jobs = await finished_group(gateway, checkout(tmp_path / "checkout"))
    notice_id = f"group:{group_id}:done"
    await wait_for(lambda: notice_id in webhook.ids(), DELIVERED_WITHIN_S, step=0.05)
    await wait_for(lambda: any(line["notice"]["id"] == notice_id
                               for line in command_lines(log)), DELIVERED_WITHIN_S)
    store = (await gateway.manager()).store

    async def settled() -> bool:
        return any(n.id == notice_id and n.outcome == "delivered"
                   for n in await store.list_notices(limit=100))

    await wait_for(settled, DELIVERED_WITHIN_S)
    assert webhook.ids().count(notice_id) == 1
    body = next(r["body"] for r in webhook.received if r["body"]["id"] == notice_id)
    assert body["group_id"] == group_id and body["winner_job_id"] == jobs["claude"]
    assert body["read_with"] == f"agent-cli-gateway attempts show {group_id}"
    assert f"winner {jobs['claude'][:8]}" in body["summary"]
    [line] = [line for line in command_lines(log) if line["notice"]["id"] == notice_id]
    assert line["argv"] == [jobs["claude"], "done"]


async def test_the_desktop_sink_runs_notify_send_once_with_plain_text(
    make_settings: MakeSettings, start_gateway: StartGateway, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`desktop = true` on Linux: `notify-send` (a fake first on PATH that records its argv)
    runs once per notified end, the title and body as separate arguments after `--`, with
    no markup or terminal escape left for the notifier to interpret."""
    fake_bin, calls = tmp_path / "desktop-bin", tmp_path / "notify-send.log"
    fake_bin.mkdir()
    script = fake_bin / "notify-send"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"with open({str(calls)!r}, 'a') as f:\n"
                      f"    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    script.chmod(0o700)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    settings = make_settings(notify={"desktop": True, "min_duration_s": 0, "timeout_s": 5})
    gateway = await start_gateway(settings)
    # It fails with markup and an escape in its stderr, which the summary quotes.
    prompt = f"@exit=1 @stderr=<b>bold</b>&amp;\x1b[31mred {time.time_ns()}"
    sub = await (await gateway.manager()).submit("claude", SubmitRequest(prompt=prompt))
    store = store_of(gateway)

    async def delivered() -> bool:
        found = [n for n in await store.list_notices() if n.job_id == sub.job.id]
        return bool(found) and found[0].delivered_at is not None

    await wait_for(delivered, DELIVERED_WITHIN_S)
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(lines) == 1, lines
    [argv] = lines
    assert argv[:2] == ["--app-name=agent-cli-gateway", "--"], argv
    title, body = argv[2:]
    assert title == "agent-cli-gateway: claude job failed"
    assert "bold" in body and "red" in body, body  # the text is there, its markup not:
    assert "<b>" not in body and "&amp;" not in body and "\x1b" not in body, body
