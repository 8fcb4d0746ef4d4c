"""Fixtures for the tests that run the real claude, codex and gemini CLIs.

They are installed from npm into `.tools/npm` by `scripts/install-real-clis.sh` (CI runs it
before pytest). They run here without an account or network: their argument parsers are
real and an unauthenticated run fails the way it does for a user who is not logged in.
Every run gets a private HOME (never the real one) and no provider API keys.

When a binary is missing the test is skipped locally and fails in CI (CI=true).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKES_DIR = REPO_ROOT / "tests" / "fakes"
if str(FAKES_DIR) not in sys.path:
    sys.path.insert(0, str(FAKES_DIR))

REAL_CLI_BIN = Path(os.environ.get("REAL_CLI_BIN", REPO_ROOT / ".tools" / "npm" / "bin"))
INSTALL_HINT = "run `bash scripts/install-real-clis.sh` (installs them into .tools/npm)"
# Variables that would authenticate a CLI or point it elsewhere: never passed to a real CLI.
CREDENTIAL_VARS = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OPENAI_API_KEY",
    "CODEX_API_KEY", "CODEX_HOME", "GEMINI_API_KEY", "GOOGLE_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA",
    "GOOGLE_CLOUD_PROJECT", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL",
)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


@pytest.fixture
def real_cli() -> Callable[[str], str]:
    """The path of a real CLI (`claude`, `codex`, `gemini`); skip (fail in CI) if missing."""

    def find(binary: str) -> str:
        path = REAL_CLI_BIN / binary
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        message = f"real `{binary}` not installed in {REAL_CLI_BIN}: {INSTALL_HINT}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)

    return find


@pytest.fixture
def real_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME for this test and the CLIs it runs, with no credentials around."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("AGENT_GATEWAY_CONFIG", raising=False)
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def cli_env(real_home: Path) -> dict[str, str]:
    """The environment a real CLI runs with: this process's (private HOME, no keys), plus
    what the gateway's runner adds. IS_SANDBOX=1 lets claude accept bypassPermissions when
    the tests run as root (it refuses that as root otherwise, before parsing anything else
    matters)."""
    return {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "IS_SANDBOX": "1"}
