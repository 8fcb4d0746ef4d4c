"""The Host/Origin rule of every HTTP listener the gateway opens (the MCP transport and the
dashboard): DNS rebinding must never let a web page's script reach a loopback listener
under an attacker's name.

One home for the rule (gateway/mcp/http.py and gateway/dashboard/guard.py both ask it), so
the two listeners cannot drift apart. Stdlib only: each caller turns a refusal into its own
response and log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from neutral.loopback import LOCALHOST, is_loopback_host

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})

Refusal = Literal["host", "origin"]


def host_literal(host: str) -> str:
    """How a Host header spells an address: IPv6 in brackets, names lower-cased."""
    name = host.strip().lower()
    if ":" in name and not name.startswith("["):
        return f"[{name}]"
    return name


def allowed_host_headers(bound_host: str, local_ip: str | None, port: int) -> frozenset[str]:
    """The Host values a request to this listener may carry: the configured host, the IP
    literal the connection reached, and `localhost` on a loopback bind. An IP literal is
    safe to accept: DNS rebinding needs a name the attacker controls."""
    names = {host_literal(bound_host)}
    if local_ip:
        names.add(host_literal(local_ip))
    if is_loopback_host(bound_host.strip()):
        names.add(LOCALHOST)
    with_port = {f"{name}:{port}" for name in names}
    if port == 80:
        with_port |= names  # a client may omit the default port
    return frozenset(with_port)


@dataclass(frozen=True, slots=True)
class HostOriginRule:
    """The listener's bound host and the extra origins it lets call (`[http]
    allowed_origins`). `server` below is the ASGI scope's (local address, port)."""

    host: str
    allowed_origins: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, host: str, allowed_origins: list[str] | tuple[str, ...] = ()) -> HostOriginRule:
        return cls(host, frozenset(o.strip().rstrip("/").lower() for o in allowed_origins))

    @property
    def checks_host(self) -> bool:
        return self.host.strip().lower() not in WILDCARD_HOSTS

    def refusal(self, server: tuple[str | None, int | None], host_header: str,
                origin: str | None) -> Refusal | None:
        """"host" (answer 421) unless the Host header names the bound address and port;
        "origin" (answer 403) for an Origin header that is neither the listener's own
        (`http://` plus a Host value it accepts) nor an allowed one; None: go on."""
        local_ip, port = server
        if self.checks_host:
            given = host_header.strip().lower()
            if port is None or given not in allowed_host_headers(self.host, local_ip, port):
                return "host"
        if origin is not None:
            given = origin.strip().rstrip("/").lower()
            if given not in self.allowed_origins and not self._own_origin(server, given):
                return "origin"
        return None

    def _own_origin(self, server: tuple[str | None, int | None], origin: str) -> bool:
        """True for the origin of the address this listener serves on
        (`http://127.0.0.1:PORT`): a page it served itself, which DNS rebinding cannot forge
        (the attacker's page carries the attacker's name). On a wildcard bind, the IP
        literal the connection reached (and `localhost` when that is loopback)."""
        scheme, sep, authority = origin.partition("://")
        if scheme != "http" or not sep:
            return False
        local_ip, port = server
        if port is None:
            return False
        bound = self.host if self.checks_host else (local_ip or "")
        return authority in allowed_host_headers(bound, local_ip, port)
