"""Per-connection limits: how long to connect, how to notice a dead peer, how long to wait.

Every connection the operator opens carries libpq's ``connect_timeout`` and TCP keepalives
(a peer that vanished without a FIN is noticed in ``idle + interval * count`` seconds) and
three server-side limits sent as startup ``options``, so they hold from the first statement:
``statement_timeout`` (no statement runs longer), ``lock_timeout`` (no statement waits longer
for a row or table lock) and ``idle_in_transaction_session_timeout`` (a session that holds a
transaction open and does nothing is cut, releasing its locks).

A server that is paused (SIGSTOP, a frozen VM) enforces none of these and its kernel still
answers keepalives, so ``client_seconds`` is the client-side bound the store puts around a
whole operation (statement timeout plus a margin): nothing waits on a wedged server longer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

CLIENT_MARGIN_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class SessionLimits:
    connect_timeout_seconds: int = 5
    keepalives_idle_seconds: int = 10
    keepalives_interval_seconds: int = 5
    keepalives_count: int = 3
    statement_timeout_seconds: float = 15.0
    lock_timeout_seconds: float = 5.0
    idle_in_transaction_seconds: float = 30.0

    @property
    def client_seconds(self) -> float:
        """The client-side bound of one store operation (a wedged server answers nothing)."""
        return self.statement_timeout_seconds + CLIENT_MARGIN_SECONDS

    def options(self) -> str:
        settings = {
            "statement_timeout": self.statement_timeout_seconds,
            "lock_timeout": self.lock_timeout_seconds,
            "idle_in_transaction_session_timeout": self.idle_in_transaction_seconds,
        }
        return " ".join(f"-c {name}={round(value * 1000)}" for name, value in settings.items())

    def connection_kwargs(self) -> dict[str, Any]:
        """libpq parameters for ``psycopg.AsyncConnection.connect`` (or a pool's kwargs)."""
        return {
            "connect_timeout": max(1, self.connect_timeout_seconds),
            "keepalives": 1,
            "keepalives_idle": self.keepalives_idle_seconds,
            "keepalives_interval": self.keepalives_interval_seconds,
            "keepalives_count": self.keepalives_count,
            "options": self.options(),
        }


# the lease's own connection: a renewal that cannot finish quickly has failed
LEASE_LIMITS = SessionLimits(
    connect_timeout_seconds=2,
    keepalives_idle_seconds=5,
    keepalives_interval_seconds=2,
    keepalives_count=2,
    statement_timeout_seconds=2.0,
    lock_timeout_seconds=1.0,
    idle_in_transaction_seconds=5.0,
)

# the admission webhook's reads: an answer must reach the apiserver within its webhook
# timeout (10 s), so a slow or wedged database refuses the request instead of hanging it
WEBHOOK_LIMITS = SessionLimits(
    connect_timeout_seconds=2,
    statement_timeout_seconds=3.0,
    lock_timeout_seconds=1.0,
    idle_in_transaction_seconds=10.0,
)
