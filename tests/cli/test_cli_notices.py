"""`notices` as a subprocess (issue 40): the store's completion notices and their delivery,
`--failed` and `--json`; `notices test` through a loopback webhook, and its clear refusal
when no sink is configured."""

from __future__ import annotations

import json
from typing import Any

from gateway.model import Completion, JobStatus, NewJob
from tests.cli.cli_support import Cli, write_config
from tests.fakes.fake_webhook import FakeWebhook


def test_notices_lists_each_end_and_failed_ones_apart(cli: Cli) -> None:
    async def seed(store: Any) -> None:
        for n, status in enumerate((JobStatus.COMPLETED, JobStatus.FAILED)):
            job = NewJob(id=f"job-{n}", provider="claude", request_key=f"k{n}",
                         owner_instance="owner")
            await store.insert_job(job, 3600)
            await store.mark_running(job.id, "owner", 3600)
            await store.complete(job.id, "owner", Completion(
                status=status, error="it broke" if n else None,
                error_kind="provider_error" if n else None))
        (claimed,) = [n for n in await store.claim_notices("d", 60.0, 100)
                      if n.job_id == "job-1"] or [None]
        assert claimed is not None
        await store.settle_notice(claimed.id, "d", "failed", error="webhook answered HTTP 500")

    cli.in_store(seed)
    listed = json.loads(cli.run("notices", "--json").stdout)
    assert {n["id"]: n["state"] for n in listed} == {"job-0:completed": "pending",
                                                    "job-1:failed": "failed"}
    failed = json.loads(cli.run("notices", "--failed", "--json").stdout)
    assert [n["id"] for n in failed] == ["job-1:failed"]
    assert failed[0]["last_error"] == "webhook answered HTTP 500"
    text = cli.run("notices", "--failed")
    assert text.returncode == 0 and "job-1" in text.stdout and "job-0" not in text.stdout


def test_notices_test_sends_through_each_sink_and_says_what_happened(home: Any) -> None:
    hook = FakeWebhook()
    hook.start()
    try:
        cli = Cli(home, write_config(home, f'[persistence]\npath = "{home / "j.db"}"\n'
                                            f'[notify]\nwebhook_url = "{hook.url}"\n'), "sqlite")
        done = cli.run("notices", "test")
        assert done.returncode == 0, done.stderr
        assert "webhook: sent" in done.stdout
        assert hook.received and hook.received[0]["body"]["test"] is True
    finally:
        hook.stop()
    cli = Cli(home, write_config(home, f'[persistence]\npath = "{home / "j.db"}"\n'), "sqlite")
    refused = cli.run("notices", "test")
    assert refused.returncode == 2 and "no sink is configured" in refused.stderr
