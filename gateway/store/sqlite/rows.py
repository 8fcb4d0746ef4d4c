"""The SQLite backend's rows and the work it runs on the connection's thread.

Moved out of the executor (`store.py`) whole (the executor keeps connections, locking and
the store's methods): converting `sqlite3.Row`s into the gateway's rows (REAL epoch seconds become
timezone-aware UTC datetimes), one write transaction, one admission's writes (a job and
its reservations), and reading or writing a large output in place as a blob. Every function
that takes a `sqlite3.Connection` runs on aiosqlite's thread
(`aiosqlite_fence.on_connection_thread`), the one thread that may use it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any, TypeVar

from gateway.model import InstanceRow, JobRow, NewJob, OutputFile
from gateway.store.base import (
    AdoptionCandidate,
    DuplicateActiveJob,
    JobsPage,
    answer_in,
    page_bounds,
    page_of,
    without_output,
)
from gateway.store.owner_columns import owner_fields
from gateway.store.sqlite import usage as sqlite_usage
from gateway.store.sqlite.sql import (
    _INSTANCE_TIME_FIELDS,
    _JOB_TIME_FIELDS,
    FIND_ACTIVE_BY_KEY,
    INSERT_JOB,
    JOB_ROWID,
    READ_OUTPUT_SOURCE,
)

T = TypeVar("T")


def _utc(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _job(row: sqlite3.Row) -> JobRow:
    data = {name: row[name] for name in row.keys()}  # noqa: SIM118 - a Row iterates values
    for name in _JOB_TIME_FIELDS:
        if name in data:  # a narrow read (the reaper's) has some columns only
            data[name] = _utc(data[name])
    if isinstance(data.get("output"), bytes):  # a large output, written in place as a blob
        data["output"] = data["output"].decode("utf-8", errors="replace")
    return JobRow.from_mapping(data)


def _write_output(conn: sqlite3.Connection, job_id: str, source: OutputFile) -> None:
    """Fill the zero blob COMPLETE_JOB reserved with the output file, piece by piece."""
    (rowid,) = conn.execute(JOB_ROWID, {"job_id": job_id}).fetchone()
    with conn.blobopen("jobs", "output", rowid) as blob:
        for chunk in source.chunks():
            blob.write(chunk)


def _read_output(conn: sqlite3.Connection, job_id: str, offset: int, length: int,
                 answer: bool) -> tuple[bytes, int] | None:
    """read_output's page, read in place. One read transaction: the row and its value are
    seen as of one moment."""
    conn.execute("BEGIN")
    try:
        row = conn.execute(READ_OUTPUT_SOURCE, {"job_id": job_id, "answer": answer}).fetchone()
        if row is None:
            return None
        where = answer_in(row["result_json"]) if answer else None
        if isinstance(where, str):  # a parsed answer (JSON-escaped in result_json)
            return page_of(where.encode("utf-8"), offset, length)
        if row["output_type"] not in ("text", "blob"):
            return b"", 0
        with conn.blobopen("jobs", "output", row["rowid"], readonly=True) as blob:
            first, count, total = page_bounds(len(blob), offset, length, where)
            blob.seek(first)
            return blob.read(count), total
    finally:
        conn.execute("COMMIT")


def _instance(row: sqlite3.Row) -> InstanceRow:
    data = dict(zip(row.keys(), row, strict=True))  # iterating a Row yields its values
    for name in _INSTANCE_TIME_FIELDS:
        data[name] = _utc(data[name])
    return InstanceRow(**data)


def _run_transaction(db: sqlite3.Connection, clock: Callable[[], float],
                     work: Callable[[sqlite3.Connection, float], T]) -> T:
    """On the connection's thread: BEGIN IMMEDIATE, `work(db, now)`, COMMIT; ROLLBACK on any
    error. `now` is read once the write lock is held: a lease computed by one writer is
    never older than a decision taken by the next."""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = work(db, clock())
        db.execute("COMMIT")
    except BaseException:
        # ROLLBACK fails harmlessly when BEGIN itself failed (nothing open).
        with suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    return result


def _fetch_light(db: sqlite3.Connection, light_sql: str, full_sql: str,
                 params: Mapping[str, Any]) -> list[JobRow]:
    """Rows without output or answer text, stripped in SQL; a result_json that is not
    JSON (never written by complete()) makes json_remove fail: then strip in Python."""
    try:
        return [_job(r) for r in db.execute(light_sql, params)]
    except sqlite3.OperationalError as exc:
        if "JSON" not in str(exc):
            raise
    return [without_output(_job(r)) for r in db.execute(full_sql, params)]


def _changed(db: sqlite3.Connection, sql: str, params: Mapping[str, Any]) -> int:
    """Rows changed by one statement (on the connection's thread)."""
    return db.execute(sql, params).rowcount




def _candidate(row: sqlite3.Row) -> AdoptionCandidate:
    data = owner_fields(row)
    owner = None
    if data is not None:
        for name in _INSTANCE_TIME_FIELDS:
            data[name] = _utc(data[name])
        owner = InstanceRow(**data)
    return AdoptionCandidate(job=_job(row), owner=owner)


def jobs_page_params(page: JobsPage) -> dict[str, Any]:
    """LIST_JOBS_PAGE's parameters (the statuses as a JSON array, read with json_each)."""
    statuses = None if page.statuses is None else json.dumps([s.value for s in page.statuses])
    return {"statuses": statuses, "provider": page.provider, "hostname": page.hostname,
            "after_id": page.after_id, "limit": max(page.limit, 0)}


def _insert_job(db: sqlite3.Connection, job: NewJob, ttl_s: float, now: float) -> JobRow:
    """One admission's writes, inside the caller's transaction: the row and its budget
    reservations (insert_job; each job of insert_attempt_group)."""
    params = {
        "id": job.id, "provider": job.provider, "request_key": job.request_key,
        "transport": job.transport, "correlation_id": job.correlation_id,
        "owner_instance": job.owner_instance, "hostname": job.hostname,
        "working_dir": job.working_dir, "model": job.model,
        "session_id": job.session_id, "request_json": job.request_json,
        "forced": job.forced, "boot_id": job.boot_id, "ttl_s": ttl_s,
        "principal": job.principal, "running": job.running, "now": now,
    }
    try:
        rows = db.execute(INSERT_JOB, params).fetchall()
    except sqlite3.IntegrityError as exc:
        raise ValueError(f"job id {job.id} already exists") from exc
    if rows:
        # Invariant: the job and its budget reservations commit together or not at
        # all (BudgetExceeded rolls the insert back): sqlite_usage.RESERVE_BUDGET.
        sqlite_usage.reserve(db, job.id, job.reservations, now)
        return _job(rows[0])
    # The winner of the race, read in the same transaction (rolled back: no change).
    existing = db.execute(FIND_ACTIVE_BY_KEY, {"request_key": job.request_key}).fetchall()
    raise DuplicateActiveJob(existing[0][0] if existing else None)
