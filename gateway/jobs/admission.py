"""Whether this instance may admit durable jobs now, and if not, why.

One object holds it: the lease keeper says when the lease is held or lost and when the store
was replaced, shutdown says when the gateway closes or detaches, and admission asks it
(`refusal`) before anything is written. Nobody sets its fields from outside.
"""

from __future__ import annotations

from gateway.model import ErrorKind, GatewayError


class AdmissionState:
    """The lease, the store's fate and the shutdown, as admission needs them."""

    def __init__(self) -> None:
        self._lease_held = False  # registered, and the heartbeat renews the lease
        self._store_problem: str | None = None
        self._closing = False
        self._detached = False

    # -- what the lease keeper says ----------------------------------------------------------
    def lease_renewed(self) -> None:
        """Registered, or a heartbeat renewed the lease: durable admission is on."""
        self._lease_held = True

    def lease_lost(self) -> None:
        """Registration failed, or the heartbeat failed too often: admission fails closed."""
        self._lease_held = False

    def store_replaced(self, problem: str) -> None:
        """The store's file was deleted or replaced: admission is off until a restart, and
        `problem` says why (gateway_status and every refusal show it)."""
        self._lease_held = False
        self._store_problem = problem

    # -- what shutdown says -------------------------------------------------------------------
    def close(self) -> None:
        """Shutting down: no new job, no sweep, no take-over."""
        self._closing = True

    def detach(self) -> None:
        """Shutting down with on_shutdown = "detach": closed, and the runs go on."""
        self._closing = True
        self._detached = True

    # -- what the rest asks -------------------------------------------------------------------
    @property
    def lease_held(self) -> bool:
        return self._lease_held

    @property
    def store_problem(self) -> str | None:
        return self._store_problem

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def detached(self) -> bool:
        return self._detached

    @property
    def open(self) -> bool:
        """The lease is held and the gateway is not closing: it admits, and it may judge
        and take over other instances' jobs (one that cannot renew its own lease may not)."""
        return self._lease_held and not self._closing

    def refusal(self, provider: str) -> GatewayError | None:
        """Why a request for `provider` cannot be admitted now (None: it can)."""
        if self._closing:
            return GatewayError(ErrorKind.UNAVAILABLE,
                                f"Admission is closed for {provider}: this gateway is shutting "
                                f"down. Retry; a new gateway instance will take the request.")
        if self._store_problem is not None:
            return GatewayError(ErrorKind.UNAVAILABLE,
                                f"Durable admission is off for {provider}: {self._store_problem}")
        if not self._lease_held:
            return GatewayError(ErrorKind.UNAVAILABLE,
                                f"Durable admission is off for {provider}: this gateway "
                                f"instance could not register or lost its heartbeat lease (job "
                                f"store unreachable). Running jobs continue. Retry in a few "
                                f"seconds.")
        return None
