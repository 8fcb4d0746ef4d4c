"""`usage` as a subprocess: the totals of the store's jobs as a table, per day with a bar,
and as the JSON llm_usage returns; a figure no job reported is `-`, never 0."""

from __future__ import annotations

import json
import uuid
from typing import Any

from gateway.jobs.usage_report import day_bars, parse_day, usage_table
from gateway.model import Completion, JobStatus, NewJob, UsageFigures
from tests.cli.cli_support import Cli

OWNER = "cli-test"


async def seed(store: Any) -> None:
    jobs = [("claude", UsageFigures("reported", input_tokens=100, output_tokens=50,
                                    cost_usd=0.25)),
            ("claude", UsageFigures("reported", input_tokens=100, output_tokens=50,
                                    cost_usd=0.25)),
            ("codex", UsageFigures("absent", input_tokens=1000, output_tokens=10)),
            ("grok", None)]
    for provider, usage in jobs:
        job_id = str(uuid.uuid4())
        await store.insert_job(NewJob(id=job_id, provider=provider, request_key=job_id,
                                      owner_instance=OWNER, model="m"), 3600)
        assert await store.complete(job_id, OWNER, Completion(
            status=JobStatus.COMPLETED, exit_code=0, usage=usage))


def test_usage_prints_a_table_and_the_json_of_llm_usage(cli: Cli) -> None:
    cli.in_store(seed)
    table = cli.run("usage")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    claude = next(line.split() for line in lines if line.startswith("claude"))
    assert claude == ["claude", "2", "200", "100", "-", "$0.5000", "reported"]
    codex = next(line.split() for line in lines if line.startswith("codex"))
    assert codex == ["codex", "1", "1,000", "10", "-", "-", "absent"]
    assert "reported no usage (not in the table): 1" in table.stdout

    done = cli.run("usage", "--json", "--since", "today")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [g["provider"] for g in report["groups"]] == ["claude", "codex"]
    assert report["totals"]["cost_usd"] == 0.5 and report["no_usage_jobs"] == 1

    by_day = cli.run("usage", "--by", "day")
    assert by_day.returncode == 0, by_day.stderr
    assert any(line.rstrip().endswith("$0.50") and "#" in line
               for line in by_day.stdout.splitlines())


def test_usage_of_an_empty_store_and_a_bad_day(cli: Cli) -> None:
    empty = cli.run("usage")
    assert empty.returncode == 0 and "No jobs ended" in empty.stdout
    cli.in_store(seed)
    bad = cli.run("usage", "--since", "last tuesday")
    assert bad.returncode != 0 and "is not a day" in bad.stderr


def test_a_bar_per_day_scaled_to_the_most_expensive_one() -> None:
    report = {"group_by": "day", "since": None, "until": None, "no_usage_jobs": 0,
              "groups": [{"day": "2026-11-30", "jobs": 1, "input_tokens": 1,
                          "output_tokens": 1, "cache_read_tokens": None,
                          "cost_usd": 2.0, "cost_source": "reported"},
                         {"day": "2026-12-01", "jobs": 2, "input_tokens": 1,
                          "output_tokens": 1, "cache_read_tokens": None,
                          "cost_usd": 0.5, "cost_source": "mixed"}],
              "totals": {"jobs": 3, "input_tokens": 2, "output_tokens": 2,
                         "cache_read_tokens": None, "cost_usd": 2.5}}
    bars = day_bars(report)
    assert bars[0].count("#") == 40 and bars[1].count("#") == 10
    assert "mixed" in usage_table(report)


def test_days_are_read_as_utc_days() -> None:
    from datetime import date

    today = date(2026, 12, 1)
    assert parse_day("7d", today=today) == "2026-11-25"
    assert parse_day("1d", today=today) == parse_day("today", today=today) == "2026-12-01"
    assert parse_day("2026-12-01T23:30:00-02:00") == "2026-12-02"
    assert parse_day(None) is None and parse_day(" ") is None
