"""The memory backend (tests, `backend = "memory"`): the SQL backends' rules held in dicts."""
