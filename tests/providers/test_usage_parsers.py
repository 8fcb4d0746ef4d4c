"""Usage per job (issue 28): each CLI's recorded output, per CLI version (fixtures/usage/
<cli>-<version>.*), gives exactly the figures it printed, where its cost came from and who
pays; a figure a CLI did not print is absent from the stored usage, never 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.jobs.outcome_to_completion import usage_figures
from providers.figures import Usage
from providers.mistral import session_usage
from providers.registry import CLI_PROVIDERS
from providers.usage import PRICE_TABLE_VERSION, estimate_cost, price_of, usage_record

FIXTURES = Path(__file__).parent / "fixtures" / "usage"
FIGURES = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens",
           "cost_usd")

# (fixture, provider, options, the model the job asked for, the stored usage object exactly)
CASES: list[tuple[str, str, dict[str, Any], str | None, dict[str, Any]]] = [
    ("claude-2.1.229.json", "claude", {"output_format": "json"}, None, {
        "input_tokens": 4, "output_tokens": 5, "cache_read_tokens": 13004,
        "cache_creation_tokens": 5123, "cost_usd": 0.0211575, "cost_source": "reported",
        "billing": "unknown",
        "models": {"claude-opus-5": {"input_tokens": 4, "output_tokens": 5,
                                     "cache_read_tokens": 13004, "cache_creation_tokens": 5123,
                                     "cost_usd": 0.0211575}}}),
    ("claude-2.1.229.stream.jsonl", "claude", {}, None, {
        "input_tokens": 40, "output_tokens": 310, "cache_read_tokens": 45000,
        "cache_creation_tokens": 2200, "cost_usd": 0.0532, "cost_source": "reported",
        "billing": "subscription",
        "models": {
            "claude-sonnet-5": {"input_tokens": 28, "output_tokens": 290,
                                "cache_read_tokens": 45000, "cache_creation_tokens": 2200,
                                "cost_usd": 0.0511},
            "claude-haiku-4-5": {"input_tokens": 12, "output_tokens": 20, "cache_read_tokens": 0,
                                 "cache_creation_tokens": 0, "cost_usd": 0.0021}}}),
    ("claude-2.1.229.api-key.stream.jsonl", "claude", {}, None, {
        "input_tokens": 1200, "output_tokens": 4100, "cache_read_tokens": 80000,
        "cache_creation_tokens": 0, "cost_usd": 0.2513, "cost_source": "reported",
        "billing": "api",
        "models": {"claude-haiku-4-5": {"input_tokens": 1200, "output_tokens": 4100,
                                        "cache_read_tokens": 80000,
                                        "cache_creation_tokens": 0, "cost_usd": 0.2513}}}),
    # codex prints tokens, never a cost: priced from the table when the model is known...
    ("codex-0.147.0.jsonl", "codex", {}, "gpt-5.5", {
        "input_tokens": 24763, "output_tokens": 122, "cache_read_tokens": 24448,
        "cost_usd": 0.00467, "cost_source": "estimated", "billing": "unknown",
        "price_table_version": PRICE_TABLE_VERSION}),
    # ... and with no cost at all when it is not: never a reported 0.
    ("codex-0.147.0.jsonl", "codex", {}, None, {
        "input_tokens": 24763, "output_tokens": 122, "cache_read_tokens": 24448,
        "cost_source": "absent", "billing": "unknown"}),
    ("gemini-0.61.0.json", "gemini", {"output_format": "json"}, "unpriced-model", {
        "input_tokens": 9130, "output_tokens": 257, "cache_read_tokens": 4096,
        "cost_source": "absent", "billing": "unknown"}),
    ("agy-1.1.12.json", "gemini", {"output_format": "json"}, "gemini-2.5-flash", {
        "input_tokens": 5120, "output_tokens": 88, "cost_usd": 0.001756,
        "cost_source": "estimated", "billing": "unknown",
        "price_table_version": PRICE_TABLE_VERSION}),
    ("vibe-2.24.1.json", "mistral", {"output": "json"}, None,
     {"cost_source": "absent", "billing": "unknown"}),
    ("grok-1.0.3.json", "grok", {"output_format": "json"}, None,
     {"cost_source": "absent", "billing": "unknown"}),
    ("cursor-2026.08.11.json", "cursor", {"output_format": "json"}, None,
     {"cost_source": "absent", "billing": "unknown"}),
    ("devin-3000.4.16.txt", "devin", {}, None, {"cost_source": "absent", "billing": "unknown"}),
]


def _stored_usage(fixture: str, provider: str, options: dict[str, Any],
                  model: str | None) -> dict[str, Any]:
    adapter = CLI_PROVIDERS[provider]
    parsed_options = adapter.options_model.model_validate(options)
    result = adapter.parse_output((FIXTURES / fixture).read_bytes(), b"", 0, parsed_options)
    ran = result.extra.get("model")
    return usage_record(result.usage, ran if isinstance(ran, str) else model)


@pytest.mark.parametrize(("fixture", "provider", "options", "model", "expected"), CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_each_recorded_output_gives_exactly_its_usage(
        fixture: str, provider: str, options: dict[str, Any], model: str | None,
        expected: dict[str, Any]) -> None:
    assert _stored_usage(fixture, provider, options, model) == expected


def test_a_figure_no_cli_printed_is_never_written_as_zero() -> None:
    """Across every fixture, each figure in a stored usage is one its output holds."""
    for fixture, provider, options, model, _ in CASES:
        stored = _stored_usage(fixture, provider, options, model)
        raw = (FIXTURES / fixture).read_text()
        for name in FIGURES:
            if stored.get(name) == 0:
                assert '":0' in raw.replace(" ", ""), (fixture, name)
        if stored["cost_source"] == "absent":
            assert "cost_usd" not in stored, fixture


def test_gemini_gives_no_cost_and_the_table_prices_its_tokens() -> None:
    stored = _stored_usage("gemini-0.61.0.json", "gemini", {"output_format": "json"},
                           "gemini-2.5-pro")
    # the envelope names no model of its own: the job's model prices the summed tokens
    assert stored["cost_source"] == "estimated"
    assert stored["cost_usd"] == pytest.approx(((9130 - 4096) * 1.25 + 4096 * 0.31
                                                + 257 * 10.0) / 1e6, abs=1e-6)


def test_vibe_session_stats_give_tokens_and_its_reported_cost() -> None:
    meta = json.loads((FIXTURES / "vibe-2.24.1.meta.json").read_text())
    usage = session_usage(meta)
    assert usage is not None
    assert usage_record(usage, "devstral-2") == {
        "input_tokens": 18342, "output_tokens": 611, "cost_usd": 0.008559,
        "cost_source": "reported", "billing": "unknown"}
    # printed with the history (an object carrying `stats`), the same figures come back
    printed = json.dumps({"history": [{"role": "assistant", "content": "ok"}],
                          "stats": meta["stats"]}).encode()
    result = CLI_PROVIDERS["mistral"].parse_output(printed, b"", 0)
    assert result.text == "ok" and result.usage == usage


def test_price_table_matches_families_and_never_invents_a_figure() -> None:
    assert price_of("gpt-5.5") is not None
    assert price_of("claude-sonnet-5-20261101") == price_of("claude-sonnet")
    assert price_of(None) is None and price_of("llama-local") is None
    assert estimate_cost(Usage(cache_read_tokens=5), "gpt-5.5") is None
    assert estimate_cost(Usage(output_tokens=1_000_000), "gpt-5.5") == 10.0


def test_usage_figures_are_none_for_a_job_that_reported_nothing() -> None:
    assert usage_figures({"cost_source": "absent", "billing": "unknown"}, "m") is None
    figures = usage_figures({"input_tokens": 3, "cost_source": "absent"}, "m")
    assert figures is not None
    assert (figures.input_tokens, figures.cost_usd, figures.cost_micro_usd) == (3, None, None)


def test_a_cost_cap_reaches_claude_and_vibe_as_their_own_flags() -> None:
    from providers.base import ProviderRequest
    from providers.common import usd_arg
    from tests.fakes.argv_cases import load_fakecli

    flags = load_fakecli().FLAGS
    capped = ProviderRequest(prompt="x", max_cost_usd=0.25)
    argv = CLI_PROVIDERS["claude"].build_invocation(capped, "claude").argv
    assert argv[argv.index("--max-budget-usd") + 1] == "0.25"
    assert flags["claude"]["--max-budget-usd"] == 1  # the real CLI's flag, taking a value
    argv = CLI_PROVIDERS["mistral"].build_invocation(capped, "vibe").argv
    assert argv[argv.index("--max-price") + 1] == "0.25" and flags["vibe"]["--max-price"] == 1
    uncapped = ProviderRequest(prompt="x")
    assert "--max-budget-usd" not in CLI_PROVIDERS["claude"].build_invocation(
        uncapped, "claude").argv
    assert usd_arg(1.5) == "1.5" and usd_arg(0.0000012) == "0.000001" and usd_arg(3) == "3"
