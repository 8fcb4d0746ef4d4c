"""The SQLite backend (the default): its executor (store.py), its SQL (sql.py), and the
concerns split out of them, each a module of this folder. Imported only when it is the
configured backend (gateway/store/__init__.py)."""
