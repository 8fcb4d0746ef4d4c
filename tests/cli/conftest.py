"""Fixtures for the operator CLI tests (helpers in cli_support.py): a private HOME, and the
CLI against a SQLite file or a fresh PostgreSQL database."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.cli_support import Cli, write_config


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


@pytest.fixture(params=["sqlite", "postgres"])
def cli(request: pytest.FixtureRequest, home: Path) -> Cli:
    """The CLI against a SQLite file, then against a fresh PostgreSQL database."""
    if request.param == "sqlite":
        persistence = f'[persistence]\npath = "{home / "state" / "jobs.db"}"\n'
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        persistence = f'[persistence]\nbackend = "postgres"\ndsn = "{dsn}"\n'
    return Cli(home, write_config(home, persistence), request.param)


@pytest.fixture
def sqlite_cli(home: Path) -> Cli:
    return Cli(home, write_config(home, f'[persistence]\npath = "{home / "state" / "jobs.db"}"\n'),
               "sqlite")
