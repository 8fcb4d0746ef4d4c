"""What the tool calls and the two task layers (task_state.py, tasks_legacy.py) share, kept
apart from the tools themselves: the task layers are loaded with the server, before the
handshake, and the tools (their schemas, the job and worktree machinery behind them) only
at the first request that needs them (bench/README.md, first answer)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.jobs.manager import Submission

MAX_WAIT_S = 50.0  # llm_job_wait's bound: under the common 60 s client tool timeout


@dataclass(slots=True)
class TaskAdmission:
    """Set around a `<provider>_request` call that becomes an MCP task (task_state.py): the tool
    validates and admits exactly as a plain call, then hands the durable job over instead
    of waiting on it. One admission path, so a task and a sync call can never differ."""

    submission: Submission | None = None


TASK_ADMISSION: ContextVar[TaskAdmission | None] = ContextVar("task_admission", default=None)
