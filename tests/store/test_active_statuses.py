"""One spelling of "active" in the SQL of both dialects: `ACTIVE_STATUSES_SQL`
(gateway/store/base.py), derived from the model's active statuses. A statement that wrote the
list by hand would go on naming it after the model changed."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.model import ACTIVE_STATUSES, JobStatus
from gateway.store.base import ACTIVE_STATUSES_SQL

STORE = Path(__file__).resolve().parents[2] / "gateway" / "store"
# The active list written out: exactly the model's active statuses, in any order or spacing.
HAND_WRITTEN = re.compile(r"IN\s*\(\s*'queued'\s*,\s*'running'\s*\)|IN\s*\(\s*'running'\s*,\s*'queued'\s*\)")


def test_the_fragment_lists_the_models_active_statuses_in_their_declared_order() -> None:
    assert ACTIVE_STATUSES_SQL == "('queued','running')"
    listed = ACTIVE_STATUSES_SQL.strip("()").replace("'", "").split(",")
    assert listed == [status.value for status in JobStatus if status in ACTIVE_STATUSES]


def test_no_store_module_writes_the_active_list_by_hand() -> None:
    modules = sorted(STORE.rglob("*.py"))
    assert len(modules) > 10, "no store modules found: the test looks in the wrong place"
    offenders = [path.relative_to(STORE).as_posix() for path in modules
                 if HAND_WRITTEN.search(path.read_text(encoding="utf-8"))]
    assert not offenders, f"use ACTIVE_STATUSES_SQL (gateway/store/base.py): {offenders}"
