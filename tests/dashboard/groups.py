"""An attempt group for the dashboard tests: two attempts (fake claude and fake codex) on a
real git checkout, each writing notes.txt in its own worktree, and a real check that passes
only for claude's note, so the ranking is known: claude first, codex second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.jobs.attempts.admit import AttemptTarget, GroupRequest, submit_group
from gateway.runtime import Gateway
from gateway.store.attempts import GroupStatus
from tests.waiting import wait_for

GIT_ID = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
          "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
CHECK = ("import sys, pathlib\n"
         "sys.exit(0 if 'fake-claude' in pathlib.Path('notes.txt').read_text() else 1)\n")


def checkout(path: Path) -> Path:
    """A caller's repository: README.md and check.py, one commit."""
    path.mkdir()
    (path / "README.md").write_text("hello\n")
    (path / "check.py").write_text(CHECK)
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent), **GIT_ID})
    return path


async def finished_group(gateway: Gateway, repo: Path, interpreter: str = sys.executable,
                         ) -> tuple[str, dict[str, str]]:
    """Start the group, wait until the gateway has checked both attempts (group `done`);
    its id and its job ids by provider. `interpreter`: the check's argv[0] (the tests name
    this Python by its path: nothing from the host PATH)."""
    manager = await gateway.manager()
    submitted = await submit_group(manager, GroupRequest(
        prompt="edit notes @write=notes.txt", working_dir=str(repo),
        targets=[AttemptTarget("claude"), AttemptTarget("codex")],
        check=[interpreter, "check.py"], check_timeout_s=60))
    group_id = submitted.group.group_id

    async def done() -> bool:
        group = await manager.store.get_attempt_group(group_id)
        return group is not None and group.status is GroupStatus.DONE

    await wait_for(done, timeout=90)
    jobs = {}
    for job_id in submitted.job_ids:
        row = await manager.store.get_job(job_id, with_output=False)
        assert row is not None
        jobs[row.provider] = job_id
    return group_id, jobs
