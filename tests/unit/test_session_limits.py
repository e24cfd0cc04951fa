"""The database limits: read from the environment, sent to the server as startup options."""

from __future__ import annotations

from flowforge.operator.settings import OperatorSettings
from flowforge.store.pool import pool_size_for
from flowforge.store.session import LEASE_LIMITS, SessionLimits


def test_defaults_are_sane_and_the_lease_is_shorter() -> None:
    limits = OperatorSettings(dsn="").store_limits
    assert (limits.statement_timeout_seconds, limits.lock_timeout_seconds) == (15.0, 5.0)
    assert limits.idle_in_transaction_seconds == 30.0
    assert LEASE_LIMITS.client_seconds < OperatorSettings(dsn="").lease_ttl_seconds


def test_every_database_limit_is_read_from_the_environment() -> None:
    settings = OperatorSettings.from_environment(
        {
            "FLOWFORGE_DSN": "postgresql://x",
            "FLOWFORGE_DB_CONNECT_TIMEOUT": "3",
            "FLOWFORGE_DB_KEEPALIVES_IDLE": "7",
            "FLOWFORGE_DB_KEEPALIVES_INTERVAL": "2",
            "FLOWFORGE_DB_KEEPALIVES_COUNT": "4",
            "FLOWFORGE_DB_STATEMENT_TIMEOUT": "9.5",
            "FLOWFORGE_DB_LOCK_TIMEOUT": "1.25",
            "FLOWFORGE_DB_IDLE_IN_TRANSACTION_TIMEOUT": "11",
            "FLOWFORGE_STORE_WAIT": "2",
            "FLOWFORGE_HEALTH_PORT": "8081",
            "FLOWFORGE_LOOP_STALL": "6",
        }
    )
    assert settings.store_limits == SessionLimits(
        connect_timeout_seconds=3,
        keepalives_idle_seconds=7,
        keepalives_interval_seconds=2,
        keepalives_count=4,
        statement_timeout_seconds=9.5,
        lock_timeout_seconds=1.25,
        idle_in_transaction_seconds=11.0,
    )
    assert (settings.store_wait_seconds, settings.health_port) == (2.0, 8081)
    assert settings.loop_stall_seconds == 6.0
    kwargs = settings.store_limits.connection_kwargs()
    assert kwargs["options"] == (
        "-c statement_timeout=9500 -c lock_timeout=1250 "
        "-c idle_in_transaction_session_timeout=11000"
    )
    assert (kwargs["connect_timeout"], kwargs["keepalives"], kwargs["keepalives_count"]) == (
        3,
        1,
        4,
    )


def test_the_pool_is_sized_to_the_workers() -> None:
    assert pool_size_for(50) == 52
    assert OperatorSettings.from_environment({"FLOWFORGE_DSN": "x"}).store_pool_size == 0
