"""The one loopback rule (neutral/loopback.py): `serve --no-auth`, keyless local model APIs
and the HTTP transport's Host/Origin checks all ask it, so tricky spellings are pinned here."""

from __future__ import annotations

import pytest

from neutral.loopback import is_loopback_host
from providers.http.request import is_loopback_url

HOSTS = [
    # loopback
    ("localhost", True), ("LOCALHOST", True), ("LocalHost", True),
    ("localhost.", True),  # the same name, written absolute (root's trailing dot)
    ("127.0.0.1", True), ("127.0.0.2", True), ("127.255.255.254", True),
    ("::1", True), ("[::1]", True), ("0:0:0:0:0:0:0:1", True),
    ("::ffff:127.0.0.1", True), ("[::ffff:127.0.0.1]", True),  # IPv4-mapped loopback
    # not loopback
    ("", False), (" 127.0.0.1", False), ("127.0.0.1 ", False), (" localhost", False),
    ("localhost..", False), ("localhost.example", False), ("foo.localhost", False),
    ("localhost:8765", False), ("127.0.0.1:8765", False), ("[::1]:8765", False),
    ("0x7f.1", False), ("127.1", False), ("0177.0.0.1", False), ("2130706433", False),
    ("[127.0.0.1]", False),  # brackets hold IPv6 only
    ("[::1", False), ("::1]", False), ("[localhost]", False),
    ("0.0.0.0", False), ("::", False), ("[::]", False), ("10.0.0.1", False),
    ("::ffff:10.0.0.1", False), ("128.0.0.1", False), ("example.com", False),
    ("\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54", False),  # fullwidth
    ("localhost\x00", False), ("localhost\n", False),
]


@pytest.mark.parametrize(("host", "loopback"), HOSTS)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(("url", "loopback"), [
    ("http://localhost:11434/v1", True), ("http://LOCALHOST./v1", True),
    ("http://127.0.0.2:8000", True), ("http://[::1]:8000/v1", True),
    ("https://api.example.com/v1", False), ("http://foo.localhost/v1", False),
    ("http://0x7f.1/v1", False), ("http://[::1/v1", False), ("not a url", False),
    ("http://user:pw@127.0.0.1/v1", True),
])
def test_is_loopback_url_asks_the_same_rule(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback
