"""The MCP stdio transport's ends: stdin read so that a signal can end serving, and both
ends on the event loop, with no thread hop per message.

The SDK reads stdin with `anyio.wrap_file`: each line is a worker-thread `readline()` that
a cancellation cannot interrupt, and anyio's worker threads are not daemons. After SIGTERM
the server would drain and then hang until the client wrote another line or closed stdin
(an MCP client that sends SIGTERM has usually stopped doing either). `LoopStdin` reads a
pipe or socket through an asyncio read transport (a request wakes the loop itself, not a
thread that then wakes the loop: on a 2-core box each such hop cost about a tenth of a
millisecond of a short request); anything else (a terminal, a file) through one daemon
thread's blocking reads. Awaiting the next line is an ordinary, cancellable queue read,
and a thread still blocked at exit does not keep the process alive.

Like the SDK's own claim, fd 0 is pointed at /dev/null while serving (children and stray
reads see EOF) and the protocol is read from a private duplicate.

The SDK writes stdout with `anyio.wrap_file` too: a worker-thread hop for each write and
another for each flush, two per answer, which on a 2-core box cost about as much CPU as the
rest of a short job's answer (bench/README.md, the cost rows). `LoopStdout` writes through
an asyncio pipe transport instead: the bytes go to the pipe at once when it has room (it
nearly always has) and wait on the loop when the client reads slowly. fd 1 points at
stderr while serving, as with the SDK's claim, so stray writes never reach the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
from collections.abc import Callable
from typing import BinaryIO

import structlog

log = structlog.get_logger(__name__)


class LoopStdin:
    """An async iterator of protocol lines (str) from the process's stdin, ending at EOF.
    Open with `await open()`; `restore()` when serving ends."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._split = _Lines(self._lines.put_nowait)
        # A private descriptor for the wire; fd 0 itself now reads /dev/null.
        # os.dup: close-on-exec, and above 0-2 while they are open (no fcntl import: this
        # module must load where the gateway only says it cannot run, native Windows).
        self._private_fd = os.dup(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(devnull, 0)
        finally:
            os.close(devnull)
        self._transport: asyncio.ReadTransport | None = None

    async def open(self) -> None:
        """Read on the loop when the wire is a pipe or socket (what an MCP client gives):
        each request then wakes the loop, not a thread that wakes the loop. Anything else (a
        terminal, whose non-blocking flag its shell shares; a regular file) gets a daemon
        thread's blocking reads."""
        if stat.S_ISFIFO(mode := os.fstat(self._private_fd).st_mode) or stat.S_ISSOCK(mode):
            wire = os.fdopen(os.dup(self._private_fd), "rb", buffering=0)  # the transport's
            self._transport, _ = await self._loop.connect_read_pipe(
                lambda: _LineProtocol(self._split), wire)
            return
        # closefd=False: the thread may still be blocked on it when serving ends.
        threading.Thread(target=self._pump, name="mcp-stdin", daemon=True,
                         args=(os.fdopen(self._private_fd, "rb", buffering=0, closefd=False),)
                         ).start()

    def _pump(self, wire: BinaryIO) -> None:
        """Thread body: read until EOF or a read error, then signal the end."""
        split = _Lines(self._deliver)
        try:
            while chunk := wire.read(65536):
                split.feed(chunk)
        except OSError as exc:
            log.warning("stdin read failed; treating it as end of input", action="stdin",
                        error=str(exc))
        split.end()

    def _deliver(self, line: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            self._loop.call_soon_threadsafe(self._lines.put_nowait, line)

    def __aiter__(self) -> LoopStdin:
        return self

    async def __anext__(self) -> str:
        line = await self._lines.get()
        if line is None:
            self._lines.put_nowait(None)  # EOF stays EOF for any later reader
            raise StopAsyncIteration
        return line

    def restore(self) -> None:
        """Stop reading and point fd 0 back at the wire, blocking again (the private fd stays
        open for a thread that may still be blocked on it)."""
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
        with contextlib.suppress(OSError):
            os.set_blocking(self._private_fd, True)  # the transport's dup shared the flag
            os.dup2(self._private_fd, 0)


class _Lines:
    """Bytes in, whole protocol lines out (`deliver(line)`), then `deliver(None)` at the end."""

    def __init__(self, deliver: Callable[[str | None], None]) -> None:
        self._deliver = deliver
        self._pending = b""
        self._ended = False

    def feed(self, chunk: bytes) -> None:
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            self._deliver(line.decode("utf-8", errors="replace") + "\n")

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._pending:
            self._deliver(self._pending.decode("utf-8", errors="replace"))
        self._deliver(None)


class _LineProtocol(asyncio.Protocol):
    def __init__(self, split: _Lines) -> None:
        self._split = split

    def data_received(self, data: bytes) -> None:
        self._split.feed(data)

    def eof_received(self) -> bool:
        self._split.end()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.warning("stdin read failed; treating it as end of input", action="stdin",
                        error=str(exc))
        self._split.end()


class LoopStdout:
    """The protocol's output: `await write(text)` then `await flush()`, as the SDK's stdio
    server calls them, on the event loop with no thread. Open with `await open()`, end with
    `close()`."""

    def __init__(self) -> None:
        # A private descriptor for the wire; fd 1 itself writes to stderr while serving.
        self._private_fd = os.dup(1)
        os.dup2(2, 1)
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        wire = os.fdopen(os.dup(self._private_fd), "wb", buffering=0)  # the transport's own
        try:
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, wire)
        except ValueError:  # a regular file, not a pipe: blocking writes are fine there
            wire.close()
            return
        # Buffer nothing silently: flush() waits until every byte is in the pipe.
        transport.set_write_buffer_limits(high=0)
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def write(self, text: str) -> None:
        data = text.encode("utf-8")
        if self._writer is not None:
            self._writer.write(data)
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self._private_fd, view):]

    async def flush(self) -> None:
        if self._writer is not None:
            await self._writer.drain()

    def close(self) -> None:
        """Close the transport and point fd 1 back at the wire (blocking again). Never waits:
        it runs in the drain after SIGTERM, and every flush() already waited for its bytes,
        so what is left is at most an answer a client that stopped reading never takes."""
        writer, self._writer = self._writer, None
        # Closed already when the wire is a socket whose peer shut it down (the transport
        # watches a socket for that): aborting it again raised.
        if writer is not None and not writer.transport.is_closing():
            writer.transport.abort()
        with contextlib.suppress(OSError):
            os.set_blocking(self._private_fd, True)  # the transport's dup shared the flag
            os.dup2(self._private_fd, 1)
            os.close(self._private_fd)
