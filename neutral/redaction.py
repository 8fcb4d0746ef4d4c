"""Secrets: how the gateway recognises one and the one marker that replaces it everywhere.

Every place that masks a secret (log records, error text, the DSN in `repr` and `doctor`,
a stored HTTP request's base_url and headers, API error bodies) uses this module, so a
secret is masked the same way wherever it turns up, and an operator who searches output for
`[redacted]` finds every place one was. Stdlib only and free of gateway imports, so
providers and the gateway both use it (like loopback.py).

The marker is `[redacted]`, not `***`: it cannot be mistaken for Markdown emphasis or a
glob in a quoted command line, and it is hashed into the request key of every HTTP job
whose endpoint has a secret-looking header or URL parameter (providers/http/request.py),
so it stays what those stored keys were made with.

Two questions are asked of a name, and they are different on purpose:
- `is_secret_key`: is this key of a log record or a mapping a secret? It must END with a
  secret word ("auth_token", "X-Api-Key", "OPENAI_API_KEY"), so the many look-alikes that
  are useful to see ("input_tokens", "api_key_env", which names a variable, "no_auth") are
  not masked.
- `is_secret_header`: is this configured HTTP header or URL query parameter a secret? Any
  mention of a secret word anywhere in the name counts ("X-Auth", "X-Session-Id",
  "X-Signature"): its value is stored in the job table and hashed into the request key, and
  a header masked needlessly costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "[redacted]"

# A key whose value must never be shown: it ends with one of these words.
_SECRET_KEY = re.compile(
    r"(?:^|_)(?:token|secret|password|passwd|pwd|authorization|cookie|credentials?"
    r"|api_?key|private_?key|access_?key|secret_?key)$"
)
# A header name or URL query key whose value is treated as a secret (anywhere in the name).
_SECRET_HEADER = re.compile(
    r"auth|key|token|secret|passw|cookie|session|credential|signature", re.IGNORECASE)
# userinfo of a URL: scheme://user:password@host -> scheme://user:[redacted]@host
# (greedy up to the last "@" of the token, so an unencoded "@" in the password is covered).
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)(?P<pw>\S+)(?=@[^@\s]*)")
# An HTTP credential written inline: "Bearer abc.def", "Authorization: Basic xyz".
_INLINE_CREDENTIAL = re.compile(r"(?P<scheme>\b(?:Bearer|Basic)\s+)(?P<cred>[A-Za-z0-9._~+/=-]+)")


def is_secret_key(key: object) -> bool:
    """Whether a mapping key names a secret (case, `-` and `_` insensitive)."""
    if not isinstance(key, str):
        return False
    return _SECRET_KEY.search(key.lower().replace("-", "_")) is not None


def is_secret_header(name: str) -> bool:
    """Whether a header name or URL query key looks secret (see the module docstring)."""
    return _SECRET_HEADER.search(name) is not None


def redact_text(text: str) -> str:
    """Mask URL passwords (a DSN) and inline bearer/basic credentials in free text."""
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED, text)
    return _INLINE_CREDENTIAL.sub(lambda m: m.group("scheme") + REDACTED, text)


def redact_value(value: Any) -> Any:
    """Return `value` with secrets masked, recursing into mappings and sequences."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if is_secret_key(k) and v is not None else redact_value(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def redact_url(url: str) -> str:
    """The URL without a userinfo password or secret-looking query values.

    Raises ValueError when the URL cannot be parsed (an invalid IPv6 host)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:{REDACTED}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{pair.partition('=')[0]}={REDACTED}"
        if "=" in pair and is_secret_header(pair.partition("=")[0]) else pair
        for pair in parts.query.split("&")
    ) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, secrets: Sequence[str]) -> str:
    """`text` with every occurrence of each known secret (a key, a password) replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text
