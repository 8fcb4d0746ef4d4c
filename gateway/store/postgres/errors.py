"""How the PostgreSQL backend tells "the store is unavailable" from a bug, without the DSN.

Moved out of the executor (`store.py`) whole: which asyncpg and OS errors mean the server cannot be
reached or refused a statement right now (they become StoreUnavailable, and a cause that
does not pass by itself is marked permanent), and the DSN's secrets, which no such error's
text may contain (the rules and the marker: neutral/redaction.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

import asyncpg

from gateway.store.base import StoreFull, StoreUnavailable
from neutral.redaction import redact_url, scrub

# Failures that mean "the store cannot be reached or refused the statement right now":
# connection lost/refused (class 08), server shutting down or a statement cancelled by
# timeout (57), out of resources or disk (53), lock timeout (55P03), serialization or
# deadlock (40), read-only standby after a failover (25006), bad credentials or unknown
# database (28, 3D), client-side connection state, OS and timeout errors. Everything else
# (syntax, constraint) is a bug and propagates unchanged.
# Causes that do not pass by themselves: the credentials are refused (InvalidPasswordError is
# one of these), the database does not exist, the DSN cannot be parsed.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.ClientConfigurationError,
    ValueError,
)
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InsufficientResourcesError,
    asyncpg.LockNotAvailableError,
    asyncpg.TransactionRollbackError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,  # includes ConnectionRefusedError, ConnectionResetError
    TimeoutError,  # asyncio.TimeoutError is TimeoutError on 3.11
    EOFError,
)


def secrets_of(dsn: str) -> list[str]:
    """The DSN's password (raw and percent-decoded) so error text can be scrubbed of it."""
    try:
        password = urlsplit(dsn).password
    except ValueError:
        password = None
    secrets = [dsn]
    if password:
        secrets.extend({password, unquote(password)})
    return [s for s in secrets if s]


def redact_dsn(dsn: str) -> str:
    """The DSN with its password (and any secret-looking parameter) masked, for logs and
    error messages."""
    try:
        return redact_url(dsn)
    except ValueError:
        return "<unparseable dsn>"


def unavailable_error(action: str, exc: BaseException, secrets: Sequence[str]) -> StoreUnavailable:
    """StoreUnavailable (StoreFull for a full disk) for a failure to reach the server or a
    refused statement, its text scrubbed of the DSN and its password; `permanent` when the
    cause does not pass by itself (PERMANENT_ERRORS)."""
    detail = scrub(str(exc), secrets) or type(exc).__name__
    kind = StoreFull if isinstance(exc, asyncpg.DiskFullError) else StoreUnavailable
    return kind(
        f"postgres store: {action} failed ({type(exc).__name__}: {detail})",
        permanent=isinstance(exc, PERMANENT_ERRORS))
