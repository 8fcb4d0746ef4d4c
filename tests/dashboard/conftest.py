"""Fixtures of the browser tests: `browser` (the system's headless Chromium; a skip locally
without it, a failure in CI, like the PostgreSQL fixtures) and `site` (tests/dashboard/site.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser

from tests.conftest import in_ci
from tests.dashboard.site import NoBrowser, Site, chromium, site


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    try:
        context = chromium()
        opened = await context.__aenter__()
    except NoBrowser as exc:
        if in_ci():
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    try:
        yield opened
    finally:
        await context.__aexit__(None, None, None)


@pytest.fixture
async def dashboard_site(tmp_path: Path) -> AsyncIterator[Site]:
    async with site(tmp_path) as made:
        yield made


@pytest.fixture(params=["sqlite", "postgres"])
async def shared_site(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Site]:
    """A site on each backend: gateways of several hosts share PostgreSQL."""
    extra = ({"persistence": {"backend": "postgres",
                              "dsn": request.getfixturevalue("postgres_dsn")}}
             if request.param == "postgres" else {})
    async with site(tmp_path, **extra) as made:
        yield made
