"""The one check of usage figures (providers/figures.py, #38 items 4 and 5): what it accepts,
what it refuses and why, and that every CLI adapter and both HTTP wire formats read their
figures through it, so a bad one is left out with a warning and the answer stays."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.jobs.execution import ExecutionOutcome
from gateway.jobs.outcome_to_completion import completion_of, usage_figures
from gateway.model import JobStatus, UsageFigures
from gateway.store.usage import spent_on
from providers.base import ProviderResult
from providers.figures import (
    MAX_JOB_COST_USD,
    MAX_TOKENS,
    BadFigure,
    Usage,
    cost_usd,
    token_count,
)
from providers.http import anthropic, openai
from providers.registry import CLI_PROVIDERS
from providers.usage import COST_SOURCES, usage_record

NAN, INF = float("nan"), float("inf")
# What a JSON document can hold where a figure belongs, Python's extensions included.
JSON_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats()
                | st.text(max_size=12) | st.sampled_from(["12", " 7 ", "-3", "1e3", "nan",
                                                          "Infinity", "1e400"]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=6)


@pytest.mark.parametrize(("check", "kind", "ceiling"), [
    (token_count, int, MAX_TOKENS), (cost_usd, float, MAX_JOB_COST_USD)],
    ids=["tokens", "cost"])
@given(value=JSON_VALUES)
def test_a_figure_is_a_number_of_its_kind_in_range_or_refused_with_a_reason(
        check: Callable[[Any], float | None], kind: type, ceiling: float, value: Any) -> None:
    try:
        figure = check(value)
    except BadFigure as exc:
        assert str(exc)
        return
    if figure is None:
        assert value is None
        return
    assert isinstance(figure, kind) and math.isfinite(figure) and 0 <= figure <= ceiling
    # and the ledger can always hold a cost, in whole micro-dollars
    assert kind is int or UsageFigures("reported", cost_usd=figure).cost_micro_usd is not None


@pytest.mark.parametrize(("value", "why"), [
    (-100, "is negative"), (-0.5, "is negative"), (math.nan, "not a finite number"),
    (math.inf, "not a finite number"), (-math.inf, "not a finite number"),
    (json.loads("1e400"), "not a finite number"), (10**400, "not a finite number"),
    (1e308, "above the ceiling"), (MAX_JOB_COST_USD * 1.001, "above the ceiling"),
    ("NaN", "not a finite number"), ("cheap", "not a number"), (True, "not a number"),
    ([1], "not a number"),
])
def test_a_bad_cost_is_refused_saying_why(value: Any, why: str) -> None:
    with pytest.raises(BadFigure, match=why):
        cost_usd(value)


@pytest.mark.parametrize(("value", "why"), [
    (-1, "is negative"), (10**30, "above the ceiling"), (1e30, "above the ceiling"),
    (MAX_TOKENS + 1, "above the ceiling"), (math.nan, "not a finite number"),
    (math.inf, "not a finite number"), (12.5, "not a whole number"), ("x" * 100, "not a number"),
    (False, "not a number"), ({"n": 1}, "not a number"),
])
def test_a_bad_token_count_is_refused_saying_why(value: Any, why: str) -> None:
    with pytest.raises(BadFigure, match=why):
        token_count(value)


def test_good_figures_pass_as_numbers_of_their_kind() -> None:
    assert token_count(0) == 0 and token_count(12.0) == 12 and token_count(" 42 ") == 42
    assert token_count(MAX_TOKENS) == MAX_TOKENS and token_count(None) is None
    assert cost_usd(0) == 0.0 and cost_usd("0.25") == 0.25 and cost_usd(MAX_JOB_COST_USD)
    negative_zero = cost_usd(-0.0)
    assert negative_zero == 0.0 and math.copysign(1, negative_zero or 0.0) == 1


def test_a_warning_quotes_only_the_start_of_a_long_value() -> None:
    usage = Usage()
    usage.read("input_tokens", "y" * 10_000)
    (warning,) = usage.warnings()
    assert warning.startswith("input_tokens: 'yyy") and len(warning) < 100


def test_the_last_reading_of_a_figure_decides() -> None:
    usage = Usage()
    usage.read("output_tokens", -1)
    assert usage.output_tokens is None and "output_tokens" in usage.refused
    usage.read("output_tokens", 7)  # a later cumulative count that is good
    assert usage.output_tokens == 7 and not usage.refused
    usage.read("output_tokens", None)  # not reported this time: nothing changes
    assert usage.output_tokens == 7
    usage.read("output_tokens", math.inf)
    assert usage.output_tokens is None and usage.found() is usage


def test_a_sum_with_one_bad_part_is_left_out_and_a_good_sum_is_checked_whole() -> None:
    usage = Usage()
    usage.read_sum("input_tokens", [5, -1, 7])
    assert usage.input_tokens is None and "one of its parts" in usage.refused["input_tokens"]
    usage.read_sum("output_tokens", [MAX_TOKENS, 1])
    assert usage.output_tokens is None and "ceiling" in usage.refused["output_tokens"]
    usage.read_sum("cache_read_tokens", [2, None, 3])
    assert usage.cache_read_tokens == 5


# -- the record a job stores -------------------------------------------------------------


def test_a_refused_cost_is_an_invalid_cost_never_an_estimate() -> None:
    usage = Usage()
    usage.read("cost_usd", -100)
    usage.read("input_tokens", 1000)
    record = usage_record(usage, "claude-sonnet")  # a priced model: it could be estimated
    assert record["cost_source"] == "invalid" and "cost_usd" not in record
    assert record["input_tokens"] == 1000
    assert record["warnings"] == ["cost_usd: -100 is negative; left out"]


def test_an_estimate_never_prices_what_is_left_of_refused_tokens() -> None:
    usage = Usage()
    usage.read("input_tokens", -2_000_000)
    usage.read("output_tokens", 10)
    assert usage_record(usage, "gpt-5")["cost_source"] == "invalid"
    # an unpriced model had no cost to estimate anyway
    assert usage_record(usage, "llama-local")["cost_source"] == "absent"


def test_an_estimate_past_the_ceiling_of_a_job_is_invalid() -> None:
    usage = Usage()
    usage.read("output_tokens", MAX_TOKENS)
    record = usage_record(usage, "claude-opus")
    assert record["cost_source"] == "invalid" and "cost_usd" not in record
    assert record["warnings"][0].startswith("cost_usd: the estimate of $")


def test_a_job_whose_only_figures_were_refused_counts_as_invalid() -> None:
    usage = Usage()
    usage.read("cost_usd", math.nan)
    record = usage_record(usage.found(), None)
    figures = usage_figures(record, "m")
    assert figures is not None and figures.cost_source == "invalid"
    assert figures.cost_micro_usd is None
    assert "invalid" in COST_SOURCES


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in stored JSON")
    return json.loads(text, parse_constant=refuse)


def test_the_stored_result_is_strict_json_whatever_numbers_the_cli_printed() -> None:
    """PostgreSQL's json type (the light reads cast result_json) refuses NaN and Infinity."""
    usage = Usage()
    usage.read("cost_usd", NAN)
    usage.read("output_tokens", 3)
    result = ProviderResult(text="hi", usage=usage, extra={
        "duration_ms": NAN, "num_turns": INF, "nested": {"deep": [-INF, 1.5]}, "model": "m"})
    outcome = ExecutionOutcome(exit_code=0, error_kind=None, error=None, output="hi",
                               stderr_tail="", output_bytes=2, truncated=False,
                               duration_s=0.1, result=result)
    completion = completion_of(outcome, "log in")
    assert completion.status == JobStatus.COMPLETED and completion.result_json is not None
    stored = _strict(completion.result_json)
    assert stored["text"] == "hi" and stored["usage"]["cost_source"] == "invalid"
    assert stored["extra"] == {"duration_ms": None, "num_turns": None,
                               "nested": {"deep": [None, 1.5]}, "model": "m"}
    assert completion.usage is not None and completion.usage.output_tokens == 3


# -- the ledger's own defence ------------------------------------------------------------


def test_settling_a_budget_never_credits_it() -> None:
    reserved = 250_000
    for cost in (-100.0, math.nan, math.inf, 1e308):  # as if one got past the parse check
        assert spent_on("usd", reserved, UsageFigures("reported", cost_usd=cost)) == 0
    assert spent_on("usd", reserved, UsageFigures("invalid")) == reserved
    assert spent_on("usd", reserved, UsageFigures("reported", cost_usd=0.1)) == 100_000
    assert spent_on("usd", reserved, None) == 0
    assert spent_on("jobs", 1, UsageFigures("invalid")) == 1


# -- every adapter reads through the check -----------------------------------------------

def _lines(*events: dict[str, Any]) -> bytes:
    return "".join(json.dumps(event) + "\n" for event in events).encode()


# (provider, options, stdout with bad figures, the answer, figures refused, figures kept)
ADAPTER_CASES: list[tuple[str, dict[str, Any], bytes, str, set[str], dict[str, Any]]] = [
    ("claude", {"output_format": "json"}, _lines(
        {"type": "result", "subtype": "success", "result": "hi", "session_id": "s",
         "total_cost_usd": NAN, "usage": {"input_tokens": 10**30, "output_tokens": 4},
         "modelUsage": {"m": {"inputTokens": -1, "costUSD": INF}}}),
     "hi", {"cost_usd", "input_tokens", "models.m.input_tokens", "models.m.cost_usd"},
     {"output_tokens": 4}),
    ("claude", {}, _lines(
        {"type": "system", "subtype": "init", "session_id": "s"},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "hi"}]}},
        {"type": "result", "subtype": "success", "result": "hi", "total_cost_usd": -100,
         "usage": {"output_tokens": 2}}),
     "hi", {"cost_usd"}, {"output_tokens": 2}),
    ("cursor", {"output_format": "json"}, _lines(
        {"type": "result", "result": "hi", "session_id": "s",
         "usage": {"inputTokens": -5, "outputTokens": INF, "cacheReadTokens": 3}}),
     "hi", {"input_tokens", "output_tokens"}, {"cache_read_tokens": 3}),
    ("codex", {}, _lines(
        {"type": "thread.started", "thread_id": "t"},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "hi"}},
        {"type": "turn.completed", "usage": {"input_tokens": 1e30, "output_tokens": -1,
                                             "cached_input_tokens": 5}}),
     "hi", {"input_tokens", "output_tokens"}, {"cache_read_tokens": 5}),
    ("gemini", {"output_format": "json"}, json.dumps(
        {"session_id": "s", "response": "hi", "stats": {"models": {
            "a": {"tokens": {"prompt": 5, "candidates": NAN, "cached": 1}},
            "b": {"tokens": {"prompt": 10**30, "candidates": 2, "cached": 1}}}}}).encode(),
     "hi", {"input_tokens", "output_tokens"}, {"cache_read_tokens": 2}),
    ("gemini", {"output_format": "json"}, json.dumps(
        {"conversation_id": "c", "status": "SUCCESS", "response": "hi",
         "usage": {"input_tokens": -3, "output_tokens": 8}}).encode(),
     "hi", {"input_tokens"}, {"output_tokens": 8}),
    ("grok", {}, _lines(
        {"type": "text", "data": "hi"},
        {"type": "end", "sessionId": "s", "usage": {"input_tokens": INF, "output_tokens": 1,
                                                    "cache_read_input_tokens": -4}}),
     "hi", {"input_tokens", "cache_read_tokens"}, {"output_tokens": 1}),
    ("grok", {"output_format": "json"}, json.dumps(
        {"text": "hi", "sessionId": "s", "usage": {"input_tokens": 2,
                                                   "output_tokens": 10**13}}).encode(),
     "hi", {"output_tokens"}, {"input_tokens": 2}),
    ("mistral", {"output": "streaming"}, _lines(
        {"role": "assistant", "content": "hi"},
        {"stats": {"session_prompt_tokens": 9, "session_completion_tokens": NAN,
                   "session_cost": -100}}),
     "hi", {"output_tokens", "cost_usd"}, {"input_tokens": 9}),
]


@pytest.mark.parametrize(("provider", "options", "stdout", "answer", "refused", "kept"),
                         ADAPTER_CASES, ids=[f"{c[0]}-{n}" for n, c in enumerate(ADAPTER_CASES)])
def test_each_adapter_leaves_out_a_bad_figure_and_keeps_the_answer(
        provider: str, options: dict[str, Any], stdout: bytes, answer: str, refused: set[str],
        kept: dict[str, Any]) -> None:
    adapter = CLI_PROVIDERS[provider]
    result = adapter.parse_output(stdout, b"", 0, adapter.options_model.model_validate(options))
    assert result.text == answer and not result.is_error
    assert result.usage is not None
    assert set(result.usage.refused) == refused
    assert result.usage.as_dict() == kept
    record = usage_record(result.usage, None)
    assert len(record["warnings"]) == len(refused)
    assert json.loads(json.dumps(record, allow_nan=False)) == record  # plain JSON, no NaN


def test_devin_prints_no_usage_so_there_is_no_figure_to_check() -> None:
    result = CLI_PROVIDERS["devin"].parse_output(b'{"total_cost_usd": -100}\n', b"", 0)
    assert result.usage is None


@pytest.mark.parametrize("wire", [openai, anthropic], ids=["openai", "anthropic"])
def test_each_api_wire_format_leaves_out_a_bad_figure(wire: Any) -> None:
    if wire is openai:
        body = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": -7, "completion_tokens": NAN,
                          "prompt_tokens_details": {"cached_tokens": 3}}}
    else:
        body = {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": -7, "output_tokens": NAN,
                          "cache_read_input_tokens": 3}}
    text, summary = wire.parse_answer(body)
    assert text == "hi"
    assert summary.usage.as_dict() == {"cache_read_tokens": 3}
    assert set(summary.usage.refused) == {"input_tokens", "output_tokens"}
