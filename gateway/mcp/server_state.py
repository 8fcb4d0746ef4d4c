"""`ServerState`: what every tool of one MCP server shares.

Its own module so the tool modules (tools.py, job_tools.py, task_state.py, tasks*.py) and
the server that builds it depend on one small type instead of on each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.mcp.job_watch import JobWatches
from gateway.mcp.principal import LOCAL
from gateway.model import ErrorKind, GatewayError
from gateway.versions import CliVersions

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.jobs.manager import JobManager
    from gateway.jobs.reads import JobReads
    from gateway.runtime import Gateway


class ServerState:
    """What the tools share: the settings, the running gateway (set by the lifespan) and
    the background-probed CLI versions."""

    def __init__(self, settings: Settings, role: str, setup_error: str | None = None) -> None:
        self.settings = settings
        self.role = role
        # The configuration could not be loaded: the server still answers (a client that
        # sees only "connection closed" tells the user nothing), and every tool says this.
        self.setup_error = setup_error
        self.gateway: Gateway | None = None
        self.versions: CliVersions = CliVersions(settings)
        # Re-check which provider CLIs are installed; True if the tool list changed.
        self.recheck_tools: Callable[[], Awaitable[bool]] | None = None
        self.listed_providers: tuple[str, ...] = ()  # whose request tools are listed
        # Who this server's callers are (principal.py): "local" unless an HTTP gateway with
        # a token sets its own (http.py).
        self.principal = LOCAL
        # Sessions told when the job they submitted ends (job_watch.py).
        self.watches = JobWatches()

    async def manager(self) -> JobManager:
        """The job manager; GatewayError(unavailable) while starting or shutting down,
        (setup_error) when the setup is broken in a way no retry fixes."""
        if self.setup_error is not None:
            raise GatewayError(ErrorKind.SETUP_ERROR, self.setup_error)
        gateway = self.gateway
        if gateway is None:
            raise GatewayError(ErrorKind.UNAVAILABLE,
                               "The gateway is not running (it is starting or shutting "
                               "down). Retry in a few seconds.")
        return await gateway.manager()

    async def reads(self) -> JobReads:
        """The read side of the job path (any gateway's job: its row, the list, a wait, a
        page of output); the same errors as `manager()` while it is not up."""
        return (await self.manager()).reads

    def ready_manager(self) -> JobManager | None:
        """The manager if the gateway is already up, without waiting (status reports)."""
        gateway = self.gateway
        return gateway.current_manager if gateway is not None else None
