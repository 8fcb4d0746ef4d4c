"""A run's usage figures, and the one check every figure a CLI or an API reports passes, where
it is parsed (#38 items 4 and 5).

A figure is read from a process the gateway does not control: JSON allows `-100`, Python's
`json` reads `NaN` and `Infinity` (and `1e400` as infinity), and a broken counter prints
10**30 tokens. Taken as they came, these credited a budget (a cost of -100 spent -100 and let
twice the jobs in) or failed the money arithmetic and the store's 64-bit columns after the run
had answered, turning it into `failed` and losing the answer. So a figure is a whole number
of tokens, or a finite cost in US dollars, from 0 up to a ceiling no real run comes near; a
figure that is not is left out, and the usage says which and why (`refused`, shown as the
usage record's `warnings`; providers/usage.py makes a refused cost `cost_source =
"invalid"`). A usage figure never decides a job's outcome.

Adapters read figures only through `Usage.read` (and `read_first`, `read_sum`): building a
`Usage` from raw values directly would skip the check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The most tokens of one kind one job may report: a thousand times the largest context window
# (1M tokens) still fits, while the usage rollup's 64-bit sums stay millions of jobs away
# from overflowing. More is a broken counter, not a run.
MAX_TOKENS = 10**12
# The most one job may report it cost (USD): far above what any agent run costs (a long
# session of the dearest model is tens of dollars), far below where the micro-dollar
# arithmetic of budgets and totals loses precision or overflows.
MAX_JOB_COST_USD = 10_000.0
SHOWN_CHARS = 40  # how much of a refused value a warning quotes: it is the CLI's text

TOKEN_NAMES = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")
COST_NAME = "cost_usd"
FIGURE_NAMES = (*TOKEN_NAMES, COST_NAME)


class BadFigure(ValueError):
    """A reported figure no run can have: the message says why (it quotes the value)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _number(value: Any) -> int | float:
    """A JSON number, or a string holding one (some CLIs quote figures); else BadFigure."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadFigure(f"{_shown(value)} is not a number")
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise BadFigure(f"{_shown(value)} is not a number") from None


def token_count(value: Any) -> int | None:
    """A reported token count: a whole number from 0 to MAX_TOKENS. None when nothing was
    reported (None); BadFigure for anything else."""
    if value is None:
        return None
    number = _number(value)
    if isinstance(number, float):
        if not math.isfinite(number):
            raise BadFigure(f"{_shown(value)} is not a finite number")
        if not number.is_integer():
            raise BadFigure(f"{_shown(value)} is not a whole number")
    if number < 0:
        raise BadFigure(f"{_shown(value)} is negative")
    if number > MAX_TOKENS:
        raise BadFigure(f"{_shown(value)} is above the ceiling of {MAX_TOKENS} tokens")
    return int(number)


def cost_usd(value: Any) -> float | None:
    """A reported cost in US dollars: finite, from 0 to MAX_JOB_COST_USD. None when nothing
    was reported (None); BadFigure for anything else."""
    if value is None:
        return None
    number = _number(value)
    try:
        amount = float(number)
    except OverflowError:  # an int past float's range
        raise BadFigure(f"{_shown(value)} is not a finite number") from None
    if not math.isfinite(amount):
        raise BadFigure(f"{_shown(value)} is not a finite number")
    if amount < 0:
        raise BadFigure(f"{_shown(value)} is negative")
    if amount > MAX_JOB_COST_USD:
        raise BadFigure(f"{_shown(value)} is above the ceiling of ${MAX_JOB_COST_USD:,.0f} "
                        f"for one job")
    return amount + 0.0  # -0.0 is a cost of 0.0


def checked(name: str, value: Any) -> int | float | None:
    """`value` as the figure `name` (one of FIGURE_NAMES), checked; BadFigure if it is bad."""
    if name == COST_NAME:
        return cost_usd(value)
    if name in TOKEN_NAMES:
        return token_count(value)
    raise KeyError(f"{name} is not a usage figure")


def plain_json(value: Any) -> Any:
    """`value` (what an adapter kept of a run's output as it came: claude's `duration_ms`,
    `num_turns`...) with every non-finite number made null. Python's json reads NaN and
    Infinity and writes them back, but strict JSON has neither: PostgreSQL's `json` type
    refuses the stored result that holds one, and so would a client's JSON parser."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: plain_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(item) for item in value]
    return value


@dataclass(slots=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    cost_usd: float | None = None
    # Who pays, where the CLI says so ("api" | "subscription"); None: it did not say.
    billing: str | None = None
    # Per-model figures where the CLI breaks them down (claude's modelUsage), as it named them.
    models: dict[str, dict[str, Any]] | None = None
    # Figures the run reported that failed their check: figure name -> why it was left out.
    refused: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The figures the CLI reported (absent ones left out, never 0)."""
        return {n: getattr(self, n) for n in FIGURE_NAMES if getattr(self, n) is not None}

    def read(self, name: str, value: Any) -> None:
        """Take the figure `name` as the run reported it, checked: a bad one is left out and
        noted in `refused`. The last reading of a figure decides (an API repeats cumulative
        counts); a figure not reported (None) changes nothing."""
        if value is None:
            return
        try:
            figure = checked(name, value)
        except BadFigure as exc:
            setattr(self, name, None)
            self.refused[name] = str(exc)
            return
        setattr(self, name, figure)
        self.refused.pop(name, None)

    def read_first(self, name: str, raw: Mapping[str, Any], *keys: str) -> None:
        """Read `name` from the first of `keys` that `raw` holds a value for: a reported 0
        (or a bad value) is the figure, only a missing key falls through to the next."""
        self.read(name, next((raw[key] for key in keys if raw.get(key) is not None), None))

    def read_sum(self, name: str, values: Iterable[Any]) -> None:
        """Read `name` as the sum of parts (gemini reports tokens per model): left out when
        any part is bad, since a partial sum would undercount, and checked again whole."""
        total: int | None = None
        for value in values:
            try:
                part = token_count(value)
            except BadFigure as exc:
                setattr(self, name, None)
                self.refused[name] = f"{exc} (one of its parts)"
                return
            if part is not None:
                total = (total or 0) + part
        self.read(name, total)

    def found(self) -> Usage | None:
        """This usage, or None when the run reported no figure at all (nor a bad one)."""
        return self if self.as_dict() or self.refused else None

    def warnings(self) -> list[str]:
        """What was left out and why, one line per figure: the usage record's `warnings`."""
        return [f"{name}: {why}; left out" for name, why in sorted(self.refused.items())]
