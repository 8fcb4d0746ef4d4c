"""What a run's terminal write becomes when the job store's disk is full (issue 15, item 7).

Retrying the same write cannot succeed, and before this the manager retried it forever: the
run never ended, its spool (usually on the same full filesystem) was never freed, heartbeats
failed too, admission went off, and after a restart the gateway still could not register.
So the write is made smaller, step by step, until it fits: first the output cut to
`FULL_STORE_KEPT_BYTES` (the run ends `failed` with `output_limit`, `truncated`, and a message
that says why), then no output at all. Once nothing is left to drop, the job's spool files
are deleted to make room (the row then needs none of them) and the small write is retried.
"""

from __future__ import annotations

import codecs
import dataclasses
from pathlib import Path

from gateway.model import EXIT_CODES, Completion, ErrorKind, JobStatus, OutputFile

# The part of the output a completion keeps when the full output does not fit: what a
# progress flush shows of a running job, so it fits wherever those flushes did.
FULL_STORE_KEPT_BYTES = 64 * 1024
# A parsed result larger than this is dropped with the output (a `text` answer can be as
# large as the output; `text_span` or usage alone are small).
FULL_STORE_KEPT_RESULT_BYTES = 4 * 1024


def fitted_completion(original: Completion, attempt: int, reason: str,
                      state_dir: Path) -> Completion | None:
    """The terminal write to try after the store refused `attempt` writes of `original`
    for a full disk (`reason`: the store's last error): attempt 1 keeps the first
    FULL_STORE_KEPT_BYTES of the output, attempt 2 none of it. None when nothing is left to
    drop (then the caller frees the job's spool and retries the last, smallest write).

    A run that completed or failed becomes failed/output_limit; a timed-out or cancelled
    one keeps its status and kind, with the reason added to its error.
    """
    size = _size(original.output)
    steps = ([FULL_STORE_KEPT_BYTES] if size > FULL_STORE_KEPT_BYTES else []) + [0]
    if original.result_json is None and size == 0:
        steps = []
    if attempt > len(steps):
        return None
    keep = steps[attempt - 1]
    output = _prefix(original.output, keep) if keep else ""
    kept = len(output.encode("utf-8"))
    result = original.result_json
    if not keep or (result is not None and len(result) > FULL_STORE_KEPT_RESULT_BYTES):
        result = None
    note = (f"The job store's disk is full ({reason}): the output ({original.output_bytes} "
            f"bytes) did not fit, so {kept} bytes of it were kept (output truncated). Free "
            f"disk space (the state directory {state_dir}, or the PostgreSQL server's) and "
            f"rerun the request.")
    status, kind, exit_code = original.status, original.error_kind, original.exit_code
    if status in (JobStatus.COMPLETED, JobStatus.FAILED):
        status, kind, exit_code = (JobStatus.FAILED, ErrorKind.OUTPUT_LIMIT,
                                   EXIT_CODES[ErrorKind.OUTPUT_LIMIT])
        error = note
    else:
        error = f"{original.error}\n{note}" if original.error else note
    return dataclasses.replace(
        original, status=status, error_kind=kind, error=error, exit_code=exit_code,
        output=output, output_bytes=kept, truncated=True, result_json=result)


def _size(output: str | OutputFile | None) -> int:
    if isinstance(output, OutputFile):
        return output.size
    return len(output.encode("utf-8")) if output else 0


def _prefix(output: str | OutputFile | None, limit: int) -> str:
    """The first `limit` bytes of the output at most, cut at a character boundary (an
    output file that cannot be read gives nothing)."""
    if isinstance(output, OutputFile):
        try:
            with output.path.open("rb") as fh:
                data = fh.read(min(limit, output.size))
        except OSError:
            return ""
    else:
        data = (output or "").encode("utf-8")[:limit]
    # The output is valid UTF-8: only the cut can split a character; that part is dropped.
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)
