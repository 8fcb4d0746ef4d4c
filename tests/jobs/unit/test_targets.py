"""A request resolves to one target shape per transport (gateway/jobs/targets.py): a CLI
target with the argv to launch, an HTTP target with the one normalized request, and a
parse-only CLI target for a run adopted after its CLI went away, which is never launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import Settings, load_settings
from gateway.jobs.execution import build_execution
from gateway.jobs.requests import SubmitRequest, stored_request
from gateway.jobs.targets import (
    CliLaunch,
    CliTarget,
    HttpTarget,
    parsing_target,
    resolve_target,
)
from gateway.model import ErrorKind, GatewayError
from providers.http.request import ApiRequest, normalized_request
from providers.registry import CLI_PROVIDERS
from tests.jobs.conftest import FAKES_BIN

KEY_ENV = "GATEWAY_TEST_API_KEY"


def settings_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, claude_command: Path) -> Settings:
    """Settings with claude run from `claude_command` and one loopback API provider."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AGENT_GATEWAY_CONFIG", raising=False)
    return load_settings(
        persistence={"backend": "memory"},
        providers={"claude": {"command": str(claude_command)}},
        api_providers={"oa": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                              "api_key_env": KEY_ENV, "default_model": "m-1"}})


def test_a_cli_request_resolves_to_a_cli_target_with_its_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with(tmp_path, monkeypatch, FAKES_BIN / "claude")
    target = resolve_target(settings, "claude", SubmitRequest(prompt="hello there"))
    assert isinstance(target, CliLaunch) and target.transport == "process"
    assert target.invocation.argv[0] == str(FAKES_BIN / "claude")
    assert isinstance(target.options, CLI_PROVIDERS["claude"].options_model)
    assert target.normalized["prompt"] == "hello there"


def test_an_api_request_resolves_to_an_http_target_that_carries_the_normalized_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with(tmp_path, monkeypatch, FAKES_BIN / "claude")
    request = SubmitRequest(prompt="hi", options={"temperature": 0.5})
    target = resolve_target(settings, "oa", request)
    assert isinstance(target, HttpTarget) and target.transport == "http"
    assert target.api_config is settings.api_providers["oa"]
    assert target.normalized == normalized_request(
        "oa", target.api_config, ApiRequest(prompt="hi", temperature=0.5))
    assert KEY_ENV in target.login_hint


def test_a_run_adopted_after_its_cli_went_away_is_parsed_but_never_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = settings_with(tmp_path, monkeypatch, FAKES_BIN / "claude")
    admitted = resolve_target(installed, "claude", SubmitRequest(prompt="hi"))
    request_json = stored_request(admitted.normalized, None)
    gone = settings_with(tmp_path, monkeypatch, tmp_path / "uninstalled" / "claude")
    with pytest.raises(GatewayError) as missing:
        resolve_target(gone, "claude", SubmitRequest(prompt="hi"))
    assert missing.value.kind == ErrorKind.NOT_FOUND
    target = parsing_target(gone, "claude", request_json)
    assert type(target) is CliTarget and target.adapter is CLI_PROVIDERS["claude"]
    with pytest.raises(GatewayError) as refused:
        build_execution(target, "job-1", tmp_path / "spool", 10.0, gone)
    assert refused.value.kind == ErrorKind.LAUNCH_FAILED


def test_an_api_providers_row_is_no_run_to_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with(tmp_path, monkeypatch, FAKES_BIN / "claude")
    admitted = resolve_target(settings, "oa", SubmitRequest(prompt="hi"))
    with pytest.raises(GatewayError) as err:
        parsing_target(settings, "oa", stored_request(admitted.normalized, None))
    assert err.value.kind == ErrorKind.INVALID_INPUT


REFUSALS = [
    ("claud", SubmitRequest(prompt="hi"), "did you mean 'claude'"),
    ("claude", SubmitRequest(prompt="  \n"), "prompt is empty"),
    ("claude", SubmitRequest(prompt="a\x00b"), "NUL byte"),
    ("claude", SubmitRequest(prompt="x" * 2049), "over limits.max_prompt_bytes"),
    ("claude", SubmitRequest(prompt="hi", timeout_s=0), "timeout_s must be a positive"),
    ("claude", SubmitRequest(prompt="hi", timeout_s=float("nan")), "timeout_s must be"),
    ("claude", SubmitRequest(prompt="hi", max_cost_usd=-1), "max_cost_usd must be"),
    ("claude", SubmitRequest(prompt="hi", working_dir="relative/dir"), "absolute path"),
    ("claude", SubmitRequest(prompt="hi", working_dir="/no/such/dir"), "does not exist"),
    ("claude", SubmitRequest(prompt="hi", isolation="sandbox"), "isolation must be"),
    ("claude", SubmitRequest(prompt="hi", base_ref="main"), "base_ref is for isolation"),
    ("claude", SubmitRequest(prompt="hi", isolation="worktree"), "needs working_dir"),
    ("claude", SubmitRequest(prompt="hi", options={"no_such_option": 1}), "invalid claude options"),
    ("oa", SubmitRequest(prompt="hi", options={"temperature": "hot"}), "invalid oa request"),
]


@pytest.mark.parametrize(("provider", "request_", "says"), REFUSALS,
                         ids=[says for _, _, says in REFUSALS])
def test_an_invalid_request_is_refused_as_invalid_input_saying_what_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: str, request_: SubmitRequest,
    says: str,
) -> None:
    settings = settings_with(tmp_path, monkeypatch, FAKES_BIN / "claude")
    settings.limits.max_prompt_bytes = 2048
    with pytest.raises(GatewayError) as refused:
        resolve_target(settings, provider, request_)
    assert refused.value.kind == ErrorKind.INVALID_INPUT
    assert says in refused.value.message


def test_a_disabled_provider_is_refused_and_a_missing_cli_is_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_with(tmp_path, monkeypatch, FAKES_BIN / "claude")
    settings.providers["claude"].enabled = False
    with pytest.raises(GatewayError) as disabled:
        resolve_target(settings, "claude", SubmitRequest(prompt="hi"))
    assert disabled.value.kind == ErrorKind.INVALID_INPUT and "disabled" in disabled.value.message
    gone = settings_with(tmp_path, monkeypatch, tmp_path / "nowhere" / "claude")
    with pytest.raises(GatewayError) as missing:
        resolve_target(gone, "claude", SubmitRequest(prompt="hi"))
    assert missing.value.kind == ErrorKind.NOT_FOUND
