"""A job's CLI cannot read its gateway's secrets (issue 23, item 3), on Linux.

The CLI runs as the gateway's user, so without more it could walk up to the gateway and read
its environment from /proc/<pid>/environ: the HTTP bearer token, the DSN, PGPASSWORD, API
keys. The gateway and its supervisors are non-dumpable (prctl PR_SET_DUMPABLE 0) and the
settings it has read leave its environment. Real processes; as root the parent and child run
as `nobody` (root may read anything, which proves nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest
from mcp import Client, StdioServerParameters

from gateway import platform
from tests.waiting import scaled, wait_until

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cret-token-that-no-child-may-read"
NOBODY = 65534
DEADLINE_S = 30.0

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the linux implementation's own facts")

# The parent: holds SECRET in its environment, optionally goes non-dumpable, then starts a
# child of the same user that tries to read the parent's environment, as a CLI would.
PARENT = textwrap.dedent("""
    import os, subprocess, sys
    sys.path.insert(0, sys.argv[2])
    from gateway.platform import linux
    if sys.argv[1] == "protect":
        assert linux.make_non_dumpable()
    reader = subprocess.run(["cat", f"/proc/{os.getpid()}/environ"], capture_output=True)
    print(reader.returncode, reader.stdout, reader.stderr)
""")


def as_user() -> list[str]:
    """The argv prefix that runs a command as an unprivileged user (nothing when not root)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: cannot run the reader as an unprivileged user")
    prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", f"import sys; sys.path.insert(0, "
                            f"{str(REPO)!r}); import gateway"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this interpreter or checkout is not readable by an unprivileged user")
    return prefix


@pytest.mark.parametrize("mode", ["protect", "control"])
def test_a_child_cannot_read_the_environment_of_a_non_dumpable_parent(mode: str) -> None:
    out = subprocess.run([*as_user(), sys.executable, "-c", PARENT, mode, str(REPO)],
                         capture_output=True, text=True, timeout=scaled(DEADLINE_S),
                         env={"SECRET_FOR_TEST": SECRET, "PATH": os.defpath}, check=True)
    if mode == "protect":
        assert SECRET not in out.stdout and "Permission denied" in out.stdout, out
    else:  # the control: the same child reads it from a dumpable parent
        assert SECRET in out.stdout, out


@pytest.fixture
def private_home() -> Iterator[Path]:
    """A home the unprivileged user may write (pytest's tmp_path is root's own)."""
    home = Path(tempfile.mkdtemp(prefix="gateway-nondumpable-"))
    if os.geteuid() == 0:
        os.chown(home, NOBODY, NOBODY)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def gateway_process(home: Path) -> psutil.Process:
    def found() -> psutil.Process | None:
        for process in psutil.process_iter(["cmdline", "cwd"]):
            if process.info["cwd"] == str(home) and "gateway" in (process.info["cmdline"] or []):
                return process
        return None

    process: psutil.Process = wait_until(found, "the gateway process", timeout=DEADLINE_S)
    return process


@pytest.mark.anyio
@pytest.mark.usefixtures("platform_impl")
async def test_a_serving_gateway_holds_its_token_where_no_child_can_read_it(
        private_home: Path, platform_impl: str) -> None:
    env = {"HOME": str(private_home), "PATH": os.defpath, "PYTHONPATH": str(REPO),
           "AGENT_GATEWAY_HTTP__AUTH_TOKEN": SECRET,
           "AGENT_GATEWAY_PLATFORM": platform_impl}
    prefix = as_user()
    command, *args = [*prefix, sys.executable, "-m", "gateway"]
    assert isinstance(command, str)
    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(private_home))
    with anyio.fail_after(scaled(DEADLINE_S)):
        async with Client(params, mode="legacy", read_timeout_seconds=DEADLINE_S) as client:
            status = (await client.call_tool("gateway_status", {})).structured_content
            gateway = gateway_process(private_home)
            environ = Path(f"/proc/{gateway.pid}/environ")
            try:
                data = environ.read_bytes()
            except PermissionError:
                data = None  # not root: refused outright, which is the point
            owner = environ.stat().st_uid
            uid = gateway.uids().real
    assert status is not None and status["platform"]["implementation"] == platform_impl
    if data is not None:
        assert SECRET.encode() not in data  # gone from the environment the OS shows
    if platform_impl == platform.LINUX and prefix:
        # Non-dumpable: its /proc files belong to root although it runs as nobody.
        assert (uid, owner) == (NOBODY, 0)
