"""gateway.logs: every record to stderr (never stdout), JSON or console, filtered, redacted."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import structlog

from gateway.logs import configure_logging
from neutral.redaction import REDACTED, is_secret_key, redact_text
from tests.waiting import scaled


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Leave structlog and the root logger as we found them for other test modules."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_default_stream_is_stderr_and_stdout_stays_empty(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "json")
    structlog.get_logger("t").info("hello", action="probe")
    logging.getLogger("some.library").warning("library says %s", "hi")

    out, err = capsys.readouterr()
    assert out == ""
    records = _json_lines(err)
    assert [r["event"] for r in records] == ["hello", "library says hi"]
    assert records[0]["action"] == "probe"
    assert records[1]["logger"] == "some.library"


@pytest.mark.slow  # starts a process
def test_a_fresh_process_that_logs_writes_nothing_to_stdout() -> None:
    # The MCP stdio transport owns fd 1 of the real process: check the real process.
    code = (
        "import logging, structlog\n"
        "from gateway.logs import configure_logging\n"
        "configure_logging('debug', 'auto')\n"
        "structlog.get_logger('x').debug('dbg', action='a')\n"
        "structlog.get_logger('x').error('boom', action='b')\n"
        "logging.getLogger('mcp.server').info('from stdlib')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=scaled(60), check=True
    )
    assert done.stdout == b""
    events = [r["event"] for r in _json_lines(done.stderr.decode())]
    assert events == ["dbg", "boom", "from stdlib"]


def test_records_carry_level_and_an_iso_utc_timestamp() -> None:
    buf = io.StringIO()
    configure_logging("info", "auto", stream=buf)  # a StringIO is not a TTY: JSON
    structlog.get_logger().warning("careful", action="x")

    (record,) = _json_lines(buf.getvalue())
    assert record["level"] == "warning"
    stamp = datetime.fromisoformat(str(record["timestamp"]))
    assert stamp.utcoffset() == UTC.utcoffset(None)


def test_level_filters_structlog_and_stdlib_records() -> None:
    buf = io.StringIO()
    configure_logging("warning", "json", stream=buf)
    log = structlog.get_logger()
    log.debug("d")
    log.info("i")
    log.warning("w")
    logging.getLogger("lib").info("lib-info")
    logging.getLogger("lib").error("lib-error")

    assert [r["event"] for r in _json_lines(buf.getvalue())] == ["w", "lib-error"]


def test_debug_level_shows_debug_records() -> None:
    buf = io.StringIO()
    configure_logging("DEBUG", "json", stream=buf)
    structlog.get_logger().debug("d")
    assert [r["event"] for r in _json_lines(buf.getvalue())] == ["d"]


def test_reconfiguring_replaces_the_handler_instead_of_duplicating_lines() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", stream=first)
    configure_logging("info", "json", stream=second)
    logging.getLogger("lib").warning("once")

    assert first.getvalue() == ""
    assert len(_json_lines(second.getvalue())) == 1


def test_console_format_is_readable_text_not_json() -> None:
    buf = io.StringIO()
    configure_logging("info", "console", stream=buf)
    structlog.get_logger().info("job started", action="run", job_id="j-1")

    line = buf.getvalue().strip()
    assert "job started" in line and "job_id=j-1" in line and "action=run" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)
    assert "\x1b[" not in line  # not a terminal: no colour codes


def test_auto_format_on_a_terminal_is_console() -> None:
    master, replica = os.openpty()
    try:
        with os.fdopen(replica, "w", closefd=True) as tty:
            configure_logging("info", "auto", stream=tty)
            structlog.get_logger().info("on a tty", action="t")
            tty.flush()
            text = os.read(master, 65536).decode()
    finally:
        os.close(master)
    assert "on a tty" in text
    assert not text.lstrip().startswith("{")


def test_exceptions_are_rendered_into_the_json_record() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    try:
        raise RuntimeError("kaboom")
    except RuntimeError:
        structlog.get_logger().exception("failed", action="x")

    (record,) = _json_lines(buf.getvalue())
    assert "RuntimeError: kaboom" in str(record["exception"])


def test_secret_keys_are_redacted_at_any_depth() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    structlog.get_logger().info(
        "config",
        auth_token="tok-123",
        api_key="sk-abc",
        password="hunter2",
        headers={"Authorization": "Bearer xyz", "X-Api-Key": "k-1", "Accept": "json"},
        env={"OPENAI_API_KEY": "sk-live", "PATH": "/usr/bin"},
        api_key_env="OPENAI_API_KEY",
        input_tokens=42,
        no_auth=True,
    )
    text = buf.getvalue()
    for secret in ("tok-123", "sk-abc", "hunter2", "xyz", "k-1", "sk-live"):
        assert secret not in text
    (record,) = _json_lines(text)
    assert record["auth_token"] == REDACTED
    assert record["headers"] == {"Authorization": REDACTED, "X-Api-Key": REDACTED, "Accept": "json"}
    assert record["env"] == {"OPENAI_API_KEY": REDACTED, "PATH": "/usr/bin"}
    # Look-alikes keep their value: a variable's NAME, a token count, a flag.
    assert record["api_key_env"] == "OPENAI_API_KEY"
    assert record["input_tokens"] == 42
    assert record["no_auth"] is True


def test_dsn_passwords_and_bearer_credentials_in_text_are_masked() -> None:
    buf = io.StringIO()
    configure_logging("info", "json", stream=buf)
    structlog.get_logger().warning(
        "cannot connect to postgresql://gw:s3cret@db.internal/jobs",
        dsn="postgresql://gw:p@ss@db/jobs",
        detail="sent Authorization: Bearer abc.def",
    )
    logging.getLogger("asyncpg").error("lost postgres://u:libsecret@h/d")
    text = buf.getvalue()
    for secret in ("s3cret", "p@ss", "abc.def", "libsecret"):
        assert secret not in text
    first = _json_lines(text)[0]
    assert first["dsn"] == f"postgresql://gw:{REDACTED}@db/jobs"
    assert f"postgresql://gw:{REDACTED}@db.internal/jobs" in str(first["event"])


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("token", True), ("auth_token", True), ("Authorization", True), ("x-api-key", True),
        ("apiKey", True), ("client_secret", True), ("GITHUB_TOKEN", True), ("cookie", True),
        ("input_tokens", False), ("api_key_env", False), ("no_auth", False), ("author", False),
        ("tokenizer", False),
    ],
)
def test_secret_key_detection(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_text_without_credentials_is_unchanged() -> None:
    text = "postgresql://gw@db/jobs and http://localhost:8765/mcp, user@example.com"
    assert redact_text(text) == text


def test_unknown_level_or_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="level"):
        configure_logging("verbose", "json")
    with pytest.raises(ValueError, match="format"):
        configure_logging("info", "xml")  # type: ignore[arg-type]
