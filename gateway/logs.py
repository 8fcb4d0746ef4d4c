"""Logging: structlog to stderr, JSON lines or readable console lines, secrets redacted.

stdout is the MCP stdio channel: a single stray byte there corrupts the protocol (and
structlog's default logger prints to stdout), so every record, ours and the stdlib's
(mcp, httpx2, asyncpg, uvicorn), goes to stderr. A redaction processor runs last before
rendering as a safety net: callers must still never log secrets, but if one slips into a
key that looks secret or into a URL, it is masked before it reaches a terminal or a file
(the rules and the marker: neutral/redaction.py).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from neutral.redaction import REDACTED, is_secret_key, redact_value

LogFormat = Literal["auto", "json", "console"]

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# Libraries that log every request at INFO; they are useful only when debugging.
CHATTY_LOGGERS = ("httpx2", "httpx", "httpcore", "httpcore2", "asyncio", "uvicorn.access")

_HANDLER_MARK = "_agent_gateway_handler"


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask values of secret-looking keys and passwords inside URLs."""
    for key, value in list(event_dict.items()):
        if value is None:
            continue
        if is_secret_key(key):
            event_dict[key] = REDACTED
        else:
            event_dict[key] = redact_value(value)
    return event_dict


def _renderer(fmt: LogFormat, stream: TextIO) -> Processor:
    if fmt == "auto":
        fmt = "console" if _isatty(stream) else "json"
    if fmt == "json":
        return structlog.processors.JSONRenderer(default=str)
    colors = _isatty(stream) and "NO_COLOR" not in os.environ
    return structlog.dev.ConsoleRenderer(
        colors=colors, exception_formatter=structlog.dev.plain_traceback
    )


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or exotic stream
        return False


def configure_logging(
    level: str = "info", fmt: LogFormat = "auto", *, stream: TextIO | None = None
) -> None:
    """Send structlog and stdlib logging to `stream` (stderr by default), never stdout.

    `fmt="auto"` renders console lines on a terminal and JSON lines otherwise (a log file,
    an MCP client capturing stderr). Safe to call again: it replaces its own handler.
    Raises ValueError for an unknown level or format.
    """
    if level.lower() not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {list(LEVELS)}")
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; use auto, json or console")
    out = stream if stream is not None else sys.stderr
    numeric = LEVELS[level.lower()]
    renderer = _renderer(fmt, out)

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # The console renderer prints exc_info itself; JSON needs it turned into a string.
    tail: list[Processor] = [structlog.processors.StackInfoRenderer()]
    if not isinstance(renderer, structlog.dev.ConsoleRenderer):
        tail.append(structlog.processors.format_exc_info)
    tail += [redact_secrets, renderer]

    structlog.configure(
        processors=[*shared, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        # Not cached: a module-level logger must follow a later reconfiguration (tests, CLI).
        cache_logger_on_first_use=False,
    )

    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
        )
    )
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in list(root.handlers):
        # Ours from an earlier call, or a plain console handler (basicConfig) that would
        # print every record twice or, worse, to stdout.
        if getattr(old, _HANDLER_MARK, False) or type(old) is logging.StreamHandler:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else logging.WARNING)
