"""The `[notify]` sinks: how one notice reaches a person or a program.

Each sink sends one notice payload (store/outbox.py `Notice.payload`) or raises SinkError
with a one-line reason; none ever goes through a shell, and none puts a secret in an
argument, a log line or a child's environment:
- desktop: `notify-send` (Linux) or `osascript` (macOS), argv only, the text stripped of
  markup and control characters (a job's error is text from a CLI: it must not become
  Pango markup or AppleScript);
- command: the configured argv with `{field}` placeholders filled from the notice, the
  notice as JSON on stdin, a timeout, the environment without the gateway's secrets;
- webhook: a POST of the JSON with `X-Agent-Gateway-Signature: sha256=<hex>` (HMAC-SHA256
  of the body with the value of the variable `webhook_secret_env` names), https:// or
  loopback http:// only (the config refuses the rest), a timeout, no redirects.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from typing import Any

import httpx2

from gateway.childenv import child_env
from gateway.config import NotifyConfig

SIGNATURE_HEADER = "X-Agent-Gateway-Signature"
USER_AGENT = "agent-cli-gateway-notices"
# A child that ignores SIGTERM is killed; this is how long the wait for its exit lasts.
KILL_WAIT_S = 2.0
BODY_LIMIT_CHARS = 300  # a desktop notification's body: a line or two, never a log
# Markup (Pango/HTML tags, entities) and control characters: what a desktop notifier could
# interpret rather than show.
_MARKUP = re.compile(r"<[^>]*>|&[#\w]+;")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u202a-\u202e\u2066-\u2069]")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


class SinkError(Exception):
    """A sink failed to deliver: the message says why in one line (no secret in it)."""


def plain(text: str, limit: int = BODY_LIMIT_CHARS) -> str:
    """`text` without markup, escapes or control characters, at most `limit` characters."""
    cleaned = _CONTROL.sub(" ", _MARKUP.sub("", text)).replace("\\", "/")
    return " ".join(cleaned.split())[:limit]


def desktop_argv(payload: Mapping[str, Any], platform: str = sys.platform) -> list[str] | None:
    """The argv that shows the notice on this machine's desktop, or None when neither
    notifier is installed (doctor says so)."""
    what = "attempt group" if payload.get("group_id") else f"{payload['provider']} job"
    title = plain(f"agent-cli-gateway: {what} {payload['status']}", 120)
    body = plain(str(payload["summary"]))
    if platform == "darwin":
        osascript = shutil.which("osascript")
        if osascript is None:
            return None
        # The text goes in as arguments of the script, never into the script's source.
        script = ("on run argv\n display notification (item 2 of argv) with title "
                  "(item 1 of argv)\nend run")
        return [osascript, "-e", script, title, body]
    notify_send = shutil.which("notify-send")
    if notify_send is None:
        return None
    return [notify_send, "--app-name=agent-cli-gateway", "--", title, body]


def desktop_notifier() -> str | None:
    """The desktop notifier this machine has (`doctor`), or None."""
    return shutil.which("osascript" if sys.platform == "darwin" else "notify-send")


def command_argv(template: list[str], payload: Mapping[str, Any]) -> list[str]:
    """The configured argv with each `{field}` replaced by the notice's field (an unknown
    field stays as written). A value fills one argument whole, so it can never split into
    two or become a flag of its own: it is text inside the argument the template put there."""
    def fill(match: re.Match[str]) -> str:
        value = payload.get(match.group(1), match.group(0))
        return "" if value is None else str(value)

    return [_PLACEHOLDER.sub(fill, part) for part in template]


async def run_argv(argv: list[str], stdin: bytes, timeout_s: float,
                   env: Mapping[str, str] | None = None) -> None:
    """Run a notifier: argv (never a shell), `stdin`, a timeout; SinkError unless it exits 0."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=dict(env) if env is not None else None,
            start_new_session=True)
    except OSError as exc:
        raise SinkError(f"{argv[0]} could not start: {exc.strerror or exc}") from None
    try:
        async with asyncio.timeout(timeout_s):
            _, stderr = await proc.communicate(stdin)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_WAIT_S):
                await proc.wait()
        raise SinkError(f"{os.path.basename(argv[0])} did not finish within "
                        f"{timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = plain(stderr.decode("utf-8", "replace"), 200)
        raise SinkError(f"{os.path.basename(argv[0])} exited {proc.returncode}"
                        + (f": {tail}" if tail else ""))


def body_of(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def signature(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def post_webhook(config: NotifyConfig, payload: Mapping[str, Any],
                       environ: Mapping[str, str] | None = None) -> None:
    """POST the notice; SinkError for a refused connection, a timeout or a non-2xx answer."""
    assert config.webhook_url is not None
    body = body_of(payload)
    headers = {"content-type": "application/json", "user-agent": USER_AGENT,
               "idempotency-key": str(payload["id"])}
    if config.webhook_secret_env:
        secret = (os.environ if environ is None else environ).get(config.webhook_secret_env)
        if not secret:
            raise SinkError(f"webhook_secret_env names {config.webhook_secret_env}, which is "
                            f"not set: the notice is not sent unsigned")
        headers[SIGNATURE_HEADER] = signature(body, secret)
    try:
        async with httpx2.AsyncClient(timeout=config.timeout_s, follow_redirects=False,
                                      trust_env=False) as client:
            answer = await client.post(config.webhook_url, content=body, headers=headers)
    except httpx2.HTTPError as exc:
        raise SinkError(f"webhook unreachable: {type(exc).__name__}") from None
    if not 200 <= answer.status_code < 300:
        raise SinkError(f"webhook answered HTTP {answer.status_code}")


async def send(sink: str, config: NotifyConfig, payload: Mapping[str, Any],
               secret_names: frozenset[str]) -> None:
    """Deliver `payload` through `sink` ("desktop", "command" or "webhook")."""
    if sink == "webhook":
        await post_webhook(config, payload)
    elif sink == "command":
        assert config.command is not None
        env = await asyncio.to_thread(child_env, secret_names | _webhook_secret(config))
        await run_argv(command_argv(config.command, payload), body_of(payload),
                       config.timeout_s, env)
    elif sink == "desktop":
        argv = desktop_argv(payload)
        if argv is None:
            raise SinkError("no desktop notifier here (notify-send on Linux, osascript on "
                            "macOS); `agent-cli-gateway doctor` says so")
        await run_argv(argv, b"", config.timeout_s)
    else:
        raise SinkError(f"unknown sink {sink!r}")


def _webhook_secret(config: NotifyConfig) -> frozenset[str]:
    return frozenset({config.webhook_secret_env}) if config.webhook_secret_env else frozenset()
