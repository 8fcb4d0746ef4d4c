"""`notifications/tasks`: the tasks extension's push, over `subscriptions/listen` (SEP-2663).

A client that wants to hear when its tasks change, instead of polling `tasks/get`, opens a
`subscriptions/listen` stream whose filter names them (`notifications.taskIds`). The SDK's
listen handler serves the core spec's change events and drops filter keys it does not know,
so this handler takes `subscriptions/listen` over:

- a filter without `taskIds` is served by the SDK's own handler, untouched;
- a filter with `taskIds` needs the extension in the request's own capabilities (-32021
  otherwise, as the spec says). The acknowledgement names the task ids honoured: those a
  `tasks/get` by this caller would resolve (an unknown, purged or foreign id is left out,
  never an error). Each honoured task's `DetailedTask` is sent at once (so a task that ended
  before the listen is not waited for forever: it is told that once) and again when it
  ends, exactly what
  `tasks/get` would answer at that moment. The core events the same filter asks for ride
  the same stream, as the SDK's handler would send them.

Nothing here is durable, as the spec intends (no replay: a client re-listens and refetches).
The watch of a task waits on the job as `llm_job_wait` does, so a task another gateway ends
is told too.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
import anyio.streams.memory
import structlog
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler, SubscriptionBus
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ServerEvent,
    event_matches,
    event_to_notification,
)
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    Notification,
    NotificationParams,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
)
from pydantic import ConfigDict

from gateway.mcp.server_state import ServerState
from gateway.mcp.task_state import detailed_task, load_task
from gateway.mcp.tasks import require_opt_in

log = structlog.get_logger(__name__)

MAX_TASK_IDS = 100  # per listen: a bound on the watches one request can start
MAX_TASK_STREAMS = 64  # task listens open at once per server
MAX_BUFFERED = 256  # frames queued on one stream before it is ended (a client not reading)
WATCH_STEP_S = 50.0  # one wait of a task's watch (re-armed while the job runs)


class TaskNotificationParams(NotificationParams):
    """A `Task` (flat fields) plus `_meta`: the SDK has no model of the extension's push."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class TaskNotification(Notification[TaskNotificationParams, Literal["notifications/tasks"]]):
    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: TaskNotificationParams


Frame = ServerEvent | TaskNotification


class TaskListenHandler:
    """`subscriptions/listen`, with the extension's `taskIds` (see the module docstring)."""

    def __init__(self, state: ServerState, bus: SubscriptionBus) -> None:
        self._state = state
        self._bus = bus
        self._core = ListenHandler(bus)
        self._open = 0

    async def __call__(self, ctx: ServerRequestContext[Any, Any],
                       params: SubscriptionsListenRequestParams) -> SubscriptionsListenResult:
        requested = requested_task_ids(params.notifications)
        if requested is None:
            return await self._core(ctx, params)
        require_opt_in(ctx)
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if self._open >= MAX_TASK_STREAMS:
            raise MCPError(INTERNAL_ERROR, f"{MAX_TASK_STREAMS} task listens are open on this "
                                           f"server; close one, or poll tasks/get.")
        self._open += 1
        try:
            return await self._serve(ctx, params.notifications, requested, subscription_id)
        finally:
            self._open -= 1

    async def _serve(self, ctx: ServerRequestContext[Any, Any], requested: SubscriptionFilter,
                     task_ids: list[str], subscription_id: Any) -> SubscriptionsListenResult:
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        honoured_ids = [task_id for task_id in task_ids if await self._resolves(task_id)]
        core = core_subset(requested)
        uris = frozenset(core.resource_subscriptions or ())
        send, recv = anyio.create_memory_object_stream[Frame](MAX_BUFFERED)

        def deliver(event: ServerEvent) -> None:
            if event_matches(core, uris, event):
                try:
                    send.send_nowait(event)
                except (anyio.ClosedResourceError, anyio.WouldBlock):
                    send.close()  # a client that stopped reading: end its stream

        # Subscribed before the ack, so an event published meanwhile is queued, not lost;
        # the ack is still the first frame, since only this task writes the stream.
        unsubscribe = self._bus.subscribe(deliver)
        try:
            honoured = SubscriptionFilter.model_validate(
                {**core.model_dump(by_alias=True, exclude_none=True), "taskIds": honoured_ids})
            await ctx.session.send_notification(
                SubscriptionsAcknowledgedNotification(
                    params=SubscriptionsAcknowledgedNotificationParams(notifications=honoured,
                                                                       _meta=meta)),
                related_request_id=subscription_id)
            async with anyio.create_task_group() as watches:
                for task_id in honoured_ids:
                    watches.start_soon(self._watch, task_id, send.clone(), meta)
                async for frame in recv:
                    notification = (frame if isinstance(frame, TaskNotification)
                                    else event_to_notification(frame, meta))
                    await ctx.session.send_notification(notification,  # type: ignore[arg-type]
                                                        related_request_id=subscription_id)
                watches.cancel_scope.cancel()
        finally:
            unsubscribe()
            send.close()
            recv.close()
        return SubscriptionsListenResult(_meta=meta)

    async def _resolves(self, task_id: str) -> bool:
        """Whether `tasks/get` by this caller would find the task (its authorization too)."""
        try:
            await load_task(self._state, task_id)
        except MCPError:
            return False
        return True

    async def _watch(self, task_id: str,
                     send: anyio.streams.memory.MemoryObjectSendStream[Frame],
                     meta: dict[str, Any]) -> None:
        """Send the task as it is now, then once more when it ends (once in all, if it had
        ended already). Best effort: a store
        that went away or a purged row ends the watch (the client can still poll)."""
        async with send:
            try:
                manager, row = await load_task(self._state, task_id)
                await send.send(_notification(await detailed_task(manager, row), meta))
                if not row.status.is_active:
                    return  # it had ended: that was its final state, told once
                row = await manager.reads.wait_end(task_id, WATCH_STEP_S, read=row,
                                                   stop=lambda: manager.closing)
                if not row.status.is_active:
                    await send.send(_notification(await detailed_task(manager, row), meta))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # the stream ended first
            except Exception as exc:  # the store is gone, the row purged: stop watching
                log.info("task watch ended", action="task_listen",
                                                    task_id=task_id, error=repr(exc))


def requested_task_ids(notifications: SubscriptionFilter) -> list[str] | None:
    """The filter's `taskIds` (an extension key the SDK's model keeps as an extra), or None
    when it names none; a malformed or oversized list is the caller's error."""
    raw = (notifications.model_extra or {}).get("taskIds")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise MCPError(INVALID_PARAMS, "notifications.taskIds must be a list of task id "
                                       "strings (the taskId of a CreateTaskResult).")
    if len(raw) > MAX_TASK_IDS:
        raise MCPError(INVALID_PARAMS, f"notifications.taskIds names {len(raw)} tasks; at most "
                                       f"{MAX_TASK_IDS} per listen: open another listen for "
                                       f"the rest.")
    return list(dict.fromkeys(raw))


def core_subset(requested: SubscriptionFilter) -> SubscriptionFilter:
    """The core events of `requested` this stream honours: every kind asked for (whether
    one ever fires depends on what is published), falsy flags dropped, as the SDK does."""
    return SubscriptionFilter(
        tools_list_changed=True if requested.tools_list_changed else None,
        prompts_list_changed=True if requested.prompts_list_changed else None,
        resources_list_changed=True if requested.resources_list_changed else None,
        resource_subscriptions=(list(requested.resource_subscriptions)
                                if requested.resource_subscriptions else None),
    )


def _notification(task: dict[str, Any], meta: dict[str, Any]) -> TaskNotification:
    return TaskNotification(params=TaskNotificationParams.model_validate({**task,
                                                                          "_meta": meta}))
