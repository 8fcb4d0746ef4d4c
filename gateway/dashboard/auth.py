"""Who may see the dashboard: the token in the printed URL, traded once for a cookie.

The URL the dashboard prints carries a token (`/?token=...`, like Jupyter's). A request that
brings it gets a session: a fresh random id in an `HttpOnly`, `SameSite=Strict` cookie (no
script can read it, no other site's page can send it), and a redirect to the same address
without the token, so it leaves the address bar and the history. The token of the
`dashboard` command is one-time: the first exchange spends it (a second browser needs a new
run). Under `serve --transport http` the token is the transport's bearer token, which stays
valid (it is the MCP clients' credential too). Each session has its own CSRF token, which
every form carries and every POST must return.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field

COOKIE_NAME = "acg_dashboard"
TOKEN_PARAM = "token"
TOKEN_BYTES = 32  # 256 bits: the printed token, a session id and a CSRF token alike
MAX_SESSIONS = 64  # a person's browsers; past it the oldest session goes


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


@dataclass
class Sessions:
    """The token that opens a session, and the sessions it opened (in memory: a restart
    of the dashboard asks for its new URL)."""

    token: str | None  # None: no token guards this listener (serve's loopback --no-auth)
    one_time: bool
    spent: bool = False  # a one-time token after its exchange
    _csrf: dict[str, str] = field(default_factory=dict)  # session id -> its CSRF token

    def exchange(self, offered: str) -> str | None:
        """A new session id for a token that matches (compared in constant time), else
        None. A one-time token is spent by its first exchange."""
        if self.token is None or self.spent or not offered:
            return None
        if not hmac.compare_digest(offered.encode(), self.token.encode()):
            return None
        self.spent = self.one_time
        return self._open()

    def open_without_token(self) -> str | None:
        """A session for any caller when no token guards the listener, else None."""
        return self._open() if self.token is None else None

    def _open(self) -> str:
        while len(self._csrf) >= MAX_SESSIONS:
            del self._csrf[next(iter(self._csrf))]
        session = new_token()
        self._csrf[session] = new_token()
        return session

    def csrf_of(self, session: str | None) -> str | None:
        """The session's CSRF token; None when `session` is not a session of ours."""
        if not session:
            return None
        for known, csrf in self._csrf.items():
            if hmac.compare_digest(known.encode(), session.encode()):
                return csrf
        return None

    def csrf_matches(self, session: str | None, offered: str) -> bool:
        csrf = self.csrf_of(session)
        return csrf is not None and bool(offered) and hmac.compare_digest(csrf.encode(),
                                                                          offered.encode())
