"""The registry: seven adapters under the config's provider names, and finding their
binaries on a bare PATH plus the user bin directories.

Hermetic: the lookups search only the test's own PATH (an empty directory) and the user bin
dirs under the test's HOME (`HOME_BIN_DIRS`), never the host's /usr/bin, /usr/local/bin or
/opt/homebrew/bin, where a real claude or codex may be installed."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gateway.config import PROVIDER_NAMES
from providers.base import CliProvider, LoginCheck, OutputDiscipline
from providers.registry import (
    CLI_PROVIDERS,
    REPORTS_COST,
    USER_BIN_DIRS,
    extended_path,
    provider_binary,
)

STREAMING = {"claude", "codex", "grok"}
# The user bin dirs that live under HOME: the machine-wide ones (/usr/local/bin,
# /opt/homebrew/bin) are the host's, not the test's.
HOME_BIN_DIRS = tuple(d for d in USER_BIN_DIRS if d.startswith("~"))


def test_there_is_one_adapter_per_configurable_provider() -> None:
    assert tuple(CLI_PROVIDERS) == PROVIDER_NAMES  # the config's list is the registry's
    for name, adapter in CLI_PROVIDERS.items():
        assert adapter.name == name


def facts() -> list[str]:
    """What CliProvider declares without a value: a fact each adapter must set itself."""
    return [name for name in CliProvider.__annotations__ if name not in vars(CliProvider)]


def unset_facts(adapter: type[CliProvider]) -> list[str]:
    return [fact for fact in facts() if not hasattr(adapter, fact)]


def test_an_adapter_without_a_login_check_or_a_cost_fact_is_caught() -> None:
    class Eighth(CliProvider):
        name = "eighth"
        commands = ("eighth",)
        discipline = OutputDiscipline.AT_EXIT
        login_hint = "Run `eighth login` and retry."
        install_hint = "npm install -g eighth"
        auth_failure = re.compile("not logged in")

    assert unset_facts(Eighth) == ["login_check", "reports_cost"]


@pytest.mark.parametrize("name", PROVIDER_NAMES)
def test_each_adapter_sets_every_fact_the_interface_declares(name: str) -> None:
    adapter = CLI_PROVIDERS[name]
    assert unset_facts(type(adapter)) == [], f"{name}: set these in providers/{name}.py"
    assert isinstance(adapter.login_check, LoginCheck)
    assert isinstance(adapter.reports_cost, bool)


def test_only_the_clis_that_print_a_cost_count_against_a_money_budget() -> None:
    assert {"claude", "mistral"} == REPORTS_COST


def test_each_login_check_is_what_doctor_looked_at_before_it_moved_to_the_adapter() -> None:
    checks = {name: adapter.login_check for name, adapter in CLI_PROVIDERS.items()}
    assert checks["codex"].status_argv == ("login", "status") and checks["codex"].status_exit_1_is_no
    assert checks["cursor"].status_argv == ("status",)
    assert checks["claude"].in_macos_keychain
    assert not any(check.in_macos_keychain for name, check in checks.items() if name != "claude")
    assert checks["devin"] == LoginCheck()  # no offline check: doctor cannot tell
    assert all(check.env_keys for name, check in checks.items() if name != "devin")


@pytest.mark.parametrize("name", PROVIDER_NAMES)
def test_each_adapter_describes_itself_for_users(name: str) -> None:
    adapter = CLI_PROVIDERS[name]
    assert adapter.commands and all(adapter.commands)
    assert "retry" in adapter.login_hint
    assert adapter.install_hint
    assert adapter.known_models
    expected = OutputDiscipline.STREAMS if name in STREAMING else OutputDiscipline.AT_EXIT
    assert adapter.discipline is expected
    for field_name, field in adapter.options_model.model_fields.items():
        assert field.description, f"{name}.{field_name} needs a description for agents"


def test_commands_and_hints_name_the_real_binaries_and_packages() -> None:
    assert CLI_PROVIDERS["gemini"].commands == ("agy", "gemini")
    assert CLI_PROVIDERS["mistral"].commands == ("vibe",)
    assert CLI_PROVIDERS["cursor"].commands == ("cursor-agent",)
    assert "`codex login`" in CLI_PROVIDERS["codex"].login_hint
    assert "@openai/codex" in CLI_PROVIDERS["codex"].install_hint
    assert "@anthropic-ai/claude-code" in CLI_PROVIDERS["claude"].install_hint
    assert "@google/gemini-cli" in CLI_PROVIDERS["gemini"].install_hint
    assert "mistral-vibe" in CLI_PROVIDERS["mistral"].install_hint


@pytest.mark.parametrize(("name", "options", "expected"), [
    ("claude", {}, OutputDiscipline.STREAMS),
    ("claude", {"output_format": "json"}, OutputDiscipline.AT_EXIT),
    ("claude", {"output_format": "text"}, OutputDiscipline.AT_EXIT),
    ("grok", {}, OutputDiscipline.STREAMS),
    ("grok", {"output_format": "plain"}, OutputDiscipline.AT_EXIT),
    ("codex", {}, OutputDiscipline.STREAMS),
    ("gemini", {"output_format": "json"}, OutputDiscipline.AT_EXIT),
    ("cursor", {"output_format": "stream-json"}, OutputDiscipline.AT_EXIT),
])
def test_a_format_that_prints_only_at_exit_is_never_idle_killed(
    name: str, options: dict[str, str], expected: OutputDiscipline,
) -> None:
    adapter = CLI_PROVIDERS[name]
    assert adapter.output_discipline(adapter.options_model.model_validate(options)) is expected


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def bare(tmp_path: Path) -> str:
    """A PATH as bare as an MCP client's, holding nothing (an empty directory)."""
    empty = tmp_path / "system-bin"
    empty.mkdir()
    return str(empty)


def find(provider: str, command: str | None, search_path: str) -> str | None:
    return provider_binary(provider, command, search_path, HOME_BIN_DIRS)


def search_dirs(path: str) -> list[str]:
    return extended_path(path, HOME_BIN_DIRS).split(os.pathsep)


def test_the_machine_wide_bin_dirs_are_searched_too() -> None:
    assert {"/usr/local/bin", "/opt/homebrew/bin"} <= set(USER_BIN_DIRS)
    assert not {"/usr/local/bin", "/opt/homebrew/bin"} & set(HOME_BIN_DIRS)


def test_extended_path_appends_existing_user_bin_dirs_once_after_the_given_path(
    home: Path, bare: str,
) -> None:
    for sub in (".local/bin", ".npm-global/bin", ".nvm/versions/node/v18.0.0/bin",
                ".nvm/versions/node/v22.1.0/bin", ".bun/bin"):
        (home / sub).mkdir(parents=True)
    local = str(home / ".local/bin")
    entries = search_dirs(f"{bare}:{local}:/bin")
    assert entries[:3] == [bare, local, "/bin"]
    assert entries.count(local) == 1
    assert str(home / ".npm-global/bin") in entries
    assert str(home / ".bun/bin") in entries
    nvm = [e for e in entries if ".nvm" in e]
    assert nvm == [str(home / ".nvm/versions/node/v22.1.0/bin"),
                   str(home / ".nvm/versions/node/v18.0.0/bin")]
    assert str(home / ".cargo/bin") not in entries


def test_extended_path_skips_user_dirs_that_do_not_exist(home: Path, bare: str) -> None:
    assert search_dirs(bare) == [bare]


def test_a_cli_in_a_user_bin_dir_is_found_on_a_bare_path(home: Path, bare: str) -> None:
    claude = _executable(home / ".npm-global/bin/claude")
    assert find("claude", None, bare) == str(claude)


def test_a_cli_installed_into_a_new_user_bin_dir_after_a_lookup_is_found(
    home: Path, bare: str,
) -> None:
    # The user bin dirs are remembered between requests; a dir that appears later counts.
    assert find("claude", None, bare) is None
    claude = _executable(home / ".local/bin/claude")
    assert find("claude", None, bare) == str(claude)
    assert str(home / ".local/bin") in search_dirs(bare)


def test_a_node_version_installed_after_a_lookup_comes_first(home: Path, bare: str) -> None:
    old = _executable(home / ".nvm/versions/node/v20.0.0/bin/codex")
    assert find("codex", None, bare) == str(old)
    (home / ".nvm/versions/node/v22.0.0").mkdir()  # nvm creates the version, then its bin
    assert find("codex", None, bare) == str(old)
    new = _executable(home / ".nvm/versions/node/v22.0.0/bin/codex")
    assert find("codex", None, bare) == str(new)


def test_a_user_bin_dir_that_is_removed_is_no_longer_searched(home: Path, bare: str) -> None:
    bun = home / ".bun/bin"
    _executable(bun / "grok")
    assert str(bun) in search_dirs(bare)
    (bun / "grok").unlink()
    bun.rmdir()
    assert str(bun) not in search_dirs(bare)
    assert find("grok", None, bare) is None


def test_gemini_falls_back_to_the_gemini_cli_when_agy_is_missing(
    home: Path, tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    gemini = _executable(bin_dir / "gemini")
    assert find("gemini", None, str(bin_dir)) == str(gemini)
    agy = _executable(bin_dir / "agy")
    assert find("gemini", None, str(bin_dir)) == str(agy)


def test_a_configured_command_wins_by_path_or_by_name(home: Path, tmp_path: Path) -> None:
    custom = _executable(tmp_path / "opt" / "my-claude")
    _executable(tmp_path / "bin" / "claude")
    assert find("claude", str(custom), str(tmp_path / "bin")) == str(custom)
    assert find("claude", "my-claude", str(tmp_path / "opt")) == str(custom)
    tilde = _executable(home / "tools" / "claude-wrapper")
    assert find("claude", "~/tools/claude-wrapper", str(tmp_path / "bin")) == str(tilde)


def test_a_missing_or_non_executable_command_resolves_to_none(
    home: Path, tmp_path: Path,
) -> None:
    assert find("devin", None, str(tmp_path)) is None
    assert find("devin", str(tmp_path / "nope"), str(tmp_path)) is None
    plain = tmp_path / "not-executable"
    plain.write_text("data")
    plain.chmod(0o644)
    assert find("devin", str(plain), str(tmp_path)) is None


def test_provider_binary_accepts_the_adapter_itself(home: Path, tmp_path: Path) -> None:
    grok = _executable(tmp_path / "grok")
    assert provider_binary(CLI_PROVIDERS["grok"], None, str(tmp_path), HOME_BIN_DIRS) == str(grok)
