"""gateway.config through pydantic-settings: the secrets directory (AGENT_GATEWAY_SECRETS_DIR)
and the order of the sources. Real files in a temporary directory; nothing is mocked."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import (
    SECRETS_DIR_ENV,
    ConfigError,
    load_planned,
    load_settings,
    origin_label,
    source_plan,
    unknown_env_warnings,
)
from tests.conftest import clean_home


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in tmp and no AGENT_GATEWAY_* from the developer's shell."""
    return clean_home(tmp_path, monkeypatch)


@pytest.fixture
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv(SECRETS_DIR_ENV, str(directory))
    return directory


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_dsn_and_a_token_come_from_secret_files(tmp_path: Path, secrets: Path) -> None:
    config = write(tmp_path / "config.toml", '[persistence]\nbackend = "postgres"\n')
    write(secrets / "persistence__dsn", "postgresql://gw:pw-in-a-file@db/jobs\n")
    write(secrets / "HTTP__AUTH_TOKEN", "tok-in-a-file\n")  # names fold case like variables
    settings = load_settings(config)
    assert settings.persistence.dsn == "postgresql://gw:pw-in-a-file@db/jobs"  # no newline
    assert settings.http.auth_token == "tok-in-a-file"


def test_the_environment_beats_a_secret_file_which_beats_the_file(
        tmp_path: Path, secrets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(tmp_path / "config.toml",
                   "[lease]\nttl_s = 100\nheartbeat_s = 10\nsweep_interval_s = 9\n")
    write(secrets / "lease__ttl_s", "110")
    write(secrets / "lease__heartbeat_s", "11")
    monkeypatch.setenv("AGENT_GATEWAY_LEASE__TTL_S", "120")
    plan = source_plan(config)
    lease = load_planned(plan).lease
    assert (lease.ttl_s, lease.heartbeat_s, lease.sweep_interval_s) == (120, 11, 9)
    assert origin_label(plan, ("lease", "ttl_s")) == "env AGENT_GATEWAY_LEASE__TTL_S"
    assert origin_label(plan, ("lease", "heartbeat_s")) == (
        f"secret file {secrets / 'lease__heartbeat_s'}")
    assert origin_label(plan, ("lease", "sweep_interval_s")) == f"file {config}"
    assert origin_label(plan, ("lease", "cancel_poll_s")) == "default"


def test_a_secret_file_naming_no_key_is_rejected_and_named(secrets: Path) -> None:
    write(secrets / "persistence__dns", "postgresql://gw:pw@db/jobs")
    with pytest.raises(ConfigError) as info:
        load_settings()
    (problem,) = info.value.problems
    assert "unknown key 'persistence.dns'" in problem
    assert info.value.secret_files == [str(secrets / "persistence__dns")]
    assert str(secrets / "persistence__dns") in info.value.source
    assert "pw@db" not in str(info.value)


def test_a_secret_file_of_no_section_is_rejected(secrets: Path) -> None:
    write(secrets / "persistance__dsn", "x")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "unknown key 'persistance'" in info.value.problems[0]


def test_bad_json_in_a_secret_file_names_the_file_not_the_value(secrets: Path) -> None:
    write(secrets / "providers__codex__env", "OPENAI_API_KEY=sk-never-shown")
    with pytest.raises(ConfigError) as info:
        load_settings()
    (problem,) = info.value.problems
    assert "providers__codex__env" in problem and "JSON for a table" in problem
    assert "sk-never-shown" not in str(info.value)


def test_a_bad_value_in_a_secret_file_is_not_quoted(secrets: Path) -> None:
    """#38 item 8: not even a short one under a key that takes a number (it was quoted)."""
    write(secrets / "http__auth_token", "")  # empty is fine: no token
    write(secrets / "persistence__pool_max", "many")
    with pytest.raises(ConfigError) as info:
        load_settings()
    (problem,) = info.value.problems
    assert problem.startswith("persistence.pool_max: Input should be a valid integer")
    assert problem.endswith(f"(set by secret file {secrets / 'persistence__pool_max'}; "
                            "its value is never shown)")
    assert "many" not in str(info.value)


def test_a_secrets_dir_that_is_not_a_directory_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.env_names == [SECRETS_DIR_ENV]
    assert not info.value.in_file


def test_without_the_variable_no_secret_file_is_read(home: Path, tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    write(tmp_path / "secrets" / "http__auth_token", "tok")
    assert load_settings().http.auth_token is None


def test_the_secrets_dir_variable_is_no_unknown_setting(tmp_path: Path) -> None:
    assert unknown_env_warnings({SECRETS_DIR_ENV: str(tmp_path), "AGENT_GATEWAY_CONFIG": "x"}) == []
