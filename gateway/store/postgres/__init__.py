"""The PostgreSQL backend: its executor (store.py), its SQL (sql.py), and the concerns split
out of them, each a module of this folder. The only place asyncpg is imported, and imported
only when it is the configured backend (gateway/store/__init__.py), so a SQLite install
never needs the `postgres` extra."""
