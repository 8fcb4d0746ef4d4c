"""A gateway in a process of its own, for tests that SIGKILL the owner of a job.

Usage: python -m tests.jobs.owner_gateway SETTINGS_PICKLE PROVIDER PROMPT
Starts a gateway with those settings, submits PROMPT to PROVIDER, prints `JOB <id>` on
stdout and waits to be killed.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
from pathlib import Path

from gateway.jobs.requests import SubmitRequest
from gateway.runtime import Gateway


async def main(settings_path: str, provider: str, prompt: str) -> None:
    settings = pickle.loads(Path(settings_path).read_bytes())  # written by the test itself
    gateway = Gateway(settings)
    await gateway.start()
    manager = await gateway.manager()
    submission = await manager.submit(provider, SubmitRequest(prompt=prompt))
    sys.stdout.write(f"JOB {submission.job.id}\n")  # after any log lines structlog printed
    sys.stdout.flush()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
