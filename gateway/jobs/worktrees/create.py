"""Making a job's worktree: planned at admission, created and verified before the CLI starts.

A failure anywhere here is a `WorktreeError`: the job ends `failed` (`worktree_error`) and its
CLI never starts, least of all in the caller's checkout (peers fell back to it and edits
landed on the user's branch: claude-code #56225, #94045). Creation holds an OS file lock in
the repository's common dir, so gateways on this host never race on git's own locks (parallel
`git worktree add` lost `.git/config.lock` races: claude-code #47266, #34645; `--no-track`
writes no config at all); it retries only when another git held a lock, and each failed attempt
removes what it made, never anything that was there before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog

from gateway import proc
from gateway.backoff import Backoff
from gateway.config import Settings
from gateway.fs import ensure_private_dir
from gateway.jobs.requests import WORKTREE_KEY, stored_fields
from gateway.jobs.worktrees import records
from gateway.jobs.worktrees.git import GitError, GitPlace, git, git_text, repository
from gateway.jobs.worktrees.verify import admin_dir, place_of, real_directory, tampering
from gateway.model import ErrorKind, GatewayError

log = structlog.get_logger(__name__)

LOCK_NAME = "agent-cli-gateway.lock"  # in the repository's common dir: one per repository
LOCK_WAIT_S = 60.0  # how long a creation waits for another one on the same repository
LOCK_POLL_S = 0.05
CREATE_ATTEMPTS = 3  # tries of `git worktree add` + checkout while another git holds a lock
LOCK_RETRY = Backoff(first_s=0.25)  # after a git lock error: 0.25 s, doubled after each one
JOB_PREFIX_CHARS = 8  # of the job id: the worktree's directory and branch name
# Parallel checkout (git >= 2.32; an older git ignores the key), one worker per core, for
# trees over git's own threshold (100 files). A 10k-file checkout on this 2-core box under
# load took a median 6.3 s with it against 19.0 s for a plain `git worktree add` (1 worker);
# more workers than cores were slower. Entries that need a filter (LFS) stay sequential, and
# nothing of the hardening (no hooks, no submodules, no LFS smudge) changes.
PARALLEL_CHECKOUT = ("-c", "checkout.workers=0")
REPO_KEY_CHARS = 12  # of sha256(real path of the common dir)


class WorktreeError(Exception):
    """The worktree could not be made or checked: the job fails, nothing runs."""


@dataclass(slots=True)
class Repository:
    toplevel: str
    common_dir: str
    subdir: str  # working_dir relative to toplevel ("" at the top)
    base_sha: str


@dataclass(slots=True)
class WorktreePlan:
    """Where a job's worktree goes and what it is made from: stored in its request_json."""

    path: str
    branch: str
    base_ref: str
    base_sha: str
    common_dir: str
    toplevel: str
    subdir: str
    job_id: str
    instance: str  # the gateway instance that admitted the job (named in the git lock)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> WorktreePlan | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{k: str(data[k]) for k in cls.__dataclass_fields__})
        except KeyError:
            return None

    @property
    def cwd(self) -> Path:
        """Where the CLI runs: working_dir's place inside the worktree."""
        return Path(self.path) / self.subdir if self.subdir else Path(self.path)


def _invalid(message: str) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_INPUT, message)


def inspect_repository(working_dir: str, base_ref: str | None) -> Repository:
    """The repository working_dir is in and base_ref's commit. Raises GatewayError
    (invalid_input) when there is none or the ref names no commit: nothing runs."""
    ref = base_ref if base_ref is not None else "HEAD"
    if not ref or ref.startswith("-") or any(c in ref for c in "\x00\n\r"):
        raise _invalid(f"base_ref {ref[:100]!r} is not a git ref: pass a branch, tag or commit "
                       f"(default HEAD).")
    try:
        lines = git_text(["rev-parse", "--path-format=absolute", "--show-toplevel",
                          "--git-common-dir", "--show-prefix"], working_dir).splitlines()
    except GitError as err:
        raise _invalid(f"isolation = \"worktree\" needs working_dir inside a git repository "
                       f"(with a work tree); {working_dir!r} is not one ({err.stderr[:200] or err.message}). "
                       f"Pass a directory of a git checkout, or isolation = \"none\".") from None
    toplevel, common_dir = lines[0], lines[1]
    subdir = lines[2].rstrip("/") if len(lines) > 2 else ""
    try:
        sha = git_text(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], toplevel)
    except GitError:
        sha = ""
    if not sha:
        raise _invalid(f"base_ref {ref!r} names no commit in the repository of {working_dir!r}. "
                       f"Pass an existing branch, tag or commit (omit it for HEAD).")
    return Repository(toplevel=toplevel, common_dir=os.path.realpath(common_dir),
                      subdir=subdir, base_sha=sha)


def worktree_root(settings: Settings) -> Path:
    """The root of every worktree of this host, at its real location: a plan's path is
    real, so a symlink put on its way later is seen (verify.py)."""
    return Path(os.path.realpath(settings.worktrees.root or settings.state_dir / "worktrees"))


def repo_key(common_dir: str) -> str:
    return hashlib.sha256(os.path.realpath(common_dir).encode()).hexdigest()[:REPO_KEY_CHARS]


def plan_of(request_json: str | None) -> WorktreePlan | None:
    """The worktree an isolated job was planned at admission (None: not isolated)."""
    return WorktreePlan.from_dict(stored_fields(request_json).get(WORKTREE_KEY))


def plan_for(settings: Settings, repo: Repository | None, base_ref: str | None,
             job_id: str, instance: str) -> WorktreePlan | None:
    """An isolated request's plan (None: the request is not isolated)."""
    return None if repo is None else plan_worktree(settings, repo, base_ref, job_id, instance)


def plan_worktree(settings: Settings, repo: Repository, base_ref: str | None,
                  job_id: str, instance: str) -> WorktreePlan:
    """The job's path and branch, refused when the branch name is not valid or the
    repository has max_per_repo worktrees (GatewayError, nothing stored)."""
    config = settings.worktrees
    short = job_id.replace("-", "")[:JOB_PREFIX_CHARS]
    try:
        branch = git_text(["check-ref-format", "--branch", config.branch_prefix + short],
                          repository(repo.common_dir))
    except GitError:
        raise GatewayError(ErrorKind.SETUP_ERROR, f"[worktrees] branch_prefix "
                           f"{config.branch_prefix!r} does not make a valid branch name "
                           f"(git check-ref-format --branch); fix it in the gateway "
                           f"config.") from None
    repo_dir = worktree_root(settings) / repo_key(repo.common_dir)
    present = [r for r in records.repo_records(repo_dir) if r.state in records.ON_DISK_STATES]
    if len(present) >= config.max_per_repo:
        reclaim = [r for r in present if r.state == records.KEPT]
        listed = "; ".join(f"job {r.job_id} ({r.branch})" for r in reclaim[:10]) or "none yet"
        raise GatewayError(ErrorKind.WORKTREE_ERROR, (
            f"The repository {repo.toplevel!r} has {len(present)} gateway worktrees, "
            f"[worktrees] max_per_repo = {config.max_per_repo}. Reclaimable (finished, with "
            f"changes): {listed}. Apply or discard them (llm_job_changes, or "
            f"`agent-cli-gateway jobs discard <id>`), or wait for running jobs to end."))
    return WorktreePlan(path=str(repo_dir / short), branch=branch,
                        base_ref=base_ref or "HEAD", base_sha=repo.base_sha,
                        common_dir=repo.common_dir, toplevel=repo.toplevel, subdir=repo.subdir,
                        job_id=job_id, instance=instance)


@contextlib.contextmanager
def repository_lock(common_dir: str, wait_s: float | None = None) -> Iterator[None]:
    """An exclusive flock on `<common dir>/agent-cli-gateway.lock`: every gateway process of
    this host (and any git wrapper that honours it) serializes its worktree changes there.
    Raises WorktreeError after `wait_s` (LOCK_WAIT_S)."""
    import fcntl  # deferred: platform (native Windows lacks fcntl: the module must import)

    limit = LOCK_WAIT_S if wait_s is None else wait_s
    try:
        fd = os.open(Path(common_dir) / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise WorktreeError(f"cannot open the repository lock in {common_dir!r}: "
                            f"{exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise WorktreeError(
                        f"another process held {LOCK_NAME} in {common_dir!r} for over "
                        f"{limit:g} s; retry when it is done.") from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock


@dataclass(slots=True)
class Owner:
    job_id: str
    host: str
    instance: str


def create_worktree(settings: Settings, plan: WorktreePlan, owner: Owner | None = None) -> Path:
    """Make, verify, seed and lock the job's worktree; return the CLI's working dir.
    Raises WorktreeError having removed whatever it made."""
    owner = owner or Owner(plan.job_id, proc.hostname(), plan.instance)
    path = Path(plan.path)
    try:
        ensure_private_dir(path.parent)
    except OSError as exc:
        raise WorktreeError(f"cannot create {str(path.parent)!r}: {exc.strerror or exc}") from None
    with repository_lock(plan.common_dir):
        _clear_own_leftovers(plan, owner)
        if os.path.lexists(path):
            raise WorktreeError(f"{plan.path!r} exists already and is not this job's; it is "
                                f"never reused nor deleted. Remove it if it is stale.")
        _free_admin_dir(plan)
        if _branch_exists(plan):
            raise WorktreeError(f"branch {plan.branch!r} exists already; a branch the gateway "
                                f"did not make for this job is never reused nor deleted.")
        record = records.WorktreeRecord(
            job_id=owner.job_id, host=owner.host, instance=owner.instance, path=plan.path,
            branch=plan.branch, base_sha=plan.base_sha, common_dir=plan.common_dir,
            toplevel=plan.toplevel)
        try:
            record.save()
        except OSError as exc:
            raise WorktreeError(f"cannot write the worktree's record: "
                                f"{exc.strerror or exc}") from None
        for attempt in range(1, CREATE_ATTEMPTS + 1):
            try:
                _add_and_check_out(settings, plan)
                break
            except (GitError, OSError) as exc:
                remove_made(plan)
                locked = isinstance(exc, GitError) and exc.lock_error
                if not locked or attempt == CREATE_ATTEMPTS:
                    record.delete()
                    raise WorktreeError(_why(exc)) from None
                log.warning("worktree creation met a git lock; retrying", action="worktree_add",
                            job_id=owner.job_id, attempt=attempt)
                time.sleep(LOCK_RETRY.wait(attempt))
        try:
            _verify(plan)
            seed_files(settings.worktrees.copy_files, Path(plan.toplevel), path)
            git(["worktree", "lock", "--reason", lock_reason(owner), plan.path],
                repository(plan.common_dir))
            if not plan.cwd.is_dir():
                raise WorktreeError(f"working_dir's place {plan.subdir!r} is not in the commit "
                                    f"{plan.base_sha[:12]} (not tracked there).")
            record.state = records.RUNNING
            record.save()
        except (GitError, OSError, WorktreeError) as exc:
            remove_made(plan)
            record.delete()
            raise exc if isinstance(exc, WorktreeError) else WorktreeError(_why(exc)) from None
    log.info("worktree created", action="worktree_create", job_id=owner.job_id,
             path=plan.path, branch=plan.branch, base_sha=plan.base_sha)
    return plan.cwd


def lock_reason(owner: Owner) -> str:
    return (f"agent-cli-gateway job={owner.job_id} host={owner.host} "
            f"instance={owner.instance} pid={os.getpid()}")


def _why(exc: BaseException) -> str:
    if isinstance(exc, GitError):
        return exc.message
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}" + (f": {exc.filename!r}" if exc.filename else "")
    return str(exc)


def _add_and_check_out(settings: Settings, plan: WorktreePlan) -> None:
    git(["worktree", "add", "--no-checkout", "--no-track", "-b", plan.branch, plan.path,
         plan.base_sha], repository(plan.common_dir))
    if real_directory(admin_dir(plan)) is not None:
        raise WorktreeError(f"git did not make the worktree's admin dir {admin_dir(plan)!r} "
                            f"(another worktree of that name?)")
    lfs = settings.worktrees.lfs
    env = {} if lfs else {"GIT_LFS_SKIP_SMUDGE": "1"}
    git([*PARALLEL_CHECKOUT, "checkout", "--force", "--quiet"], place_of(plan), env=env,
        lfs=lfs)


def _free_admin_dir(plan: WorktreePlan) -> None:
    """The admin dir git will make for the worktree is free: a stale entry of a worktree
    whose directory is gone is pruned; anything else there is refused (git would pick
    another name, and every later call names the admin dir by the path's last part)."""
    if not os.path.lexists(admin_dir(plan)):
        return
    git_quiet(["worktree", "prune"], repository(plan.common_dir))
    if os.path.lexists(admin_dir(plan)):
        raise WorktreeError(f"git's admin dir {admin_dir(plan)!r} is taken by another "
                            f"worktree; remove it (`git worktree remove`) or retry.")


def _branch_exists(plan: WorktreePlan) -> bool:
    try:
        git(["show-ref", "--verify", "--quiet", f"refs/heads/{plan.branch}"],
            repository(plan.common_dir))
    except GitError as err:
        if err.stderr:  # not "no such ref" (exit 1, silent) but git failing
            raise WorktreeError(err.message) from None
        return False
    return True


def _verify(plan: WorktreePlan) -> None:
    """The directory is the worktree we made (verify.py's checks, the same as before a
    commit or a removal), its HEAD at base_sha. Anything else: WorktreeError."""
    problems = tampering(plan)
    if not problems:
        head = git_text(["rev-parse", "--verify", "HEAD"], place_of(plan))
        if head != plan.base_sha:
            problems.append(f"its HEAD is {head}, not {plan.base_sha}")
    if problems:
        raise WorktreeError(f"the new worktree at {plan.path!r} is not what was made "
                            f"({'; '.join(problems)}); nothing runs there.")


def _clear_own_leftovers(plan: WorktreePlan, owner: Owner) -> None:
    """An earlier attempt of this same job (a gateway killed before its CLI started, the job
    then re-queued) left its worktree: it is this job's, so it goes; nothing else does."""
    record = records.read_record(Path(plan.path))
    if record is None or record.job_id != owner.job_id or record.host != owner.host:
        return
    remove_made(plan)
    record.delete()


def git_quiet(args: list[str], where: GitPlace) -> bool:
    """A clean-up step that may find nothing to do."""
    try:
        git(args, where)
    except GitError:
        return False
    return True


def remove_made(plan: WorktreePlan) -> None:
    """Undo a creation that did not finish (the job's CLI never ran there; the repository
    lock is held): whatever is at the path is this attempt's. A symlink is unlinked, never
    followed."""
    if os.path.islink(plan.path):
        with contextlib.suppress(OSError):
            os.unlink(plan.path)
    _drop(plan, branch=True)


def remove_worktree(plan: WorktreePlan, branch: bool = True) -> None:
    """Remove a worktree a job ran in (directory and git's metadata) and, with `branch`,
    its branch: only what verify.py finds as the gateway made it; a tampered one raises
    WorktreeError and nothing is removed. What is already gone is fine."""
    if os.path.lexists(plan.path):
        problems = tampering(plan)
        if problems:
            raise WorktreeError(f"the worktree of job {plan.job_id} was tampered with, so it "
                                f"is left for a person: {'; '.join(problems)}")
    _drop(plan, branch)


def _drop(plan: WorktreePlan, branch: bool) -> None:
    """Directory (never through a symlink: rmtree refuses one, and walks by file
    descriptors), then git's metadata, then the branch."""
    repo = repository(plan.common_dir)
    git_quiet(["worktree", "unlock", plan.path], repo)
    if os.path.lexists(plan.path) and real_directory(plan.path) is None:
        shutil.rmtree(plan.path, ignore_errors=True)
    git_quiet(["worktree", "prune"], repo)
    if branch:
        git_quiet(["branch", "-D", "--", plan.branch], repo)


def seed_files(names: list[str], source: Path, worktree: Path) -> list[str]:
    """Copy `[worktrees] copy` files from the checkout into the new worktree: regular files
    only, never through a symlink (on either side), never over a file that is there. Returns
    what was copied."""
    copied = []
    for name in names:
        src, dst = source / name, worktree / name
        if not _plain_path(source, Path(name)) or os.path.lexists(dst):
            continue
        try:
            info = os.lstat(src)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or not _plain_path(worktree, Path(name).parent):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, stat.S_IMODE(info.st_mode))
            with os.fdopen(fd_out, "wb") as out, os.fdopen(fd_in, "rb", closefd=False) as inp:
                shutil.copyfileobj(inp, out)
        finally:
            os.close(fd_in)
        copied.append(name)
    return copied


def _plain_path(base: Path, relative: Path) -> bool:
    """No component of base/relative below base is a symlink (a missing one is fine)."""
    current = base
    for part in relative.parts:
        current = current / part
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return False
        except FileNotFoundError:
            return True
        except OSError:
            return False
    return True
