"""The previous release, built from this repository's own history, in a venv of its own.

`PREVIOUS_RELEASE` names its commit (0.1.0 is 009560b: a clone may not carry the tag). The
venv is built once per test session under the session's tmp: `git archive` of that commit,
`uv venv`, `uv pip install` with the versions this checkout's uv.lock pins (so the uv cache
answers offline when it can; else the registry is asked, as `uv sync` would). The `fleet`
fixture puts it beside this checkout on one store (fleet.py), SQLite then PostgreSQL.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import in_ci
from tests.upgrade.fleet import REPO, Fleet

PREVIOUS_RELEASE = (Path(__file__).parent / "PREVIOUS_RELEASE").read_text().split()[0]
BUILD_TIMEOUT_S = 300.0  # a cold install downloads ~30 wheels; a warm cache takes seconds


def _unavailable(message: str) -> None:
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _run(argv: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, timeout=BUILD_TIMEOUT_S,
                          check=False)


@pytest.fixture(scope="session")
def previous_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a venv holding the previous release (with its postgres extra)."""
    uv = shutil.which("uv")
    if uv is None:
        _unavailable("uv is not on PATH: the previous release cannot be installed")
    assert uv is not None
    root = tmp_path_factory.mktemp("previous-release")
    archive = _run(["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS_RELEASE])
    if archive.returncode != 0:
        _unavailable(f"commit {PREVIOUS_RELEASE} is not in this clone's history "
                     f"(fetch it: git fetch --unshallow): {archive.stderr.decode()[-300:]}")
    source = root / "src"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(source, filter="data")
    constraints = root / "constraints.txt"
    exported = _run([uv, "export", "--locked", "--no-hashes", "--no-emit-project",
                     "--all-extras", "--all-groups", "--quiet"])
    assert exported.returncode == 0, exported.stderr.decode()
    constraints.write_bytes(exported.stdout)
    venv = root / "venv"
    made = _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)])
    assert made.returncode == 0, made.stderr.decode()
    python = venv / "bin" / "python"
    install = [uv, "pip", "install", "--quiet", "--python", str(python), "-c", str(constraints),
               f"{source}[postgres]"]
    done = _run([*install, "--offline"])
    if done.returncode != 0:  # something is not in the uv cache: ask the registry
        done = _run(install)
    if done.returncode != 0:
        _unavailable(f"the previous release could not be installed: {done.stderr.decode()[-600:]}")
    return python


@pytest.fixture(params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path, previous_python: Path) -> Fleet:
    if request.param == "sqlite":
        persistence: dict[str, Any] = {"backend": "sqlite",
                                       "path": str(tmp_path / "state" / "jobs.db")}
    else:
        persistence = {"backend": "postgres", "dsn": request.getfixturevalue("postgres_dsn")}
    return Fleet(tmp_path, persistence, previous_python)
