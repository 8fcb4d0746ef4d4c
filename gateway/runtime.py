"""The running gateway: store + job manager + lease keeper, started and stopped as one.

Startup must be quick (MCP clients wait only seconds and restart servers freely): the MCP
front end answers `initialize` and `tools/list` at once while `start()` opens the store,
migrates it and registers the instance in the background; tools await `manager()`.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import TYPE_CHECKING

import structlog

from gateway import __version__, proc
from gateway.backoff import woken_or_after
from gateway.config import Settings
from gateway.fs import foreign_link_problem, shared_dir_problem
from gateway.model import ErrorKind, GatewayError, InstanceRow
from gateway.store import open_store

if TYPE_CHECKING:
    from gateway.jobs.attempts.coordinator import AttemptCoordinator
    from gateway.jobs.claims import CapabilityReader, Claimer
    from gateway.jobs.leases import LeaseKeeper
    from gateway.jobs.manager import JobManager
    from gateway.store.base import JobStore

log = structlog.get_logger(__name__)

STORE_OPEN_RETRY_S = 2.0  # a store that is down at startup is retried, never given up on
# How long a tool call waits for startup before answering `unavailable`: a first call of a
# session (gateway_status included) gets the real answer, not "not ready" (a SQLite open
# takes milliseconds; a PostgreSQL connect a few seconds at worst).
READY_WAIT_S = 10.0
STOP_OPEN_WAIT_S = 1.0  # part of the drain budget: an interrupted store open may finish


class Gateway:
    def __init__(self, settings: Settings, role: str = "stdio",
                 read_capabilities: CapabilityReader | None = None,
                 ) -> None:
        """`read_capabilities`: this gateway claims remote jobs (`agent-cli-gateway worker`,
        or `serve` with [worker] accept_remote on PostgreSQL): it publishes what it reads
        and claims the queued jobs of other hosts it meets."""
        self.settings = settings
        self.role = role
        self.read_capabilities = read_capabilities
        self.claimer: Claimer | None = None
        self.instance_id = str(uuid.uuid4())
        self.store: JobStore | None = None
        self._manager: JobManager | None = None
        self.leases: LeaseKeeper | None = None
        self.attempts: AttemptCoordinator | None = None
        self._ready = asyncio.Event()
        self._start_error: str | None = None
        self._failed = asyncio.Event()  # startup hit a permanent cause: no retry helps
        self._attempted = asyncio.Event()  # the first store open finished, either way
        self._start_task: asyncio.Task[None] | None = None
        self._open_task: asyncio.Task[JobStore] | None = None
        self._start_due = asyncio.Event()  # a deferred start may begin now

    def start_in_background(self, defer_s: float = 0.0) -> None:
        """Run `start()` in a task, after at most `defer_s`.

        Loading the job machinery and opening the store take tens of milliseconds of the one
        event loop, so a stdio server defers them until the client's handshake is answered:
        `start_soon()` (the server calls it once the tools are listed) or any caller of
        `manager()` lets the start begin earlier; `defer_s` bounds the wait for a client that
        does neither.
        """
        self._start_task = asyncio.create_task(self._start_when_due(defer_s),
                                               name="gateway_start")

    def start_soon(self, delay_s: float = 0.0) -> None:
        """Let a deferred start begin within `delay_s` (never later than it would have)."""
        if self._start_due.is_set():
            return
        if delay_s <= 0:
            self._start_due.set()
        else:
            asyncio.get_running_loop().call_later(delay_s, self._start_due.set)

    async def _start_when_due(self, defer_s: float) -> None:
        if defer_s > 0:
            await woken_or_after(self._start_due, defer_s)
        self._start_due.set()  # later start_soon() calls have nothing left to hurry
        await self.start()

    async def start(self) -> None:
        """Open the store (retrying while it is down), build the manager, register, loop."""
        # Imported here, not at the top: the job machinery (store driver, runner, psutil) is
        # not needed to answer `initialize` and `tools/list`, so it loads after them.
        from gateway.jobs.leases import LeaseKeeper  # deferred: start-up
        from gateway.jobs.manager import JobManager  # deferred: start-up

        if self._refuse_shared_state_dir():
            return
        while True:
            # Shielded: a stop() during startup must not abandon a half-open connection
            # (aiosqlite's thread would later call into a closed loop); stop() finishes it.
            self._open_task = asyncio.create_task(open_store(self.settings, self.role),
                                                  name="open_store")
            try:
                self.store = await asyncio.shield(self._open_task)
                break
            except Exception as exc:
                self._start_error = str(exc) or repr(exc)
                self._attempted.set()
                if getattr(exc, "permanent", False):
                    # Retrying cannot help (a path on a read-only filesystem, credentials refused, a newer
                    # schema): every tool says so, and what to fix, until a restart.
                    self._failed.set()
                    log.error("job store cannot be opened; not retrying", action="open_store",
                              error=self._start_error)
                    return
                log.warning("job store unavailable at startup; retrying", action="open_store",
                            error=self._start_error)
                await asyncio.sleep(STORE_OPEN_RETRY_S)
        self._start_error = None
        hostname, boot_id = proc.hostname(), proc.boot_id()
        identity = InstanceRow(
            instance_id=self.instance_id, hostname=hostname, boot_id=boot_id, pid=os.getpid(),
            pid_started_at=proc.process_start_time(os.getpid()), role=self.role,
            version=__version__)
        self._manager = JobManager(self.settings, self.store, self.instance_id, hostname, boot_id)
        if self.settings.persistence.backend != "memory":
            from gateway.jobs.finalizer import handoff  # deferred: start-up (see start())
            from gateway.jobs.run.runner import ZYGOTE  # deferred: start-up (see start())

            ZYGOTE.finalizer = handoff(self.settings)  # a run that outlives us is finalized
        self.leases = LeaseKeeper(self.settings, self.store, self._manager, identity,
                                  self._manager.spool_root)
        await self.leases.start()
        if self.read_capabilities is not None:
            from gateway.jobs.claims import Claimer  # deferred: start-up (see start())

            self.claimer = Claimer(self._manager, identity, self.read_capabilities)
            try:
                await self.claimer.refresh(force=True)  # published before the first claim
            except Exception as exc:
                log.warning("capabilities not published yet; the claim loop retries",
                            action="publish_capabilities", error=repr(exc))
            self.leases.run_loop("claimer", self.settings.worker.claim_poll_s,
                                 self.claimer.tick)

        from gateway.jobs.attempts.coordinator import AttemptCoordinator  # deferred: start-up

        # Attempt groups: each attempt's check, and the group's end (issue 39).
        self.attempts = AttemptCoordinator(self._manager, self.leases.adopter.owner_gone)
        self.attempts.start()
        self._ready.set()
        self._attempted.set()
        log.info("gateway ready", action="start", instance_id=self.instance_id,
                 backend=self.settings.persistence.backend, role=self.role)

    def _refuse_shared_state_dir(self) -> bool:
        """A state or spool dir other users can write (or do not own), or one reached
        through another user's link in a world-writable dir, is refused for good, before
        anything is made in it: its spool is what adoption trusts (issue 23, item 2; issue
        38, item 7). True if refused."""
        from gateway.jobs.run.spool import spool_root  # deferred: start-up (see start())

        state_dir = self.settings.state_dir
        problem = foreign_link_problem(spool_root(state_dir))  # the state dir's way too
        if problem is not None:
            problem = f"the state directory {state_dir} is not the gateway's own: {problem}"
        for directory in (state_dir, spool_root(state_dir)):
            if problem is None and (flaw := shared_dir_problem(directory)) is not None:
                problem = f"the state directory is not private ({flaw})"
        if problem is None:
            return False
        self._start_error = f"{problem}; the gateway does not start on it"
        self._failed.set()
        self._attempted.set()
        log.error("state directory not safe; not starting", action="start",
                  error=self._start_error)
        return True

    async def manager(self, wait_s: float = READY_WAIT_S) -> JobManager:
        """The job manager once the store is open (a deferred start begins at once);
        GatewayError(unavailable) if not in time."""
        self.start_soon()
        if not await self.wait_ready(wait_s):
            raise self.not_ready_error()
        assert self._manager is not None
        return self._manager

    def not_ready_error(self) -> GatewayError:
        """Why tools cannot run yet, saying whether it can pass by itself."""
        where = self.store_location()
        if self._failed.is_set():
            return GatewayError(ErrorKind.SETUP_ERROR,
                                f"The job store ({where}) cannot be opened, and this will not "
                                f"pass by itself: {self._start_error}. Fix it, then restart "
                                f"the gateway (reconnect the MCP server); "
                                f"`agent-cli-gateway doctor` checks the setup.")
        cause = (f"the last attempt failed: {self._start_error}; retrying every "
                 f"{STORE_OPEN_RETRY_S:g} s" if self._start_error else "it is still opening")
        return GatewayError(ErrorKind.UNAVAILABLE,
                            f"The gateway is still starting: the job store ({where}) is not "
                            f"open yet ({cause}). This can pass by itself: retry in a few "
                            f"seconds.")

    def store_location(self) -> str:
        """The store, fit to show a caller (never a DSN: it may hold a password)."""
        persistence = self.settings.persistence
        if persistence.backend == "sqlite":
            return f"sqlite {persistence.path}"
        return "postgres" if persistence.backend == "postgres" else "in memory"

    async def wait_ready(self, wait_s: float) -> bool:
        """Whether the gateway became ready within `wait_s`, without hurrying its start."""
        if not self._ready.is_set() and not self._failed.is_set():
            waits = [asyncio.ensure_future(self._ready.wait()),
                     asyncio.ensure_future(self._failed.wait())]
            try:
                await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        return self._ready.is_set()

    async def wait_settled(self, wait_s: float) -> bool:
        """Hurry the start and wait (bounded) until the first store open has succeeded or
        failed: a status report then says what really is, with the cause. True if ready."""
        self.start_soon()
        if not self._attempted.is_set():
            await woken_or_after(self._attempted, wait_s)
        return self._ready.is_set()

    def connection_report(self) -> dict[str, object]:
        """The store's connection pools (PostgreSQL: size, waits, refused connects) and the
        worst renewal wait of the last hour, for `gateway_status` (issues #22, #29)."""
        pool_stats = getattr(self.store, "pool_stats", None)
        worst = self.leases.renewal_pending_ms.worst() if self.leases is not None else None
        return {"pool": pool_stats() if callable(pool_stats) else None,
                "renewal_pending_ms_max_1h": round(worst, 1) if worst is not None else None}

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def current_manager(self) -> JobManager | None:
        """The manager if startup finished, without waiting (status reports, /healthz)."""
        return self._manager if self._ready.is_set() else None

    @property
    def failed(self) -> bool:
        """Startup gave up on a permanent cause (start_error says which)."""
        return self._failed.is_set()

    @property
    def start_error(self) -> str | None:
        """Why the store could not be opened yet, while startup keeps retrying."""
        return self._start_error

    async def _abandon_open(self) -> None:
        """Startup was interrupted: let an in-flight store open finish briefly, then close it."""
        task = self._open_task
        if task is None or self.store is not None:
            return
        done, _ = await asyncio.wait([task], timeout=STOP_OPEN_WAIT_S)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif task.exception() is None:
            await task.result().close()

    async def stop(self) -> None:
        """Leave as lease.on_shutdown says, within lease.drain_timeout_s, and close.

        "detach": the runs go on under their supervisors, their leases are extended, queued
        jobs are released and the instance is marked stopped (gateway/jobs/shutdown.py).
        "stop": drain (runs stopped, queued jobs failed), then mark the instance stopped. If
        draining does not finish in time the instance row is left as is, so its lease expires
        and other instances orphan what is left (never a false terminal state).
        """
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
            await asyncio.gather(self._start_task, return_exceptions=True)
            await self._abandon_open()
        manager, leases, store = self._manager, self.leases, self.store
        drained = True
        lease = self.settings.lease
        if self.attempts is not None:  # the checks run on (detach) or stop with the runs
            await self.attempts.stop(detach=lease.on_shutdown == "detach")
        if manager is not None and lease.on_shutdown == "detach":
            from gateway.jobs.shutdown import detach, finish_http  # deferred: start-up (see start())

            started = asyncio.get_running_loop().time()
            http_jobs = await detach(manager, lease.drain_timeout_s)
            if leases is not None:
                await leases.stop()
                await leases.mark_stopped()  # from here a gateway on this host may adopt
            elapsed = asyncio.get_running_loop().time() - started
            await finish_http(http_jobs, lease.drain_timeout_s - elapsed)
            leases = None
        elif manager is not None:
            drained = await manager.drain(lease.drain_timeout_s)
        if leases is not None:
            await leases.stop()
            if drained:
                await leases.mark_stopped()
            else:
                log.warning("drain timed out; leaving the lease to expire", action="drain")
        if manager is not None:
            from gateway.jobs.run.runner import ZYGOTE  # deferred: start-up (see start())

            # The spools of ended jobs go first: the zygote, at its EOF, starts a finalizer
            # for each run whose end record is still there, and one started for a run
            # settled here would only re-create its spool dir with its log (and find
            # nothing to do).
            await manager.remove_settled_spools()
            ZYGOTE.close()  # no run comes any more: it exits (its supervisors run on)
        if store is not None:
            try:
                await store.close()
            except Exception as exc:
                log.warning("store close failed", action="close", error=repr(exc))
