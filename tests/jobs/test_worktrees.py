"""A git worktree per job (issue #27): real git repositories in tmp dirs, real gateways on a
real store, real supervisors and fake CLIs that edit files in their cwd (`@write=`).

The invariant above all: an isolated job's CLI never runs in the caller's checkout, whatever
fails while its worktree is made.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from gateway import proc
from gateway.jobs import manager as manager_module
from gateway.jobs.requests import SubmitRequest
from gateway.jobs.worktrees import changes, create, records
from gateway.jobs.worktrees.finish import worktree_of
from gateway.jobs.worktrees.gc import expire_worktrees, list_worktrees
from gateway.model import ErrorKind, GatewayError, JobStatus
from tests.children import Children
from tests.jobs.conftest import FakeLog, MakeSettings, StartGateway
from tests.jobs.test_detach import start_owner
from tests.waiting import scaled, wait_for

pytestmark = pytest.mark.anyio

DONE_S = 30.0  # a bound on any job of these tests reaching its end (8 at once on 2 cores)
GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
          "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **GIT_ID})
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A caller's checkout: two tracked files, one ignored .env, one commit."""
    path = tmp_path / "checkout"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("hello\n")
    (path / "src").mkdir()
    (path / "src" / "app.py").write_text("print('app')\n")
    (path / ".gitignore").write_text(".env\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "init")
    (path / ".env").write_text("TOKEN=local\n")
    return path


def isolated(repo: Path, prompt: str, **more: Any) -> SubmitRequest:
    return SubmitRequest(prompt=prompt, working_dir=str(repo), isolation="worktree",
                         force_refresh=True, **more)


def spawns_in(fake_log: FakeLog, directory: Path) -> int:
    """CLI starts whose cwd is in `directory` (the caller's checkout)."""
    root = os.path.realpath(directory)
    return sum(1 for s in fake_log.spawns()
               if os.path.realpath(s["cwd"]) == root
               or os.path.realpath(s["cwd"]).startswith(root + os.sep))


def branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--format=%(refname:short)").split()


async def finished(manager: Any, job_id: str) -> Any:
    with anyio.fail_after(scaled(DONE_S)):
        row = await manager.reads.wait(job_id, DONE_S)
    assert row.status.is_terminal, row.status
    return row


async def test_an_isolated_job_runs_in_its_own_worktree_and_its_changes_are_committed(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path
) -> None:
    manager = await (await start_gateway(make_settings(worktrees={"copy": [".env"]}))).manager()
    sub = await manager.submit("claude", isolated(repo, "edit @write=README.md,src/new.py"))
    row = await finished(manager, sub.job.id)
    assert row.status is JobStatus.COMPLETED, row.error
    (spawn,) = fake_log.spawns()
    shown = worktree_of(row.request_json, row.result_json)
    assert shown is not None and shown["changed"] is True and shown["state"] == "kept"
    assert os.path.realpath(spawn["cwd"]) == os.path.realpath(shown["path"])
    assert spawns_in(fake_log, repo) == 0
    assert (shown["files_changed"], shown["insertions"]) == (2, 2)
    assert git(repo, "rev-parse", shown["branch"]) == shown["head_sha"]
    assert git(repo, "rev-parse", f"{shown['head_sha']}^") == shown["base_sha"]
    assert "agent-cli-gateway job " + row.id in git(repo, "log", "-1", "--format=%an",
                                                    shown["branch"])
    assert git(repo, "status", "--porcelain") == ""  # the caller's checkout is untouched
    assert (Path(shown["path"]) / ".env").read_text() == "TOKEN=local\n"  # seeded
    # .env was ignored in the worktree too: never committed
    assert ".env" not in git(repo, "show", "--name-only", "--format=", shown["branch"])
    assert shown["branch"].startswith("agent-gateway/")


async def test_a_job_that_changed_nothing_leaves_no_worktree_and_no_branch(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", isolated(repo, "only read"))
    row = await finished(manager, sub.job.id)
    t_end = time.monotonic()
    shown = worktree_of(row.request_json, row.result_json)
    assert row.status is JobStatus.COMPLETED and shown is not None
    assert shown["changed"] is False and shown.get("removed") is True
    assert time.monotonic() - t_end < 5
    assert (shown["state"], shown["path"]) == ("removed", None)
    plan = create.plan_of(row.request_json)
    assert plan is not None and not Path(plan.path).exists()
    assert branches(repo) == ["main"]
    assert len(git(repo, "worktree", "list", "--porcelain").split("\n\n")) == 1


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_eight_isolated_jobs_at_once_all_complete_each_in_its_own_worktree(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    subs = [await manager.submit("claude", isolated(repo, f"job {n} @write=f{n}.txt"))
            for n in range(8)]
    rows = [await finished(manager, s.job.id) for s in subs]
    assert [r.status for r in rows] == [JobStatus.COMPLETED] * 8, [r.error for r in rows]
    cwds = {os.path.realpath(s["cwd"]) for s in fake_log.spawns()}
    assert len(cwds) == 8 and spawns_in(fake_log, repo) == 0
    for n, row in enumerate(rows):
        shown = worktree_of(row.request_json, row.result_json)
        assert shown is not None and shown["files_changed"] == 1
        files = git(repo, "show", "--name-only", "--format=", shown["branch"])
        assert files == f"f{n}.txt"


def fixed_job_id(monkeypatch: pytest.MonkeyPatch) -> str:
    """The next job the manager admits gets this id (so a test can prepare its path)."""
    job_id = str(uuid.uuid4())
    monkeypatch.setattr(manager_module, "uuid", SimpleNamespace(uuid4=lambda: job_id))
    return job_id


def planned(settings: Any, repo: Path, job_id: str) -> create.WorktreePlan:
    found = create.inspect_repository(str(repo), None)
    return create.plan_worktree(settings, found, None, job_id, "test")


@pytest.fixture
def full_fs(tmp_path: Path) -> Any:
    mount = tmp_path / "full-fs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount)],
                   check=True)
    try:
        with pytest.raises(OSError), (mount / "filler").open("wb") as fh:  # ENOSPC
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("fault", ["path_exists", "branch_exists", "lock_held", "disk_full"])
async def test_a_worktree_that_cannot_be_made_fails_the_job_and_starts_no_cli(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, fault: str, request: pytest.FixtureRequest
) -> None:
    sections: dict[str, Any] = {}
    if fault == "disk_full":
        sections["worktrees"] = {"root": str(request.getfixturevalue("full_fs") / "wt")}
    settings = make_settings(**sections)
    manager = await (await start_gateway(settings)).manager()
    job_id = fixed_job_id(monkeypatch)
    plan = planned(settings, repo, job_id)
    held = None
    if fault == "path_exists":
        Path(plan.path).mkdir(parents=True)
        (Path(plan.path) / "mine.txt").write_text("not the gateway's\n")
    elif fault == "branch_exists":
        git(repo, "branch", plan.branch)
    elif fault == "lock_held":
        monkeypatch.setattr(create, "LOCK_WAIT_S", 0.5)
        held = os.open(Path(plan.common_dir) / create.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(held, fcntl.LOCK_EX)
    try:
        sub = await manager.submit("claude", isolated(repo, "edit @write=README.md"))
        row = await finished(manager, sub.job.id)
    finally:
        if held is not None:
            os.close(held)
    assert row.status is JobStatus.FAILED and row.error_kind == ErrorKind.WORKTREE_ERROR
    assert fake_log.spawns() == []  # no CLI at all, least of all in the checkout
    assert git(repo, "status", "--porcelain") == ""
    if fault == "path_exists":  # what was there is still there, untouched
        assert (Path(plan.path) / "mine.txt").read_text() == "not the gateway's\n"
        assert plan.branch not in branches(repo)
    elif fault == "branch_exists":
        assert plan.branch in branches(repo) and not Path(plan.path).exists()
    else:  # the failed attempt removed what it made
        assert plan.branch not in branches(repo) and not Path(plan.path).exists()


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_request_that_cannot_be_isolated_is_refused_and_nothing_runs(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path, tmp_path: Path
) -> None:
    manager = await (await start_gateway(make_settings())).manager()
    plain_dir = tmp_path / "not-a-repo"
    plain_dir.mkdir()
    cases = [isolated(plain_dir, "x"), isolated(repo, "x", base_ref="no-such-branch"),
             isolated(repo, "x", base_ref="--output=/tmp/x"),
             SubmitRequest(prompt="x", working_dir=str(repo), base_ref="main")]
    for case in cases:
        with pytest.raises(GatewayError) as caught:
            await manager.submit("claude", case)
        assert caught.value.kind == ErrorKind.INVALID_INPUT, caught.value.message
    assert await manager.reads.list_jobs() == [] and fake_log.spawns() == []


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_base_ref_chooses_the_commit_the_worktree_starts_from(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path
) -> None:
    first = git(repo, "rev-parse", "HEAD")
    (repo / "later.txt").write_text("later\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "later")
    manager = await (await start_gateway(make_settings())).manager()
    sub = await manager.submit("claude", isolated(repo, "@write=x.txt", base_ref=first[:10]))
    row = await finished(manager, sub.job.id)
    shown = worktree_of(row.request_json, row.result_json)
    assert shown is not None and shown["base_sha"] == first
    assert git(repo, "show", "--name-only", "--format=", shown["branch"]) == "x.txt"


async def test_changes_are_diffable_appliable_and_discardable(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path
) -> None:
    settings = make_settings()
    manager = await (await start_gateway(settings)).manager()
    one = await manager.submit("claude", isolated(repo, "one @write=README.md,new.txt"))
    two = await manager.submit("claude", isolated(repo, "two @write=src/app.py"))
    row_one, row_two = await finished(manager, one.job.id), await finished(manager, two.job.id)
    host = proc.hostname()
    stat = changes.diff(row_one, host, "stat")
    assert "README.md" in stat.text and "new.txt" in stat.text
    patch = changes.diff(row_one, host, "patch", max_bytes=40)
    assert patch.next_offset == 40 or patch.next_offset is not None
    whole = changes.diff(row_one, host, "patch").text
    assert "+written by fake-claude" in whole
    # the checkout has a change to a file job one changed: refused, nothing changes
    (repo / "README.md").write_text("mine\n")
    with pytest.raises(GatewayError) as caught:
        changes.apply(row_one, host)
    assert "README.md" in caught.value.message
    assert (repo / "README.md").read_text() == "mine\n" and not (repo / "new.txt").exists()
    git(repo, "checkout", "--", "README.md")
    done = changes.apply(row_one, host)
    assert sorted(done["files"]) == ["README.md", "new.txt"]
    assert "written by fake-claude" in (repo / "README.md").read_text()
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], text=True,
                            capture_output=True, check=True).stdout.splitlines()
    assert set(status) == {" M README.md", "?? new.txt"}  # uncommitted, nothing staged
    applied = worktree_of(row_one.request_json, row_one.result_json)
    assert applied is not None and applied["branch"] not in branches(repo)
    assert (applied["state"], applied["path"]) == ("applied", None)  # #27: not as if still there
    discarded = changes.discard(row_two, host)
    shown = worktree_of(row_two.request_json, row_two.result_json)
    assert discarded["discarded"] and shown is not None
    assert (shown["state"], shown["path"]) == ("discarded", None)
    plan_two = create.plan_of(row_two.request_json)
    assert plan_two is not None and not Path(plan_two.path).exists()
    assert shown["branch"] not in branches(repo)
    assert list_worktrees(settings, host) == []  # tombstones are not worktrees
    for done_row, why in ((row_one, "applied already"), (row_two, "discarded already")):
        with pytest.raises(GatewayError) as again:
            changes.discard(done_row, host)
        assert why in again.value.message
    with pytest.raises(GatewayError):  # another host's worktree is never touched
        changes.discard(row_one, "another-host")


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_after_retention_the_directory_is_gone_and_the_branch_keeps_the_commit(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path
) -> None:
    settings = make_settings(worktrees={"retention_h": 1})
    manager = await (await start_gateway(settings)).manager()
    sub = await manager.submit("claude", isolated(repo, "keep @write=kept.txt"))
    row = await finished(manager, sub.job.id)
    shown = worktree_of(row.request_json, row.result_json)
    assert shown is not None and Path(shown["path"]).is_dir()
    host = proc.hostname()
    store = manager.store
    assert await expire_worktrees(settings, host, store, now=time.time() + 1800) == []
    assert await expire_worktrees(settings, "another-host", store,
                                  now=time.time() + 7200) == []
    assert await expire_worktrees(settings, host, store,
                                  now=time.time() + 3601) == [shown["path"]]
    assert not Path(shown["path"]).exists()
    assert git(repo, "rev-parse", shown["branch"]) == shown["head_sha"]
    (entry,) = list_worktrees(settings, host)
    assert entry.record.state == records.BRANCH_ONLY and not entry.present
    expired = worktree_of(row.request_json, row.result_json)
    assert expired is not None and (expired["state"], expired["path"]) == ("expired", None)
    assert "kept.txt" in changes.diff(row, host, "stat").text  # still diffable


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_the_quota_refuses_a_new_isolated_job_naming_what_can_be_reclaimed(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path
) -> None:
    manager = await (await start_gateway(make_settings(worktrees={"max_per_repo": 1}))).manager()
    sub = await manager.submit("claude", isolated(repo, "keep @write=a.txt"))
    await finished(manager, sub.job.id)
    with pytest.raises(GatewayError) as caught:
        await manager.submit("claude", isolated(repo, "another"))
    assert caught.value.kind == ErrorKind.WORKTREE_ERROR and sub.job.id in caught.value.message
    assert len(fake_log.spawns()) == 1


async def test_a_sigkilled_gateways_isolated_run_is_adopted_and_its_worktree_committed(
    make_settings: MakeSettings, start_gateway: StartGateway, fake_log: FakeLog, repo: Path, tmp_path: Path,
    children: Children,
) -> None:
    settings = make_settings()
    peer = await (await start_gateway(settings)).manager()
    owner, job_id = start_owner(settings, tmp_path, json.dumps({
        "prompt": "outlive my owner @sleep=1.5 @write=survived.txt", "working_dir": str(repo),
        "isolation": "worktree", "force_refresh": True}), children)
    await wait_for(lambda: len(fake_log.spawns()) == 1, 20)
    owner.kill()
    owner.wait()
    await wait_for(lambda: job_id in peer.local_job_ids(), 20)
    row = await finished(peer, job_id)
    assert row.status is JobStatus.COMPLETED and row.owner_instance == peer.instance_id
    shown = worktree_of(row.request_json, row.result_json)
    assert shown is not None and shown["changed"] is True and shown["files_changed"] == 1
    (spawn,) = fake_log.spawns()
    assert os.path.realpath(spawn["cwd"]) == os.path.realpath(shown["path"])
    assert git(repo, "show", "--name-only", "--format=", shown["branch"]) == "survived.txt"
    assert git(repo, "status", "--porcelain") == ""
