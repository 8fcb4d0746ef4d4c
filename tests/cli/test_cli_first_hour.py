"""What a newcomer's first commands say about the environment (#44): a documented variable
is not called unknown, a typo in one is a config error (exit 2) that never echoes the value,
and doctor names what every other command names (a misspelled variable, a missing driver)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.cli.cli_support import CLI_TIMEOUT_S, hermetic_env

REPO = Path(__file__).resolve().parents[2]


def gateway(home: Path, *args: str, env: dict[str, str] | None = None,
            prelude: str = "") -> subprocess.CompletedProcess[str]:
    """The console entry in a child, `prelude` run first (a stand-in for what is installed)."""
    code = f"import sys\n{prelude}\nfrom gateway.cli.main import main\nsys.exit(main())\n"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=home,
                          env=hermetic_env(home, {"PYTHONPATH": str(REPO), **(env or {})}),
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
                          stdin=subprocess.DEVNULL)


def test_the_documented_platform_variable_is_no_unknown_setting(tmp_path: Path) -> None:
    done = gateway(tmp_path, "jobs", "list", env={"AGENT_GATEWAY_PLATFORM": "portable"})
    assert done.returncode == 0, done.stderr
    assert "matches no setting" not in done.stderr
    doctor = gateway(tmp_path, "doctor", "--json", env={"AGENT_GATEWAY_PLATFORM": "portable"})
    config = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "config")
    assert config["status"] == "ok", config


def test_a_typo_in_the_platform_is_a_config_error_that_never_shows_the_value(
        tmp_path: Path) -> None:
    done = gateway(tmp_path, "jobs", "list", env={"AGENT_GATEWAY_PLATFORM": "portabel"})
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "invalid configuration in the environment variable AGENT_GATEWAY_PLATFORM" \
        in done.stderr
    assert "auto, linux, portable" in done.stderr
    assert "portabel" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_doctor_warns_of_a_misspelled_variable_as_every_command_does(tmp_path: Path) -> None:
    env = {"AGENT_GATEWAY_LEASE_TTL_S": "30"}
    doctor = gateway(tmp_path, "doctor", "--json", env=env)
    config = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "config")
    assert config["status"] == "warning", config
    assert "AGENT_GATEWAY_LEASE_TTL_S" in config["summary"]
    assert "did you mean AGENT_GATEWAY_LEASE__TTL_S" in config["summary"]


def test_doctor_says_what_to_install_for_postgres_without_asyncpg(tmp_path: Path) -> None:
    config_file = tmp_path / "config.toml"
    config_file.write_text('[persistence]\nbackend = "postgres"\n'
                           'dsn = "postgresql://u@127.0.0.1:1/db"\n')
    doctor = gateway(tmp_path, "doctor", "--json", "--config", str(config_file),
                     prelude="sys.modules['asyncpg'] = None  # the extra is not installed")
    store = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "store")
    assert store["status"] == "error", store
    assert "uvx --from 'agent-cli-gateway[postgres]' agent-cli-gateway" in store["summary"]


def test_a_store_that_cannot_be_looked_at_is_an_error_not_no_jobs_yet(tmp_path: Path) -> None:
    """The state dir is a file here (as root, mode bits deny nothing: an unreadable state dir
    is a StoreUnavailable of inspect.py, which main() reports and exits 1 on): `jobs list`
    says what is wrong and exits non-zero instead of "No jobs yet"."""
    blocked = tmp_path / "state"
    blocked.write_text("not a directory\n")
    env = {"AGENT_GATEWAY_PERSISTENCE__PATH": str(blocked / "jobs.db")}
    done = gateway(tmp_path, "jobs", "list", env=env)
    assert done.returncode != 0, (done.returncode, done.stdout, done.stderr)
    assert "No jobs yet" not in done.stdout
    assert "cannot be created" in done.stderr and "Traceback" not in done.stderr


def test_a_hint_names_the_command_as_it_runs_from_here_and_that_command_works(
        tmp_path: Path) -> None:
    """From a checkout `agent-cli-gateway` is no command on the user's PATH: the hints print
    the `uv run --directory <checkout>` form, and that line, run as printed, works."""
    done = gateway(tmp_path, "jobs", "show", "deadbeef")
    assert done.returncode != 0
    hinted = done.stderr.split("`")[1]  # "list recent ones with `<command> jobs list`"
    argv = shlex.split(hinted)
    assert argv[:4] == ["uv", "run", "--directory", str(REPO)], hinted
    assert argv[4:] == ["agent-cli-gateway", "jobs", "list"], hinted
    uv = shutil.which("uv")
    assert uv is not None, "uv runs the tests: it is on PATH"
    env = hermetic_env(tmp_path, {"PATH": os.pathsep.join([str(Path(uv).parent), "/usr/bin",
                                                            "/bin"])})
    ran = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=CLI_TIMEOUT_S * 3, check=False, stdin=subprocess.DEVNULL)
    assert ran.returncode == 0, ran.stderr
    assert "No jobs yet" in ran.stdout
