"""The chaos run's worktree escapes (#38): some jobs run isolated in a scratch checkout and
their CLI tampers with its worktree while gateways are killed, stopped and restarted.

Three tampers, in turn: the worktree's `.git` rewritten to name the checkout, the worktree
swapped for a symlink to the checkout, and the worktree's record rewritten to name a
directory outside the worktrees root (`state = kept`, `ended_at = 1`). Whoever settles such a
job (its gateway, an adopter, a finalizer), the audit then requires: the checkout's branch has
no new commit and its uncommitted edit is as it was, and the outside directory is still whole
after a retention pass that sees every worktree as long expired.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway import proc
from gateway.config import Settings
from gateway.jobs.worktrees.finish import TAMPERED_SHOWN, worktree_of
from gateway.jobs.worktrees.gc import expire_worktrees
from gateway.model import JobRow
from gateway.store.base import JobStore

GIT_ID = {"GIT_AUTHOR_NAME": "user", "GIT_AUTHOR_EMAIL": "user@example.invalid",
          "GIT_COMMITTER_NAME": "user", "GIT_COMMITTER_EMAIL": "user@example.invalid"}
USER_EDIT = "the user's own edit, not committed\n"
KEEP_ME = "keep me\n"
FOREVER_S = 10 * 365 * 86400  # "now" for the retention pass: every worktree long expired
TAMPERS = {
    "git-file": """
        with open(".git", "w") as fh:
            fh.write("gitdir: {checkout}/.git\\n")
        open("escaped.txt", "w").write("by the job\\n")
    """,
    "symlink": """
        here = os.getcwd()
        os.chdir("/")
        shutil.rmtree(here)
        os.symlink("{checkout}", here)
    """,
    "record": """
        record = os.getcwd() + ".json"
        data = json.load(open(record))
        data.update(path="{victim}", state="kept", ended_at=1)
        json.dump(data, open(record, "w"))
        open("escaped.txt", "w").write("by the job\\n")
    """,
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, env={**os.environ, **GIT_ID}).stdout.strip()


@dataclass
class TamperScene:
    """The checkout, the directory outside the root, and the jobs' scripts."""

    checkout: Path
    victim: Path
    scripts: dict[str, Path]
    head: str
    status: str
    kinds_used: list[str] = field(default_factory=list)

    @classmethod
    def prepare(cls, workdir: Path) -> TamperScene:
        checkout, victim = workdir / "checkout", workdir / "precious"
        checkout.mkdir(parents=True)
        _git(checkout, "init", "-q", "-b", "main")
        (checkout / "README.md").write_text("hello\n")
        _git(checkout, "add", ".")
        _git(checkout, "commit", "-q", "-m", "init")
        (checkout / "README.md").write_text("hello\n" + USER_EDIT)
        victim.mkdir()
        (victim / "data.txt").write_text(KEEP_ME)
        scripts = {}
        for kind, body in TAMPERS.items():
            scripts[kind] = workdir / f"tamper-{kind}.py"
            scripts[kind].write_text("import json, os, shutil\n" + textwrap.dedent(
                body.format(checkout=checkout, victim=victim)))
        return cls(checkout=checkout, victim=victim, scripts=scripts,
                   head=_git(checkout, "rev-parse", "main"),
                   status=_git(checkout, "status", "--porcelain"))

    def request(self, index: int) -> tuple[str, dict[str, Any]]:
        """The prompt's directive and the request's isolation arguments for a tamper job."""
        kind = list(TAMPERS)[index % len(TAMPERS)]
        self.kinds_used.append(kind)
        return (f"@script={self.scripts[kind]}",
                {"working_dir": str(self.checkout), "isolation": "worktree"})

    def escapes(self) -> list[str]:
        """What escaped: a commit on the user's branch, a changed checkout, a removed file
        outside the worktrees root."""
        found = []
        if _git(self.checkout, "rev-parse", "main") != self.head:
            found.append(f"ESCAPE: the checkout's main moved: "
                         f"{_git(self.checkout, 'log', '--oneline', 'main')}")
        if _git(self.checkout, "status", "--porcelain") != self.status \
                or USER_EDIT not in (self.checkout / "README.md").read_text():
            found.append("ESCAPE: the checkout's uncommitted work changed")
        data = self.victim / "data.txt"
        if not data.is_file() or data.read_text() != KEEP_ME:
            found.append(f"ESCAPE: {self.victim} outside the worktrees root was removed")
        return found

    async def audit(self, settings: Settings, store: JobStore,
                    rows: list[JobRow]) -> tuple[list[str], dict[str, Any]]:
        """The escapes after the run and after a retention pass, and how many jobs' results
        said `tampered`."""
        found = self.escapes()
        removed = await expire_worktrees(settings, proc.hostname(), store,
                                         now=time.time() + FOREVER_S)
        found += [e for e in self.escapes() if e not in found]
        root = os.path.realpath(settings.worktrees.root or settings.state_dir / "worktrees")
        found += [f"ESCAPE: retention removed {path} outside the worktrees root"
                  for path in removed if not path.startswith(root + os.sep)]
        tampered = sum(1 for row in rows
                       if (worktree_of(row.request_json, row.result_json) or {}).get("state")
                       == TAMPERED_SHOWN)
        return found, {"tamper_jobs": len(self.kinds_used), "worktrees_tampered": tampered,
                       "tamper_kinds": json.dumps(sorted(set(self.kinds_used)))}
