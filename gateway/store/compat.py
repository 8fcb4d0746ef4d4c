"""Which gateway may write a store: the schema version and the lowest writer (issue #22).

Release N and N-1 serve one store together (docs/operations.md, upgrades), so a migration
is additive and an older gateway usually keeps writing a store a newer one migrated. When a
migration does make older writers wrong, it names the lowest gateway version that may
write the store from then on (`MIN_WRITER_BY_SCHEMA`); the migrating gateway records it in
the `schema_meta` table with its own version (`migrated_by`). Every gateway reads both
before it writes anything, and:

- a gateway older than the recorded `min_writer_version` refuses at once (a permanent
  StoreUnavailable: `setup_error` over MCP) naming both versions and the upgrade;
- a gateway that finds a schema newer than it knows keeps serving only if the store
  records a lowest writer it satisfies (the newer release declared its migration safe for
  it); with no such record it refuses the same way. This is also what 0.1.0 does on any
  newer schema (it reads no `schema_meta`): it refuses with "upgrade agent-cli-gateway".

One home for the rule: both SQL backends call `refusal()` inside their migration
transaction, before its first write, and `meta_rows()` after applying migrations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gateway import __version__
from gateway.store.base import SCHEMA_VERSION

GATEWAY_VERSION = __version__

META_MIN_WRITER = "min_writer_version"  # the lowest gateway version that may write the store
META_MIGRATED_BY = "migrated_by"  # the gateway version that applied the latest migration

# schema version -> the lowest gateway version that may write a store at that version or
# later (until a later entry raises it). 7 introduced the record itself: every gateway that
# knows schema 7 is 0.2.0 or later. A later additive migration adds no entry (its store
# stays writable by 0.2.0); one that older writers would corrupt adds its own release here.
MIN_WRITER_BY_SCHEMA: Mapping[int, str] = {7: "0.2.0"}


def version_key(version: str) -> tuple[int, ...]:
    """A release version as comparable numbers: "0.10.1" > "0.9.3"; a suffix after the
    numbers ("0.3.0.dev1", "0.3.0rc1") is ignored, so a pre-release counts as its release."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else (0,)


def min_writer_for(schema_version: int) -> str | None:
    """The lowest writer a store at `schema_version` records (None: no migration set one)."""
    rules = [v for s, v in MIN_WRITER_BY_SCHEMA.items() if s <= schema_version]
    return max(rules, key=version_key) if rules else None


def refusal(store: str, schema_version: int, meta: Mapping[str, str],
            gateway_version: str = GATEWAY_VERSION,
            known_schema: int = SCHEMA_VERSION) -> str | None:
    """Why this gateway must not write the store `store` (a name fit to show), or None.

    `meta` is the store's schema_meta rows ({} when it has none)."""
    min_writer = meta.get(META_MIN_WRITER)
    migrated_by = meta.get(META_MIGRATED_BY) or "a newer release"
    if min_writer is not None and version_key(gateway_version) >= version_key(min_writer):
        return None  # it may write, whatever schema the store is at
    if min_writer is None and schema_version <= known_schema:
        return None  # a store of a schema this gateway knows, and no rule against it
    upgrade_to = min_writer or (meta.get(META_MIGRATED_BY) or f"a release that knows schema "
                                                              f"{schema_version}")
    return (f"{store}: this store was migrated by agent-cli-gateway {migrated_by} (schema "
            f"{schema_version}); this is agent-cli-gateway {gateway_version} (schema "
            f"{known_schema}), which may no longer write it: upgrade agent-cli-gateway to "
            f">= {upgrade_to}")


def meta_rows(applied: Sequence[int], meta: Mapping[str, str],
              gateway_version: str = GATEWAY_VERSION) -> dict[str, str]:
    """The schema_meta rows to write after this gateway applied the migrations `applied`
    (none: nothing to write). The lowest writer never goes down: a rule a newer gateway
    recorded stays."""
    if not applied:
        return {}
    rows = {META_MIGRATED_BY: gateway_version}
    rule = min_writer_for(max(applied))
    recorded = meta.get(META_MIN_WRITER)
    if rule is not None and (recorded is None or version_key(rule) > version_key(recorded)):
        rows[META_MIN_WRITER] = rule
    return rows
