"""A gateway in a process of its own, for tests that SIGKILL the owner of a job.

Usage: python -m tests.jobs.owner_gateway SETTINGS_PICKLE PROVIDER PROMPT [HOSTNAME]
Starts a gateway with those settings, submits PROMPT to PROVIDER (unless PROMPT is "-"; a
JSON object is the whole SubmitRequest),
prints `JOB <id>` (or `READY`) on stdout and waits to be killed. With
OWNER_GATEWAY_NO_FINALIZER set, its runs start no finalizer when they end. With HOSTNAME (root, in a
UTS namespace of its own: `unshare -u`) it first renames its host: a gateway on another host.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
import sys
from pathlib import Path

from gateway.jobs.requests import SubmitRequest
from gateway.runtime import Gateway

NO_FINALIZER_ENV = "OWNER_GATEWAY_NO_FINALIZER"  # set: its supervisors start no finalizer


async def main(settings_path: str, provider: str, prompt: str) -> None:
    settings = pickle.loads(Path(settings_path).read_bytes())  # written by the test itself
    gateway = Gateway(settings)
    await gateway.start()
    if os.environ.get(NO_FINALIZER_ENV):
        from gateway.jobs.run.runner import ZYGOTE

        ZYGOTE.finalizer = None  # as a gateway of the previous release: no finalizer
    manager = await gateway.manager()
    if prompt == "-":
        sys.stdout.write("READY\n")
    else:
        # A JSON object is a whole request (an isolated one, say); anything else the prompt.
        request = (SubmitRequest(**json.loads(prompt)) if prompt.startswith("{")
                   else SubmitRequest(prompt=prompt))
        submission = await manager.submit(provider, request)
        sys.stdout.write(f"JOB {submission.job.id}\n")  # after any log lines structlog printed
    sys.stdout.flush()
    await asyncio.Event().wait()


if __name__ == "__main__":
    if len(sys.argv) > 4:
        socket.sethostname(sys.argv[4])  # only inside its own UTS namespace
    asyncio.run(main(*sys.argv[1:4]))
