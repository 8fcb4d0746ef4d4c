"""What `llm_usage` and `agent-cli-gateway usage` answer: usage totals across every job in the
store, whichever gateway ran it, grouped by provider, model or UTC day (issue 28).

Read from the store's rollup (store/usage.py), so the answer costs a few rows per day
whatever the number of jobs. A group's `cost_source` is the one its jobs share, `mixed`
when they differ; a figure no job of a group reported is None (shown as "-"), never 0; jobs
that reported no usage at all are counted apart (`no_usage_jobs`).
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gateway.model import ErrorKind, GatewayError, from_micro_usd
from gateway.store.base import JobStore
from gateway.store.usage import GROUP_BY, NO_USAGE, TOKEN_FIELDS, GroupBy, add_figure

_RELATIVE = re.compile(r"^(\d{1,5})d$")  # "7d": the last 7 UTC days, today included
BAR_WIDTH = 40  # the longest bar of `usage --by day`, in characters
FIGURES = (*TOKEN_FIELDS, "cost_micro_usd")


def parse_day(value: str | None, *, today: date | None = None) -> str | None:
    """A day bound as the rollup keys it (YYYY-MM-DD, UTC) from what a caller may type:
    `YYYY-MM-DD`, an ISO date-time (its UTC day), `today`, or `Nd` (N days back, today
    being the first). None/empty: open. Raises GatewayError(invalid_input)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    today = today or datetime.now(UTC).date()
    if text == "today":
        return today.isoformat()
    if match := _RELATIVE.match(text):
        return (today - timedelta(days=max(int(match[1]) - 1, 0))).isoformat()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise GatewayError(ErrorKind.INVALID_INPUT,
                           f"{value!r} is not a day: give YYYY-MM-DD, an ISO date-time, "
                           f"'today' or 'Nd' (the last N UTC days).") from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.date().isoformat()


async def usage_report(store: JobStore, group_by: str = "provider", since: str | None = None,
                       until: str | None = None) -> dict[str, Any]:
    """The totals, as the tool's structured content and the CLI's --json."""
    if group_by not in GROUP_BY:
        raise GatewayError(ErrorKind.INVALID_INPUT,
                           f"group_by must be one of {list(GROUP_BY)}; got {group_by!r}.")
    grouping: GroupBy = group_by  # checked just above
    since_day, until_day = parse_day(since), parse_day(until)
    rows = await store.usage_totals(grouping, since_day, until_day)
    groups: dict[str, dict[str, Any]] = {}
    no_usage: dict[str, int] = {}
    for row in rows:
        if row.cost_source == NO_USAGE:
            no_usage[row.key] = no_usage.get(row.key, 0) + row.jobs
            continue
        group = groups.setdefault(row.key, {"jobs": 0, "sources": set(),
                                            **dict.fromkeys(FIGURES)})
        group["jobs"] += row.jobs
        group["sources"].add(row.cost_source)
        for name in FIGURES:
            group[name] = add_figure(group[name], getattr(row, name))
    shown = [_shown(group_by, key, group) for key, group in sorted(groups.items())]
    totals: dict[str, Any] = {"jobs": sum(g["jobs"] for g in shown)}
    for name in TOKEN_FIELDS:
        totals[name] = _sum(g[name] for g in shown)
    totals["cost_usd"] = (None if all(g["cost_usd"] is None for g in shown)
                          else round(sum(g["cost_usd"] or 0 for g in shown), 6))
    return {"group_by": group_by, "since": since_day, "until": until_day, "groups": shown,
            "totals": totals, "no_usage_jobs": sum(no_usage.values()),
            "no_usage": [{group_by: key, "jobs": jobs} for key, jobs in sorted(no_usage.items())]}


def _sum(values: Any) -> int | None:
    total: int | None = None
    for value in values:
        total = add_figure(total, value)
    return total


def _shown(group_by: str, key: str, group: dict[str, Any]) -> dict[str, Any]:
    sources = group["sources"]
    cost = group["cost_micro_usd"]
    return {group_by: key or "(unknown)", "jobs": group["jobs"],
            **{name: group[name] for name in TOKEN_FIELDS},
            "cost_usd": None if cost is None else from_micro_usd(cost),
            "cost_source": next(iter(sources)) if len(sources) == 1 else "mixed"}


def _cell(value: Any, money: bool = False) -> str:
    if value is None:
        return "-"
    return f"${value:.4f}" if money else f"{value:,}"


def usage_table(report: dict[str, Any]) -> str:
    """The report as a plain-text table, with the no-usage jobs and a bar per day."""
    group_by = report["group_by"]
    window = f"{report['since'] or 'the first job'} .. {report['until'] or 'today'} (UTC days)"
    if not report["groups"] and not report["no_usage_jobs"]:
        return f"No jobs ended in {window}."
    header = (group_by, "jobs", "input", "output", "cache_read", "cost_usd", "cost_source")
    lines = [[str(g[group_by]), str(g["jobs"]), _cell(g["input_tokens"]),
              _cell(g["output_tokens"]), _cell(g["cache_read_tokens"]),
              _cell(g["cost_usd"], money=True), g["cost_source"]] for g in report["groups"]]
    totals = report["totals"]
    lines.append(["total", str(totals["jobs"]), _cell(totals["input_tokens"]),
                  _cell(totals["output_tokens"]), _cell(totals["cache_read_tokens"]),
                  _cell(totals["cost_usd"], money=True), ""])
    widths = [max(len(row[i]) for row in [list(header), *lines]) for i in range(len(header))]
    text = [f"Usage by {group_by}, {window}:"]
    for row in [list(header), *lines]:
        text.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                         strict=True)).rstrip())
    if report["no_usage_jobs"]:
        text.append(f"Jobs that reported no usage (not in the table): {report['no_usage_jobs']}")
    if group_by == "day" and report["groups"]:
        text.append("")
        text.extend(day_bars(report))
    return "\n".join(text)


def day_bars(report: dict[str, Any]) -> list[str]:
    """A bar per day: its cost when any job of the range reported one, else its tokens."""
    groups = report["groups"]
    by_cost = any(g["cost_usd"] is not None for g in groups)

    def measure(group: dict[str, Any]) -> float:
        if by_cost:
            return float(group["cost_usd"] or 0)
        return float((group["input_tokens"] or 0) + (group["output_tokens"] or 0))

    top = max((measure(g) for g in groups), default=0.0) or 1.0
    lines = []
    for group in groups:
        value = measure(group)
        bar = "#" * max(round(value / top * BAR_WIDTH), 1 if value else 0)
        label = f"${value:.2f}" if by_cost else f"{int(value):,} tokens"
        lines.append(f"{group['day']}  {bar.ljust(BAR_WIDTH)}  {label}")
    return lines
