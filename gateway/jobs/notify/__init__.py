"""Completion notices (issue 40): the sinks a notice is sent to (sinks.py) and the
deliverer that claims notices from the store's outbox and sends them (deliver.py)."""
