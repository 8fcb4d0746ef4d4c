"""`agent-cli-gateway worker` refuses what cannot work (issue 42): a store only this host
sees (SQLite), and a config that would take no remote job; exit 2 with the reason and the
fix, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.main import main


def write(tmp_path: Path, text: str) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(text)
    config.chmod(0o600)
    return config


def test_a_worker_on_sqlite_is_refused_saying_why(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, f'[persistence]\npath = "{tmp_path / "jobs.db"}"\n'
                             "[worker]\naccept_remote = true\n")
    assert main(["--config", str(config), "worker"]) == 2
    err = capsys.readouterr().err
    assert "PostgreSQL" in err and "sqlite" in err
    assert not (tmp_path / "jobs.db").exists()


def test_a_worker_that_would_take_no_remote_job_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, '[persistence]\nbackend = "postgres"\n'
                             'dsn = "postgresql://nobody@127.0.0.1:1/none"\n')
    assert main(["--config", str(config), "worker", "--label", "gpu=true"]) == 2
    assert "accept_remote = true" in capsys.readouterr().err


def test_a_label_without_a_value_is_a_usage_error(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "")
    assert main(["--config", str(config), "worker", "--label", "gpu"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
