"""`agent-cli-gateway dashboard`'s refusals, as a person meets them at the shell."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli.cli_support import hermetic_env
from tests.dashboard.site import Site

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BOUND_S = 60


def dashboard(site: Site, *flags: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "dashboard", "--config",
                           str(site.config), *flags], env=hermetic_env(site.home, env),
                          cwd=site.home, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=BOUND_S, check=False)


async def test_before_any_gateway_made_the_store_it_says_to_start_one(
        dashboard_site: Site) -> None:
    done = dashboard(dashboard_site)
    assert done.returncode == 1
    assert "has not been created yet: start a gateway first" in done.stderr
    assert not (dashboard_site.root / "state" / "jobs.db").exists()


async def test_off_loopback_it_needs_the_configured_token(dashboard_site: Site) -> None:
    await dashboard_site.start_gateway()
    done = dashboard(dashboard_site, "--host", "0.0.0.0")
    assert done.returncode == 2
    assert "needs a token: set [http] auth_token" in done.stderr
    assert done.stdout == ""
