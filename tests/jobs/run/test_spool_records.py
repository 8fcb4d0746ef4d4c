"""The spool records' reader rule (docs/architecture.md, spool records; issue #22): every
record (run.json, start.json, stop.json, end.json) carries a format version; a gateway reads
its own and every older one (release N reads N-1's), and refuses a newer one clearly
instead of misreading it. Real files, a real supervisor process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from gateway.jobs.run import supervisor as sup
from tests.jobs.run.conftest import StartSupervisor
from tests.jobs.run.test_supervisor import DEADLINE_S, end_record
from tests.waiting import scaled

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("platform_impl")]

RECORDS = (sup.RUN_NAME, sup.START_NAME, sup.STOP_NAME, sup.END_NAME)


@pytest.mark.parametrize("name", RECORDS)
def test_each_record_of_this_or_the_previous_format_is_read(tmp_path: Path, name: str) -> None:
    assert sup.RECORD_VERSION - 1 >= sup.OLDEST_RECORD_VERSION  # N reads N-1
    for version in range(sup.OLDEST_RECORD_VERSION, sup.RECORD_VERSION + 1):
        sup.write_record(tmp_path, name, {"version": version, "kind": "x"})
        assert sup.record_version_problem(name, sup.read_record(tmp_path, name)) is None
    assert sup.record_version_problem(name, None) is None  # absent: nothing to refuse


@pytest.mark.parametrize("name", RECORDS)
def test_each_record_of_a_newer_format_is_refused_saying_so(tmp_path: Path, name: str) -> None:
    sup.write_record(tmp_path, name, {"version": sup.RECORD_VERSION + 1, "kind": "x"})
    problem = sup.record_version_problem(name, sup.read_record(tmp_path, name))
    assert problem is not None
    assert (f"{name} is of spool format {sup.RECORD_VERSION + 1}, newer than this gateway "
            f"reads ({sup.RECORD_VERSION})") in problem and "upgrade agent-cli-gateway" in problem


@pytest.mark.parametrize("version", [None, "2", 0, True])
@pytest.mark.parametrize("name", RECORDS)
def test_a_record_without_a_known_format_version_is_refused(
    tmp_path: Path, name: str, version: object
) -> None:
    record = {"kind": "x"} if version is None else {"version": version, "kind": "x"}
    sup.write_record(tmp_path, name, record)
    problem = sup.record_version_problem(name, sup.read_record(tmp_path, name))
    assert problem is not None and "no format version" in problem


def test_every_record_this_release_writes_carries_its_version(tmp_path: Path) -> None:
    assert sup.claim_for_requeue(tmp_path, by="me")
    assert sup.read_record(tmp_path, sup.START_NAME)["version"] == sup.RECORD_VERSION  # type: ignore[index]


async def test_a_supervisor_never_runs_a_spec_of_a_newer_format(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    supervisor = start(tmp_path, "open('ran', 'w').close()", version=sup.RECORD_VERSION + 1)
    assert supervisor.wait(DEADLINE_S) == 2
    assert not (tmp_path / sup.START_NAME).exists()  # not even claimed
    assert not (tmp_path / "ran").exists()


async def test_a_stop_request_of_a_newer_format_still_stops_but_is_not_read_as_ours(
    tmp_path: Path, start: StartSupervisor,
) -> None:
    supervisor = start(tmp_path, "import time; print('ready', flush=True); time.sleep(60)")
    with anyio.fail_after(scaled(DEADLINE_S)):
        while not (tmp_path / "stdout").exists() or not (tmp_path / "stdout").stat().st_size:
            await anyio.sleep(0.02)
    sup.write_record(tmp_path, sup.STOP_NAME, {"version": sup.RECORD_VERSION + 1,
                                               "kind": "cancelled", "message": "bye",
                                               "grace_s": 0.2})
    os.kill(supervisor.pid, signal.SIGTERM)
    record = await end_record(tmp_path)
    # Stopped all the same; recorded as a stop it could not read the reason of (a signal).
    assert record["why"] == sup.WHY_SIGNAL and record["stop_kind"] is None
    assert record["stop_message"] is None
    assert supervisor.wait(DEADLINE_S) == 0
