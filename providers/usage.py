"""A job's usage as it is stored: the figures a CLI reported, where its cost came from, and
who pays for it (issue 28).

A figure a CLI did not report is absent, never 0: a sum of "0" for codex's cost would claim
the run was free. The cost is `reported` when the CLI printed one (claude's
`total_cost_usd`, vibe's `session_cost`), `estimated` when the CLI printed tokens but no
cost and the model is in the dated price table below (`price_table_version` says which
table priced it), else `absent`. `billing` is what the CLI said about the login: claude's
`apiKeySource` ("none" is a claude.ai subscription, whose `total_cost_usd` is an API-rate
estimate, not a bill); `unknown` when it said nothing.

Every figure was checked where it was parsed (providers/figures.py). The cost is `invalid`
when the one the CLI printed failed that check, or when no cost was printed and a token
figure an estimate would price did (or the estimate itself passes the ceiling of one job):
no figure then, and the record's `warnings` say which was left out and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from providers.figures import COST_NAME, MAX_JOB_COST_USD, TOKEN_NAMES, Usage

CostSource = Literal["reported", "estimated", "absent", "invalid"]
Billing = Literal["api", "subscription", "unknown"]
COST_SOURCES: tuple[CostSource, ...] = ("reported", "estimated", "absent", "invalid")
INVALID_COST: CostSource = "invalid"  # what budgets settle at the job's whole reservation

# The day the prices below were read from the vendors' public price pages. An estimate is
# only as good as this date: a job records the version that priced it.
PRICE_TABLE_VERSION = "2026-11-01"


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float | None = None  # None: cached input is billed as input


# Exact model names, then prefixes (a dated or suffixed name prices as its family). Only
# models whose CLIs report tokens without a cost need a row: codex, gemini, HTTP APIs.
PRICES: dict[str, Price] = {
    "gpt-5.5": Price(1.25, 10.0, 0.125),
    "gpt-5.4": Price(1.25, 10.0, 0.125),
    "gpt-5.4-mini": Price(0.25, 2.0, 0.025),
    "gpt-5": Price(1.25, 10.0, 0.125),
    "gpt-5-mini": Price(0.25, 2.0, 0.025),
    "gpt-4o": Price(2.5, 10.0, 1.25),
    "gpt-4o-mini": Price(0.15, 0.6, 0.075),
    "gemini-2.5-pro": Price(1.25, 10.0, 0.31),
    "gemini-2.5-flash": Price(0.30, 2.5, 0.075),
    "claude-opus": Price(15.0, 75.0, 1.5),
    "claude-sonnet": Price(3.0, 15.0, 0.3),
    "claude-haiku": Price(1.0, 5.0, 0.1),
    "mistral-medium": Price(0.4, 2.0),
    "devstral": Price(0.4, 2.0),
}


def price_of(model: str | None) -> Price | None:
    """The table's price for `model`: its exact name, else the longest family prefix."""
    if not model:
        return None
    name = model.lower()
    if name in PRICES:
        return PRICES[name]
    families = [key for key in PRICES if name.startswith(key)]
    return PRICES[max(families, key=len)] if families else None


def estimate_cost(usage: Usage, model: str | None) -> float | None:
    """What the reported tokens cost at the table's prices; None when the model is not in
    the table or no token figure was reported (an estimate never invents a figure)."""
    price = price_of(model)
    if price is None or (usage.input_tokens is None and usage.output_tokens is None):
        return None
    cached = usage.cache_read_tokens or 0
    fresh = max((usage.input_tokens or 0) - cached, 0)
    cache_rate = price.cache_read if price.cache_read is not None else price.input
    total = fresh * price.input + cached * cache_rate + (usage.output_tokens or 0) * price.output
    return round(total / 1_000_000, 6)


def usage_record(usage: Usage | None, model: str | None) -> dict[str, Any]:
    """The `usage` object of a job's result_json: the reported figures, `cost_source`,
    `billing`, for an estimate `price_table_version`, and `warnings` when a figure was left
    out. With nothing reported it is `{"cost_source": "absent", "billing": ...}`: no figure
    at all, and no 0."""
    if usage is None:
        return {"cost_source": "absent", "billing": "unknown"}
    record = usage.as_dict()
    warnings = usage.warnings()
    source: CostSource = "absent"
    if usage.cost_usd is not None:
        source = "reported"
    elif COST_NAME in usage.refused:
        source = INVALID_COST
    elif price_of(model) is not None and any(name in usage.refused for name in TOKEN_NAMES):
        source = INVALID_COST  # priced from what is left, it would be a guess
    elif (estimate := estimate_cost(usage, model)) is not None:
        if estimate <= MAX_JOB_COST_USD:
            record["cost_usd"] = estimate
            record["price_table_version"] = PRICE_TABLE_VERSION
            source = "estimated"
        else:
            source = INVALID_COST
            warnings.append(f"{COST_NAME}: the estimate of ${estimate:,.2f} is above the "
                            f"ceiling of ${MAX_JOB_COST_USD:,.0f} for one job; left out")
    record["cost_source"] = source
    record["billing"] = usage.billing or "unknown"
    if usage.models:
        record["models"] = usage.models
    if warnings:
        record["warnings"] = warnings
    return record


def has_figures(record: Any) -> bool:
    """Whether a stored usage object holds any reported (or estimated) figure."""
    if not isinstance(record, dict):
        return False
    return any(record.get(name) is not None for name in (
        "input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens",
        "cost_usd"))
