"""gateway.config: defaults, the example file, every validation rule, env overrides, lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import (
    CONFIG_ENV,
    PROVIDER_NAMES,
    ConfigError,
    Settings,
    default_config_path,
    gateway_home,
    load_settings,
    unknown_env_warnings,
)
from tests.conftest import clean_home

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config.example.toml"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in tmp and no AGENT_GATEWAY_* from the developer's shell."""
    return clean_home(tmp_path, monkeypatch)


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path: Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return info.value.problems


# -- defaults and the example -----------------------------------------------------------


def test_no_config_file_is_needed_and_defaults_live_under_home(home: Path) -> None:
    settings = load_settings()
    assert settings.persistence.backend == "sqlite"
    assert settings.persistence.path == home / ".agent-cli-gateway" / "jobs.db"
    assert settings.state_dir == home / ".agent-cli-gateway"
    assert set(settings.providers) == set(PROVIDER_NAMES)
    assert settings.api_providers == {}


def test_the_example_config_loads_and_equals_the_defaults() -> None:
    assert load_settings(EXAMPLE).model_dump() == Settings().model_dump()


def test_the_repository_keeps_one_example_config() -> None:
    # The wheel takes the root file into the package (pyproject: force-include); a second
    # copy in the checkout could drift and ship a stale starting config.
    assert not (REPO / "gateway" / "config.example.toml").exists()


def test_a_partial_provider_section_keeps_every_other_provider(tmp_path: Path) -> None:
    path = write(tmp_path, '[providers.codex]\nenabled = false\ncommand = "/opt/codex"\n')
    settings = load_settings(path)
    assert settings.providers["codex"].enabled is False
    assert settings.providers["codex"].command == "/opt/codex"
    assert set(settings.providers) == set(PROVIDER_NAMES)
    assert settings.providers["claude"].enabled is True


def test_an_api_provider_section_is_loaded(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[api_providers.openrouter]\nkind = "openai"\nbase_url = "https://openrouter.ai/api/v1"\n'
        'api_key_env = "OPENROUTER_API_KEY"\n',
    )
    api = load_settings(path).api_providers["openrouter"]
    assert (api.kind, api.api_key_env, api.timeout_s) == ("openai", "OPENROUTER_API_KEY", 600)


def test_durations_accept_decimals(tmp_path: Path) -> None:
    path = write(tmp_path, "[lease]\nheartbeat_s = 0.5\nttl_s = 1.25\ncancel_poll_s = 0.1\n"
                           "http_job_grace_s = 2\ninstance_gc_s = 2\n")
    lease = load_settings(path).lease
    assert (lease.heartbeat_s, lease.ttl_s, lease.cancel_poll_s) == (0.5, 1.25, 0.1)


def test_logging_level_is_case_insensitive(tmp_path: Path) -> None:
    path = write(tmp_path, '[logging]\nlevel = "WARNING"\nformat = "JSON"\n')
    assert load_settings(path).logging.model_dump() == {"level": "warning", "format": "json"}


def test_secrets_do_not_appear_in_the_settings_repr(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[http]\nauth_token = "tok-secret"\n'
        '[providers.claude]\nenv = {ANTHROPIC_API_KEY = "sk-1"}\n',
    )
    text = repr(load_settings(path))
    assert "tok-secret" not in text and "sk-1" not in text


# -- validation: every rule, one readable line each -------------------------------------


def test_a_typo_in_a_key_is_rejected_and_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[lease]\nttl = 120\n")
    (problem,) = problems_of(path)
    assert "unknown key 'lease.ttl'" in problem


def test_an_unknown_section_is_rejected_and_named(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[leases]\nttl_s = 120\n"))
    assert "unknown key 'leases'" in problem


def test_a_typo_in_a_provider_key_is_rejected(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[providers.claude]\nextra_arg = []\n"))
    assert "unknown key 'providers.claude.extra_arg'" in problem


def test_ttl_below_twice_the_heartbeat_is_rejected(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[lease]\nheartbeat_s = 50\n"))
    assert "lease.ttl_s (90) must be at least 2 * lease.heartbeat_s (100)" in problem


def test_ttl_of_exactly_twice_the_heartbeat_is_accepted(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "[lease]\nheartbeat_s = 45\n")).lease.ttl_s == 90


def test_http_job_grace_below_ttl_is_rejected(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[lease]\nhttp_job_grace_s = 60\n"))
    assert "lease.http_job_grace_s (60) must be >= lease.ttl_s (90)" in problem


def test_instance_gc_below_ttl_is_rejected(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[lease]\ninstance_gc_s = 89\n"))
    assert "lease.instance_gc_s (89) must be >= lease.ttl_s (90)" in problem


def test_postgres_without_a_dsn_is_rejected(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, '[persistence]\nbackend = "postgres"\n'))
    assert "persistence.dsn is required" in problem


def test_postgres_with_a_dsn_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, '[persistence]\nbackend = "postgres"\ndsn = "postgresql://u@h/d"\n')
    assert load_settings(path).persistence.dsn == "postgresql://u@h/d"


def test_an_unknown_backend_is_rejected(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, '[persistence]\nbackend = "mysql"\n'))
    assert problem.startswith("persistence.backend:") and "'mysql'" in problem


def test_a_non_number_is_rejected_with_the_value(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, '[limits]\nkill_grace_s = "soon"\n'))
    assert problem.startswith("limits.kill_grace_s:") and "'soon'" in problem


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("limits", "max_running_jobs", 0),
        ("limits", "max_running_per_provider", -1),
        ("limits", "max_queued_jobs", -1),
        ("limits", "max_output_bytes", 0),
        ("limits", "max_prompt_bytes", -5),
        ("limits", "queue_timeout_s", 0),
        ("limits", "kill_grace_s", -1),
        ("lease", "heartbeat_s", -1),
        ("lease", "max_heartbeat_failures", 0),
        ("persistence", "retention_days", 0),
        ("persistence", "dedup_window_s", -1),
        ("http", "port", 70000),
        ("http", "max_sessions", 0),
    ],
)
def test_out_of_range_numbers_are_rejected(
    tmp_path: Path, section: str, key: str, value: int
) -> None:
    problems = problems_of(write(tmp_path, f"[{section}]\n{key} = {value}\n"))
    assert any(p.startswith(f"{section}.{key}:") and f"(got {value})" in p for p in problems)


def test_an_unknown_provider_section_is_rejected(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[providers.chatgpt]\nenabled = true\n"))
    assert "unknown provider section(s) ['chatgpt']" in problem
    assert "[api_providers.<name>]" in problem


def test_an_api_provider_named_like_a_cli_provider_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, '[api_providers.claude]\nkind = "anthropic"\nbase_url = "https://x"\n')
    (problem,) = problems_of(path)
    assert "clash with CLI provider names" in problem


def test_an_api_provider_without_kind_or_url_names_both(tmp_path: Path) -> None:
    problems = problems_of(write(tmp_path, "[api_providers.mine]\ndefault_model = \"m\"\n"))
    assert any("api_providers.mine.kind" in p for p in problems)
    assert any("api_providers.mine.base_url" in p for p in problems)


def test_every_problem_is_reported_on_its_own_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[foo]\nx = 1\n[limits]\nmax_running_jobs = -3\nkill_grace_s = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    error = info.value
    assert len(error.problems) == 3
    lines = str(error).splitlines()
    assert lines[0] == f"invalid configuration in {path}:"
    assert len(lines) == 4 and all(line.startswith("  - ") for line in lines[1:])


# -- sources: env over file, where the file is found ------------------------------------


def test_an_env_var_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[lease]\nttl_s = 100\nheartbeat_s = 10\n")
    monkeypatch.setenv("AGENT_GATEWAY_LEASE__TTL_S", "120")
    lease = load_settings(path).lease
    assert (lease.ttl_s, lease.heartbeat_s) == (120, 10)


def test_env_vars_reach_provider_and_api_provider_sections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_PROVIDERS__CODEX__EXTRA_ARGS", '["--flag"]')
    monkeypatch.setenv("AGENT_GATEWAY_API_PROVIDERS__OPENROUTER__KIND", "openai")
    monkeypatch.setenv("AGENT_GATEWAY_API_PROVIDERS__OPENROUTER__BASE_URL", "https://o/api")
    monkeypatch.setenv("AGENT_GATEWAY_HTTP__AUTH_TOKEN", "tok")
    settings = load_settings()
    assert settings.providers["codex"].extra_args == ["--flag"]
    assert settings.api_providers["openrouter"].base_url == "https://o/api"
    assert settings.http.auth_token == "tok"


def test_an_invalid_env_value_names_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_LIMITS__KILL_GRACE_S", "soon")
    (problem,) = problems_of()
    assert "limits.kill_grace_s" in problem
    assert "set by env AGENT_GATEWAY_LIMITS__KILL_GRACE_S" in problem


def test_a_typo_in_an_env_var_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_LEASE__TTL", "120")
    (problem,) = problems_of()
    assert "unknown key 'lease.ttl' (set by env AGENT_GATEWAY_LEASE__TTL)" in problem


def test_a_typo_in_an_env_var_s_section_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_LEASEE__TTL_S", "120")
    (problem,) = problems_of()
    assert "unknown key 'leasee'" in problem and "AGENT_GATEWAY_LEASEE__TTL_S" in problem


def test_env_var_names_are_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("agent_gateway_Lease__TTL_S", "120")
    assert load_settings().lease.ttl_s == 120


def test_the_keys_of_a_cli_s_env_table_keep_their_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_PROVIDERS__CODEX__ENV__OPENAI_BASE_URL", "http://x")
    monkeypatch.setenv("AGENT_GATEWAY_API_PROVIDERS__OR__KIND", "openai")
    monkeypatch.setenv("AGENT_GATEWAY_API_PROVIDERS__OR__BASE_URL", "http://o")
    monkeypatch.setenv("AGENT_GATEWAY_API_PROVIDERS__OR__HEADERS__X-Title", "gw")
    settings = load_settings()
    assert settings.providers["codex"].env == {"OPENAI_BASE_URL": "http://x"}
    assert settings.api_providers["or"].headers == {"X-Title": "gw"}


def test_a_section_set_as_json_is_merged_with_the_file_and_deeper_vars_win(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[lease]\nheartbeat_s = 10\n[limits]\nmax_running_jobs = 3\n")
    monkeypatch.setenv("AGENT_GATEWAY_LEASE", '{"ttl_s": 100, "sweep_interval_s": 7}')
    monkeypatch.setenv("AGENT_GATEWAY_LEASE__TTL_S", "120")
    settings = load_settings(path)
    lease = settings.lease
    assert (lease.heartbeat_s, lease.ttl_s, lease.sweep_interval_s) == (10, 120, 7)
    assert settings.limits.max_running_jobs == 3  # a section the environment did not touch


@pytest.mark.parametrize(("name", "shape"), [
    ("AGENT_GATEWAY_PROVIDERS__CODEX__EXTRA_ARGS", "a list"),
    ("AGENT_GATEWAY_PROVIDERS__CODEX__ENV", "a table"),
    ("AGENT_GATEWAY_LEASE", "a table"),
])
def test_a_value_that_must_be_json_and_is_not_names_the_variable_not_the_value(
        monkeypatch: pytest.MonkeyPatch, name: str, shape: str) -> None:
    monkeypatch.setenv(name, "--token=hunter2")
    (problem,) = problems_of()
    assert name in problem and f"JSON for {shape}" in problem
    assert "hunter2" not in problem  # a CLI's env or extra_args may hold a secret


def test_agent_gateway_config_and_other_single_names_are_not_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_CONFIG", str(write(tmp_path, "")))
    monkeypatch.setenv("AGENT_GATEWAY_SOMETHING", "1")
    assert load_settings().model_dump() == Settings().model_dump()


def test_an_env_var_can_break_a_cross_field_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_LEASE__HEARTBEAT_S", "60")
    (problem,) = problems_of()
    assert "must be at least 2 * lease.heartbeat_s" in problem


def test_the_default_path_is_in_the_gateway_home(home: Path) -> None:
    assert gateway_home() == home / ".agent-cli-gateway"
    assert default_config_path() == home / ".agent-cli-gateway" / "config.toml"


def test_the_file_in_the_gateway_home_is_read(home: Path) -> None:
    (home / ".agent-cli-gateway").mkdir()
    (home / ".agent-cli-gateway" / "config.toml").write_text("[limits]\nmax_running_jobs = 4\n")
    assert load_settings().limits.max_running_jobs == 4


def test_agent_gateway_config_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "[limits]\nmax_queued_jobs = 7\n", name="elsewhere.toml")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    assert default_config_path() == path
    assert load_settings().limits.max_queued_jobs == 7


def test_a_missing_file_named_by_agent_gateway_config_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "nope.toml"))
    (problem,) = problems_of()
    assert "does not exist" in problem and "agent-cli-gateway init" in problem


def test_a_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "missing.toml")
    assert info.value.path == tmp_path / "missing.toml"
    assert "does not exist" in info.value.problems[0]


def test_invalid_toml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[lease\nttl_s = \n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.path == path
    (problem,) = info.value.problems
    assert problem.startswith("not valid TOML:")


def test_a_directory_instead_of_a_file_is_an_error(tmp_path: Path) -> None:
    (problem,) = problems_of(tmp_path)
    assert problem.startswith("cannot read config file")


# -- #23 item 10 and #25 item 4: errors that quote nothing secret and name their source --


@pytest.mark.parametrize(("text", "secret"), [
    ('[providers.claude.env]\nAPI_KEY = ["sk-ant-secret-1"]\n', "sk-ant-secret-1"),
    ('[api_providers.r]\nkind = "openai"\nbase_url = "https://x"\n'
     '[api_providers.r.headers]\nAuthorization = ["Bearer s3cr3t"]\n', "s3cr3t"),
    ('[http]\nauth_token = ["tok-secret"]\n', "tok-secret"),
    ('[persistence]\ndsn = 12345678\n', "12345678"),
    ('[limits]\nmax_running_jobs = "' + "x" * 100 + '"\n', "x" * 41),
])
def test_config_errors_never_echo_a_secret_or_a_long_value(
        tmp_path: Path, text: str, secret: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    assert secret not in str(info.value)
    assert info.value.problems  # the key is still named


def test_a_short_plain_value_is_still_quoted(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[limits]\nmax_running_jobs = 0\n"))
    assert "(got 0)" in problem


@pytest.mark.parametrize(("name", "value", "expects"), [
    ("AGENT_GATEWAY_HTTP__PORT", "sk-1", "valid integer"),
    ("AGENT_GATEWAY_LIMITS__MAX_RUNNING_JOBS", "0", "greater than or equal to 1"),
    ("AGENT_GATEWAY_LOGGING__LEVEL", "tok", "'debug', 'info', 'warning' or 'error'"),
    ("AGENT_GATEWAY_WORKTREES__COPY", '["../tok"]', "relative path"),
])
def test_a_value_from_a_variable_is_never_quoted_however_short(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str, expects: str) -> None:
    """#38 item 8: a short value is quoted from the file, never from a variable (it may be
    a secret typed into the wrong one); the line says what the key expects instead."""
    monkeypatch.setenv(name, value)
    (problem,) = problems_of()
    assert expects in problem and f"(set by env {name}; its value is never shown)" in problem
    assert "got" not in problem and "tok" not in problem and "sk-1" not in problem


def test_a_bad_copy_entry_is_named_by_its_place_and_quoted_from_the_file(
        tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, '[worktrees]\ncopy = [".env", "../up"]\n'))
    assert problem == ("worktrees.copy.1: must be a relative path inside the repository "
                       "(no '..') (got '../up')")


@pytest.mark.parametrize("value", ["[" * 50_000, '{"a":' * 50_000, "[" * 33 + "]" * 33])
def test_deep_json_in_a_variable_is_a_config_error_not_a_recursion_error(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    name = "AGENT_GATEWAY_PROVIDERS__CODEX__EXTRA_ARGS"
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    (problem,) = info.value.problems
    assert name in problem and "deeper than" in problem
    assert info.value.env_names == [name]


def test_deep_nesting_in_the_toml_file_is_a_config_error(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "a = " + "[" * 50_000 + "\n"))
    assert "nested too deeply" in problem or "not valid TOML" in problem


@pytest.mark.parametrize("name", ["AGENT_GATEWAY_LIMITS__\u212aILL_GRACE_S",
                                  "AGENT_GATEWAY_\u212aIMITS__KILL_GRACE_S".replace(
                                      "\u212aIMITS", "L\u0130MITS")])
def test_config_keys_are_compared_in_ascii_only(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A Kelvin sign (U+212A) lower-cases to `k` and a dotted I (U+0130) to `i` with
    str.lower: neither may name a real key."""
    monkeypatch.setenv(name, "1")
    (problem,) = problems_of()
    assert "unknown key" in problem and name in problem


def test_a_kelvin_sign_key_in_the_file_is_unknown(tmp_path: Path) -> None:
    (problem,) = problems_of(write(tmp_path, "[limits]\n\"\u212aill_grace_s\" = 1\n"))
    assert "unknown key" in problem


@pytest.mark.parametrize(("text", "key"), [
    ("[limits]\nkill_grace_s = inf\n", "limits.kill_grace_s"),
    ("[lease]\nttl_s = inf\nheartbeat_s = 1\n", "lease.ttl_s"),
    ("[limits]\nidle_timeout_s = nan\n", "limits.idle_timeout_s"),
    ("[limits]\nmax_output_bytes = 10000000000000000000000000000000000000000\n",
     "limits.max_output_bytes"),
    ("[limits]\nmax_running_jobs = 1000000000\n", "limits.max_running_jobs"),
    ("[persistence]\nretention_days = 1e300\n", "persistence.retention_days"),
])
def test_infinite_and_huge_numbers_are_refused_with_bounds(
        tmp_path: Path, text: str, key: str) -> None:
    problems = problems_of(write(tmp_path, text))
    assert any(p.startswith(f"{key}:") for p in problems), problems


def test_an_infinite_duration_from_the_environment_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_GATEWAY_LIMITS__IDLE_TIMEOUT_S", "inf")
    (problem,) = problems_of()
    assert "limits.idle_timeout_s" in problem


def test_a_bad_env_var_names_the_variable_not_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#25 item 4: the file is fine, the variable is not: the error says so."""
    path = write(tmp_path, "[lease]\nheartbeat_s = 10\n")
    monkeypatch.setenv("AGENT_GATEWAY_LEASE__TTL_S", "soon")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    error = info.value
    assert error.env_names == ["AGENT_GATEWAY_LEASE__TTL_S"]
    assert not error.in_file
    assert str(error).splitlines()[0] == (
        "invalid configuration in the environment variable AGENT_GATEWAY_LEASE__TTL_S:")
    assert str(path) not in error.source and "AGENT_GATEWAY_LEASE__TTL_S" in error.source


def test_a_bad_file_key_and_a_bad_variable_name_both_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "[limits]\nmax_running_jobs = 0\n")
    monkeypatch.setenv("AGENT_GATEWAY_LEASE__TTL_S", "soon")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.in_file and info.value.env_names == ["AGENT_GATEWAY_LEASE__TTL_S"]
    assert str(path) in info.value.where and "AGENT_GATEWAY_LEASE__TTL_S" in info.value.where


@pytest.mark.parametrize(("name", "nearest"), [
    ("AGENT_GATEWAY_LEASE_TTL_S", "AGENT_GATEWAY_LEASE__TTL_S"),
    ("AGENT_GATEWAY_LIMITS_MAX_RUNNING_JOBS", "AGENT_GATEWAY_LIMITS__MAX_RUNNING_JOBS"),
    ("agent_gateway_http_auth_token", "AGENT_GATEWAY_HTTP__AUTH_TOKEN"),
])
def test_unknown_gateway_variables_are_warned_with_the_nearest_key(
        name: str, nearest: str) -> None:
    (warning,) = unknown_env_warnings({name: "5", "AGENT_GATEWAY_CONFIG": "/x",
                                       "AGENT_GATEWAY_LEASE__TTL_S": "100", "HOME": "/h"})
    assert name in warning and f"did you mean {nearest}?" in warning


def test_a_gateway_variable_far_from_every_key_is_still_warned() -> None:
    (warning,) = unknown_env_warnings({"AGENT_GATEWAY_ZZZZZZZZZZZZ": "1"})
    assert "two underscores" in warning


def test_the_config_names_secrets_by_the_one_rule_of_providers_redaction() -> None:
    """One home for the secret-name rule (#24): a variable's name is no secret, a count of
    tokens is none either; a token, a password, a DSN, an env table are."""
    from gateway.config.errors import is_secret_path

    assert not is_secret_path(("api_providers", "openrouter", "api_key_env"))
    assert not is_secret_path(("api_providers", "openrouter", "max_output_tokens"))
    assert is_secret_path(("http", "auth_token"))
    assert is_secret_path(("persistence", "dsn"))
    assert is_secret_path(("providers", "claude", "env", "ANYTHING"))
    assert is_secret_path(("api_providers", "x", "headers", "X-Api-Key"))
    assert is_secret_path(("x", "DB_PASSWORD"))
