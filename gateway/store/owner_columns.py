"""The columns of an instance row, in one list both SQL dialects and both executors build from.

An instance row is read in two shapes: whole (`LIST_INSTANCES`, and the PostgreSQL upsert
that writes it), and as the owner of an adoption candidate, where a LEFT JOIN of
`gateway_instances AS owner` names each column `owner_<column>` beside the job's own. Both
come from `InstanceRow`'s fields, so a column added to the row is read everywhere at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from gateway.model import InstanceRow

INSTANCE_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(InstanceRow))
# "instance_id, hostname, ...": for SELECT and INSERT column lists.
INSTANCE_COLUMN_LIST = ", ".join(INSTANCE_COLUMNS)
# The candidate's owner beside the job's columns: "owner.instance_id AS owner_instance_id, ..."
OWNER_COLUMN_LIST = ",\n       ".join(f"owner.{name} AS owner_{name}" for name in INSTANCE_COLUMNS)


class _Row(Protocol):
    """A row read by name: a sqlite3.Row, an asyncpg.Record, a dict."""

    def __getitem__(self, key: str, /) -> Any: ...


def owner_fields(row: _Row) -> dict[str, Any] | None:
    """The owner's columns of a candidate row, unprefixed (None: the job has no owner row)."""
    if row["owner_instance_id"] is None:
        return None
    return {name: row[f"owner_{name}"] for name in INSTANCE_COLUMNS}
