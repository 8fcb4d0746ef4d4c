"""The PostgreSQL backend: its executor (store.py), its SQL (sql.py), and the concerns split
out of them, each a module of this folder. The only place asyncpg is imported, and imported
only when it is the configured backend (gateway/store/__init__.py), so a SQLite install
never needs the `postgres` extra."""


def driver_missing() -> bool:
    """Whether asyncpg (the `postgres` extra) cannot be imported: `doctor` says what to
    install before it tries to connect, as the store itself would at open."""
    try:
        import asyncpg  # noqa: F401  # deferred: optional dependency (asyncpg: the postgres extra)
    except ImportError:
        return True
    return False
