"""What bites real users on macOS (issue 21), checked on any POSIX system.

- Claude Desktop starts the gateway with the minimal PATH of a GUI app; a CLI that npm put
  into a user bin dir is a `#!/usr/bin/env node` script, and must still find `node`.
- APFS is case-insensitive by default: no two names the gateway makes in its state dir may
  differ only by case.
Real processes: a real gateway runs a fake node-script CLI through a fake `node`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gateway.jobs.requests import SubmitRequest
from gateway.model import JobStatus
from providers.registry import USER_BIN_DIRS, extended_path
from tests.jobs.conftest import FAKES_BIN, FakeLog, MakeSettings, StartGateway

pytestmark = pytest.mark.anyio

GUI_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"  # what a macOS GUI app starts its children with
DONE_S = 30.0
# The interpreter's name in the script's `#!/usr/bin/env` line. Not `node` itself: this
# host's /usr/bin may hold a real node (a Mac's does not), which would come first on the
# minimal PATH and shadow the stand-in; the lookup through the child's PATH is the same.
NODE = "node-standing-in-for-this-test"


def install_node_cli(bin_dir: Path) -> None:
    """A `node` (this Python, standing in) and a `claude` that is a `#!/usr/bin/env node`
    script in `bin_dir`, as `npm install -g` leaves them."""
    bin_dir.mkdir(parents=True)
    node = bin_dir / NODE
    node.write_text(f"#!/bin/sh\nexec {sys.executable!s} \"$@\"\n")
    cli = bin_dir / "claude"
    fake = FAKES_BIN / "claude"
    cli.write_text(f"#!/usr/bin/env {NODE}\nimport runpy, sys\n"
                   f"sys.argv[0] = {str(fake)!r}\nrunpy.run_path({str(fake)!r}, "
                   "run_name='__main__')\n")
    for path in (node, cli):
        path.chmod(0o755)


def test_the_user_bin_dirs_of_homebrew_and_npm_are_searched_after_a_minimal_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for directory in ("~/.npm-global/bin", "~/.local/bin"):
        Path(directory.replace("~", str(tmp_path))).mkdir(parents=True)
    searched = extended_path(GUI_PATH).split(os.pathsep)
    assert searched[:4] == GUI_PATH.split(":")
    assert str(tmp_path / ".npm-global" / "bin") in searched
    assert "/opt/homebrew/bin" in USER_BIN_DIRS and "~/.npm-global/bin" in USER_BIN_DIRS


@pytest.mark.parametrize("backend", ["sqlite"])  # the PATH does not depend on the store
@pytest.mark.parametrize("bin_dir", [".nvm/versions/node/v22.11.0/bin", ".npm-global/bin"])
async def test_a_node_script_cli_finds_node_when_the_gateway_has_the_minimal_path(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path, bin_dir: str,
) -> None:
    settings = make_settings(providers={"claude": {
        "command": "claude", "env": {"FAKE_CLI_LOG": str(fake_log.path)}}})
    install_node_cli(Path(os.environ["HOME"]) / bin_dir)  # make_settings' HOME
    monkeypatch.setenv("PATH", GUI_PATH)
    manager = await (await start_gateway(settings)).manager()
    sub = await manager.submit("claude", SubmitRequest(prompt="hello from a GUI client"))
    row = await manager.reads.wait(sub.job.id, DONE_S)
    assert row.status is JobStatus.COMPLETED, (row.error, row.stderr_tail)
    page = await manager.reads.read_result(sub.job.id)
    assert page.output == "fake-claude answer: hello from a GUI client"


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_no_two_names_in_the_state_dir_differ_only_by_case(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog,
) -> None:
    settings = make_settings()
    manager = await (await start_gateway(settings)).manager()
    for n in range(3):
        sub = await manager.submit("claude", SubmitRequest(prompt=f"case {n}"))
        assert (await manager.reads.wait(sub.job.id, DONE_S)).status is JobStatus.COMPLETED
        assert sub.job.id == sub.job.id.lower()  # minted ids: lower-case hex
    state = settings.persistence.path.parent
    names = [path.relative_to(state).as_posix() for path in state.rglob("*")]
    assert names, "nothing was spooled"
    assert len({name.casefold() for name in names}) == len(names)
    assert all(name == name.lower() for name in names if "/" in name), names
