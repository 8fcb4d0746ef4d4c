"""Whether a host names this machine's loopback interface: the one rule for every check
that trusts "local" (serving HTTP without a token, a keyless local model API, and the HTTP
transport's Host/Origin checks).

Stdlib only and free of gateway imports, so providers and gateway both use it. Strict by
design: an address that is not plainly loopback is not loopback. A name other than
`localhost` could resolve anywhere (`foo.localhost` included: not every resolver honours
RFC 6761), and spellings that some C parsers accept but that are not canonical (`0x7f.1`,
`127.1`, `0177.0.0.1`, surrounding blanks) are refused rather than guessed at.
"""

from __future__ import annotations

import ipaddress

LOCALHOST = "localhost"


def is_loopback_host(host: str) -> bool:
    """True for `localhost` (any case, with or without the root's trailing dot), an IPv4
    address in 127.0.0.0/8, `::1` (bare or in URL brackets, `[::1]`) and IPv4-mapped
    loopback (`::ffff:127.0.0.1`); False for anything else, a port included."""
    if not host or not host.isascii() or host != host.strip():
        return False
    if host.lower() in (LOCALHOST, LOCALHOST + "."):
        return True
    bracketed = host.startswith("[") and host.endswith("]")
    literal = host[1:-1] if bracketed else host
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        return mapped.is_loopback if mapped is not None else address.is_loopback
    return not bracketed and address.is_loopback  # brackets hold IPv6 only
