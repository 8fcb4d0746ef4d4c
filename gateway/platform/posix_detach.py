"""Detaching a process, the same on every POSIX system: the one home of what linux.py and
portable.py both export as `detach_kwargs` and `fork_detached`, and of `fork_session`,
with which a run's zygote (gateway/jobs/run/zygote.py) forks each supervisor.

Self-contained and stdlib only, like them: a supervisor imports the implementations as
top-level modules (`python -I -S`, no gateway package), and they import this one the same way.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def detach_kwargs() -> dict[str, Any]:
    """Popen arguments for a process that outlives this one: setsid() in the child, so it
    has a session and process group of its own (pgid == pid), away from our terminal's
    signals and from any stop sent to our group."""
    return {"start_new_session": True}


def fork_session() -> int:
    """Fork a child that leaves this session (setsid) before anything else: 0 in the child,
    which must end with os._exit (it shares our buffers), the child's pid in the parent, once
    the child leads a session and process group of its own (pgid == pid), so the parent may
    signal that group at once. Raises OSError when the fork fails."""
    left_read, left_write = os.pipe()
    try:
        child = os.fork()
    except OSError:
        os.close(left_read)
        os.close(left_write)
        raise
    if child == 0:
        os.close(left_read)
        os.setsid()
        os.close(left_write)  # EOF: the parent may go on
        return 0
    os.close(left_write)
    try:
        os.read(left_read, 1)  # EOF once the child has left our session, or died
    finally:
        os.close(left_read)
    return child


def fork_detached() -> bool:
    """Fork (fork_session); True in the child, False in the parent. A supervisor forks this
    way right before it exits, and its gateway, seeing it gone, kills whatever is still in
    the run's group (a child not yet scheduled on a busy box would be): so the parent goes
    only once the child has left that group."""
    return fork_session() == 0
