"""What a child of the gateway inherits: a real fake CLI, spawned by a real gateway (and by a
`--version` probe), reports its whole environment through the fake CLI log. The gateway's
secrets (its AGENT_GATEWAY_* settings, the API keys its HTTP providers read, the PostgreSQL
password variables) must never be in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.childenv import secret_env_names
from gateway.jobs.requests import SubmitRequest
from gateway.model import JobStatus
from gateway.versions import probe_version
from tests.jobs.conftest import FAKES_BIN, FakeLog, MakeSettings, StartGateway
from tests.waiting import wait_for

pytestmark = pytest.mark.anyio

API_KEY_ENV = "FAKE_VENDOR_API_KEY"
SECRETS = {
    API_KEY_ENV: "sk-fake-api-key-secret",
    "PGPASSWORD": "pg-password-secret",
    "PGPASSFILE": "/nowhere/pgpass-secret",
    "AGENT_GATEWAY_HTTP__AUTH_TOKEN": "gateway-bearer-secret",
}
API_PROVIDERS = {"vendor": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                            "api_key_env": API_KEY_ENV}}


def assert_no_secret(env: dict[str, str]) -> None:
    leaked = sorted(set(SECRETS) & set(env))
    assert not leaked, f"the child inherited {leaked}"
    values = [k for k, v in env.items() if any(s in v for s in SECRETS.values())]
    assert not values, f"a secret value reached the child in {values}"
    assert not [k for k in env if k.upper().startswith("AGENT_GATEWAY_")]
    assert env["UNRELATED_SETTING"] == "kept"  # everything else is inherited


@pytest.fixture
def secret_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("UNRELATED_SETTING", "kept")


@pytest.mark.parametrize("backend", ["sqlite"])  # the environment does not depend on the store
async def test_api_key_env_never_reaches_a_cli_child(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, secret_environment: None,
) -> None:
    settings = make_settings(api_providers=API_PROVIDERS)
    assert settings.http.auth_token == SECRETS["AGENT_GATEWAY_HTTP__AUTH_TOKEN"]  # it is held
    manager = await (await start_gateway(settings)).manager()
    sub = await manager.submit("claude", SubmitRequest(prompt="hello"))
    row = await manager.reads.wait(sub.job.id, 20)
    assert row.status == JobStatus.COMPLETED, row.error
    (spawn,) = fake_log.spawns()
    assert_no_secret(spawn["env"])
    assert spawn["env"]["FAKE_CLI_LOG"] == str(fake_log.path)  # [providers.*] env still applies


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_version_probe_gets_the_scrubbed_environment_of_a_run(
    make_settings: MakeSettings, fake_log: FakeLog, secret_environment: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings(api_providers=API_PROVIDERS)
    monkeypatch.setenv("FAKE_CLI_LOG", str(fake_log.path))  # a probe gets no provider env
    version, problem = await probe_version(str(FAKES_BIN / "claude"), secret_env_names(settings))
    assert (version, problem) == ("claude 0.0.0-fake", None)
    (probe,) = await wait_for(lambda: [e for e in fake_log.entries() if e.get("version_probe")])
    assert_no_secret(probe["env"])
    assert (probe["env"]["NO_COLOR"], probe["env"]["TERM"]) == ("1", "dumb")


def test_the_secret_names_are_the_configured_keys_and_postgres_passwords(
    make_settings: MakeSettings, tmp_path: Path,
) -> None:
    settings = make_settings(api_providers=API_PROVIDERS)
    assert secret_env_names(settings) == {API_KEY_ENV, "PGPASSWORD", "PGPASSFILE"}
