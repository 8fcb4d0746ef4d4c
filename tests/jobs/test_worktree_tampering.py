"""A job cannot escape its worktree (#38): black-box findings of the outside review, each
reproduced by a fake CLI that does what the job did (`@script=`), through a real gateway on
a real store, real git and real supervisors.

- A `.git` file rewritten to name the checkout, the worktree swapped for a symlink to the
  checkout, HEAD moved to the user's branch: nothing is committed to the user's branch, the
  checkout (with its uncommitted edits) is untouched, the job says `tampered` and why.
- A record rewritten to name any directory, or git's admin file rewritten to list another
  path: neither `worktrees gc` nor the sweep removes anything outside the worktrees root.
- A filter or diff driver planted in the repository's config never runs in the gateway's
  own git calls (finalize, the next job's checkout, a diff).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from gateway import proc
from gateway.jobs.worktrees import changes, create
from gateway.jobs.worktrees.finish import worktree_of
from gateway.jobs.worktrees.gc import expire_worktrees
from gateway.jobs.worktrees.git import GitError, _run, git_env
from gateway.model import GatewayError, JobStatus
from tests.cli.cli_support import hermetic_env
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway
from tests.jobs.test_worktrees import branches, finished, git, isolated, repo
from tests.waiting import scaled, wait_until

pytestmark = pytest.mark.anyio
__all__ = ["repo"]  # the fixture, used by name


def script(tmp_path: Path, body: str) -> Path:
    """A job's own commands, as a Python file the fake CLI runs in its worktree."""
    path = tmp_path / f"job-{time.monotonic_ns()}.py"
    path.write_text("import os, shutil, subprocess, json\n" + textwrap.dedent(body))
    return path


def user_edits(repo: Path) -> str:
    """The user's uncommitted work in the checkout, which must stay exactly as it is."""
    (repo / "README.md").write_text("hello\nthe user's own edit, not committed\n")
    return git(repo, "status", "--porcelain")


def assert_checkout_untouched(repo: Path, status_before: str, main_before: str) -> None:
    assert git(repo, "rev-parse", "main") == main_before  # no commit on the user's branch
    assert git(repo, "log", "--format=%an", "main").splitlines() == ["t"]
    assert git(repo, "status", "--porcelain") == status_before
    assert "the user's own edit" in (repo / "README.md").read_text()


REWRITE_GIT_FILE = """
    with open(".git", "w") as fh:
        fh.write("gitdir: {checkout}/.git\\n")
    with open("new.txt", "w") as fh:
        fh.write("by the job\\n")
"""
SWAP_FOR_SYMLINK = """
    here = os.getcwd()
    os.chdir("/")
    shutil.rmtree(here)
    os.symlink("{checkout}", here)
"""
MOVE_HEAD = """
    admin = open(".git").read().split("gitdir: ", 1)[1].strip()
    with open(os.path.join(admin, "HEAD"), "w") as fh:
        fh.write("ref: refs/heads/main\\n")
    with open("new.txt", "w") as fh:
        fh.write("by the job\\n")
"""


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("tamper", [REWRITE_GIT_FILE, SWAP_FOR_SYMLINK, MOVE_HEAD],
                         ids=["git-file", "symlink", "head"])
async def test_a_tampered_worktree_is_never_committed_and_the_checkout_is_untouched(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path,
    tmp_path: Path, tamper: str
) -> None:
    status_before, main_before = user_edits(repo), git(repo, "rev-parse", "main")
    job = script(tmp_path, tamper.format(checkout=repo))
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", isolated(repo, f"escape @script={job}"))
    row = await finished(manager, sub.job.id)
    assert row.status is JobStatus.COMPLETED, row.error
    shown = worktree_of(row.request_json, row.result_json)
    assert shown is not None and shown["state"] == "tampered", shown
    assert shown["tampered"] and "not as the gateway made it" in shown["error"]
    assert shown["changed"] is None
    assert_checkout_untouched(repo, status_before, main_before)
    assert shown["branch"] in branches(repo)  # left for a person
    assert git(repo, "rev-parse", shown["branch"]) == shown["base_sha"]
    # Nothing more is done to it: apply and discard refuse, changing nothing.
    for act in (changes.apply, changes.discard):
        with pytest.raises(GatewayError, match="not as the gateway made it"):
            act(row, proc.hostname())
    assert_checkout_untouched(repo, status_before, main_before)
    assert repo.is_dir() and (repo / "src" / "app.py").is_file()


def victim_dir(tmp_path: Path) -> Path:
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "data.txt").write_text("keep me\n")
    return victim


def cli_config(tmp_path: Path, settings: Any) -> Path:
    config = tmp_path / "cli.toml"
    config.write_text(tomli_w.dumps({
        "persistence": {"backend": "sqlite", "path": str(settings.persistence.path)},
        "worktrees": {"root": str(create.worktree_root(settings)),
                      "retention_h": settings.worktrees.retention_h}}))
    return config


def cli(config: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args, "--config", str(config)],
                          env=hermetic_env(home), capture_output=True, text=True, timeout=scaled(120),
                          check=False, stdin=subprocess.DEVNULL)


REWRITE_RECORD = """
    record = os.getcwd() + ".json"
    data = json.load(open(record))
    data.update(path="{victim}", state="kept", ended_at=1)
    json.dump(data, open(record, "w"))
    open("new.txt", "w").write("by the job\\n")
"""
REWRITE_ADMIN_GITDIR = """
    admin = open(".git").read().split("gitdir: ", 1)[1].strip()
    open("new.txt", "w").write("by the job\\n")
    subprocess.run(["git", "add", "-A"], check=True)
    with open(os.path.join(admin, "gitdir"), "w") as fh:
        fh.write("{victim}/.git\\n")
"""


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("tamper", [REWRITE_RECORD, REWRITE_ADMIN_GITDIR],
                         ids=["record", "admin-gitdir"])
async def test_nothing_a_job_writes_makes_gc_remove_a_directory_outside_its_worktree(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path,
    tmp_path: Path, tamper: str
) -> None:
    victim = victim_dir(tmp_path)
    job = script(tmp_path, tamper.format(victim=victim))
    settings = make_settings(worktrees={"retention_h": 1})
    manager = await (await start_gateway(settings)).manager()
    sub = await manager.submit("claude", isolated(repo, f"escape @script={job}"))
    row = await finished(manager, sub.job.id)
    assert row.status is JobStatus.COMPLETED, row.error
    host, later = proc.hostname(), time.time() + 7200
    assert await expire_worktrees(settings, host, manager.store, now=later) == []
    assert (victim / "data.txt").read_text() == "keep me\n"
    # The operator's command, from the shell, on the same store: the same answer.
    config, home = cli_config(tmp_path, settings), tmp_path / "cli-home"
    home.mkdir()
    gc = cli(config, home, "worktrees", "gc", "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout) == {"removed": []}
    assert (victim / "data.txt").read_text() == "keep me\n"
    listed = cli(config, home, "worktrees", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert entry["state"] == "tampered", entry
    assert repo.is_dir() and git(repo, "rev-parse", "main")


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_an_honest_worktree_past_retention_is_still_removed_by_the_cli(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path,
    tmp_path: Path
) -> None:
    settings = make_settings(worktrees={"retention_h": 0.0001})
    manager = await (await start_gateway(settings)).manager()
    sub = await manager.submit("claude", isolated(repo, "keep @write=kept.txt"))
    row = await finished(manager, sub.job.id)
    shown = worktree_of(row.request_json, row.result_json)
    assert shown is not None and shown["state"] == "kept"
    config, home = cli_config(tmp_path, settings), tmp_path / "cli-home"
    home.mkdir()
    deadline = time.monotonic() + 30
    while True:  # retention is 0.36 s from the row's finished_at: a condition, with a bound
        gc = cli(config, home, "worktrees", "gc", "--json")
        assert gc.returncode == 0, gc.stderr
        if json.loads(gc.stdout)["removed"] or time.monotonic() > deadline:
            break
    assert json.loads(gc.stdout) == {"removed": [shown["path"]]}
    assert not os.path.lexists(shown["path"])
    assert git(repo, "rev-parse", shown["branch"]) == shown["head_sha"]


PLANT_FILTERS = """
    log = "{log}"
    for key, value in [
        ("filter.evil.clean", f"sh -c 'echo clean >> {{log}}; sleep 20; cat'"),
        ("filter.evil.smudge", f"sh -c 'echo smudge >> {{log}}; cat'"),
        ("filter.evil.process", f"sh -c 'echo process >> {{log}}; exit 1'"),
        ("filter.evil.required", "true"),
        ("diff.evil.textconv", f"sh -c 'echo textconv >> {{log}}; cat \\"$1\\"' --"),
        ("diff.evil.command", f"sh -c 'echo command >> {{log}}'"),
        ("diff.external", f"sh -c 'echo external >> {{log}}'"),
        ("core.pager", f"sh -c 'echo pager >> {{log}}; cat'"),
    ]:
        subprocess.run(["git", "config", key, value], check=True)
    common = subprocess.run(["git", "rev-parse", "--git-common-dir"], check=True,
                            capture_output=True, text=True).stdout.strip()
    os.makedirs(os.path.join(common, "info"), exist_ok=True)
    with open(os.path.join(common, "info", "attributes"), "w") as fh:
        fh.write("* filter=evil diff=evil\\n")
    with open(".gitattributes", "w") as fh:
        fh.write("*.txt filter=evil diff=evil\\n")
    for name in ("a.txt", "b.txt", "c.txt"):
        open(name, "w").write("by the job\\n")
"""


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_programs_a_job_plants_in_the_repository_config_never_run_in_gateway_git(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path,
    tmp_path: Path
) -> None:
    log = tmp_path / "planted.log"
    job = script(tmp_path, PLANT_FILTERS.format(log=log))
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", isolated(repo, f"plant @script={job}"))
    row = await finished(manager, sub.job.id)
    shown = worktree_of(row.request_json, row.result_json)
    assert shown is not None and shown["state"] == "kept", shown
    assert shown["files_changed"] == 4  # .gitattributes and the three files, committed
    # The next job's checkout (every file matches `* filter=evil` now), its finalize, and
    # the diffs of both.
    second = await manager.submit("claude", isolated(repo, "and again @write=d.txt"))
    row2 = await finished(manager, second.job.id)
    assert row2.status is JobStatus.COMPLETED, row2.error
    for done in (row, row2):
        for fmt in ("stat", "patch"):
            assert changes.diff(done, proc.hostname(), fmt).text
    assert not log.exists(), log.read_text()


def test_a_git_call_past_its_timeout_is_killed_with_everything_it_started(
    tmp_path: Path
) -> None:
    group = tmp_path / "group"
    child = ("import os, subprocess, sys, time\n"
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
             f"open({str(group)!r}, 'w').write(str(os.getpgid(0)))\n"
             "time.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(GitError, match="did not finish within"):
        _run([sys.executable, "-c", child], str(tmp_path), git_env(), None, 2.0, label="x")
    assert time.monotonic() - started < scaled(30)  # not the child's 60 s: git's 2 s bound held
    pgid = int(group.read_text())
    wait_until(lambda: not proc.group_alive(pgid), "the timed-out git's group to be gone")
