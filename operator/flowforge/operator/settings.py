"""The operator's configuration, from ``FLOWFORGE_*`` environment variables (and flags).

Every server the operator starts binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from flowforge.domain.execution import BackoffPolicy
from flowforge.store.session import SessionLimits


def _float(environment: Mapping[str, str], name: str, default: float) -> float:
    raw = environment.get(name)
    return default if raw in (None, "") else float(raw)


LOG_FORMATS = ("text", "json")


def _log_format(raw: str) -> str:
    value = raw.strip().lower() or "text"
    if value not in LOG_FORMATS:
        choices = ", ".join(LOG_FORMATS)
        raise ValueError(f"FLOWFORGE_LOG_FORMAT must be one of {choices}, not {raw!r}")
    return value


@dataclass(frozen=True)
class OperatorSettings:
    dsn: str
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    kubeconfig: str | None = None
    reconcile_interval_seconds: float = 10.0
    # finished Jobs are deleted this long after their outcome is recorded; < 0 keeps them
    job_ttl_seconds: float = 300.0
    # Job creations a second (bursts up to the burst), served round-robin between the
    # namespaces waiting (``creation_turns.py``); 0 = unlimited
    job_creation_qps: float = 50.0
    job_creation_burst: int = 50
    # every call this operator makes to the API (Jobs, status, Events); 0 = unlimited.
    # kopf's own watches are long-lived streams and are not counted.
    kube_api_qps: float = 100.0
    kube_api_burst: int = 200
    kube_api_threads: int = 16
    event_workers: int = 50  # concurrent kopf event handlers per resource kind
    # kopf keeps an object's worker (and its slot of event_workers) this long after its last
    # event; kopf's own 5 s made a burst of new Jobs wait seconds for a slot
    event_worker_idle_seconds: float = 0.2
    log_format: str = "text"  # text | json
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no metrics endpoint
    lease_ttl_seconds: float = 10.0
    lease_renew_seconds: float = 3.0
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    # an attempt whose Pod has not started this long after its Job's creation fails (a task
    # type's pendingTimeoutSeconds wins)
    pending_timeout_seconds: float = 600.0
    # a Job creation the apiserver cannot take now (quota, 429, 5xx) is tried again after
    # this, doubling up to the cap
    job_creation_retry: BackoffPolicy = field(
        default_factory=lambda: BackoffPolicy(first_delay_seconds=1.0, cap_seconds=60.0)
    )
    store_pool_size: int = 0  # 0: sized to the workers (store.pool.pool_size_for)
    store_wait_seconds: float = 5.0  # the longest a handler waits for a free connection
    store_limits: SessionLimits = field(default_factory=SessionLimits)
    health_port: int = 0  # 0: no /healthz and /readyz
    loop_stall_seconds: float = 10.0  # /healthz fails when the event loop is this late

    @property
    def lease_ttl(self) -> timedelta:
        return timedelta(seconds=self.lease_ttl_seconds)

    @classmethod
    def from_environment(cls, environment: Mapping[str, str] | None = None) -> OperatorSettings:
        env = os.environ if environment is None else environment
        namespaces = tuple(n for n in env.get("FLOWFORGE_NAMESPACES", "").split(",") if n)
        return cls(
            dsn=env.get("FLOWFORGE_DSN", ""),
            namespaces=namespaces,
            kubeconfig=env.get("FLOWFORGE_KUBECONFIG") or env.get("KUBECONFIG") or None,
            reconcile_interval_seconds=_float(env, "FLOWFORGE_RECONCILE_INTERVAL", 10.0),
            job_ttl_seconds=_float(env, "FLOWFORGE_JOB_TTL", 300.0),
            job_creation_qps=_float(env, "FLOWFORGE_JOB_CREATION_QPS", 50.0),
            job_creation_burst=int(_float(env, "FLOWFORGE_JOB_CREATION_BURST", 50)),
            kube_api_qps=_float(env, "FLOWFORGE_KUBE_API_QPS", 100.0),
            kube_api_burst=int(_float(env, "FLOWFORGE_KUBE_API_BURST", 200)),
            kube_api_threads=int(_float(env, "FLOWFORGE_KUBE_API_THREADS", 16)),
            event_workers=int(_float(env, "FLOWFORGE_EVENT_WORKERS", 50)),
            event_worker_idle_seconds=_float(env, "FLOWFORGE_EVENT_WORKER_IDLE", 0.2),
            log_format=_log_format(env.get("FLOWFORGE_LOG_FORMAT", "text")),
            metrics_host=env.get("FLOWFORGE_METRICS_HOST", "127.0.0.1"),
            metrics_port=int(_float(env, "FLOWFORGE_METRICS_PORT", 0)),
            lease_ttl_seconds=_float(env, "FLOWFORGE_LEASE_TTL", 10.0),
            lease_renew_seconds=_float(env, "FLOWFORGE_LEASE_RENEW", 3.0),
            identity=env.get("FLOWFORGE_IDENTITY") or f"{socket.gethostname()}-{os.getpid()}",
            backoff=BackoffPolicy(
                first_delay_seconds=_float(env, "FLOWFORGE_RETRY_FIRST_DELAY", 1.0),
                cap_seconds=_float(env, "FLOWFORGE_RETRY_CAP", 300.0),
                jitter=_float(env, "FLOWFORGE_RETRY_JITTER", 0.5),
            ),
            pending_timeout_seconds=_float(env, "FLOWFORGE_PENDING_TIMEOUT", 600.0),
            job_creation_retry=BackoffPolicy(
                first_delay_seconds=_float(env, "FLOWFORGE_JOB_CREATION_RETRY_FIRST_DELAY", 1.0),
                cap_seconds=_float(env, "FLOWFORGE_JOB_CREATION_RETRY_CAP", 60.0),
            ),
            store_pool_size=int(_float(env, "FLOWFORGE_STORE_POOL_SIZE", 0)),
            store_wait_seconds=_float(env, "FLOWFORGE_STORE_WAIT", 5.0),
            store_limits=_store_limits(env),
            health_port=int(_float(env, "FLOWFORGE_HEALTH_PORT", 0)),
            loop_stall_seconds=_float(env, "FLOWFORGE_LOOP_STALL", 10.0),
        )


def _store_limits(env: Mapping[str, str]) -> SessionLimits:
    defaults = SessionLimits()
    return SessionLimits(
        connect_timeout_seconds=int(
            _float(env, "FLOWFORGE_DB_CONNECT_TIMEOUT", defaults.connect_timeout_seconds)
        ),
        keepalives_idle_seconds=int(
            _float(env, "FLOWFORGE_DB_KEEPALIVES_IDLE", defaults.keepalives_idle_seconds)
        ),
        keepalives_interval_seconds=int(
            _float(env, "FLOWFORGE_DB_KEEPALIVES_INTERVAL", defaults.keepalives_interval_seconds)
        ),
        keepalives_count=int(
            _float(env, "FLOWFORGE_DB_KEEPALIVES_COUNT", defaults.keepalives_count)
        ),
        statement_timeout_seconds=_float(
            env, "FLOWFORGE_DB_STATEMENT_TIMEOUT", defaults.statement_timeout_seconds
        ),
        lock_timeout_seconds=_float(
            env, "FLOWFORGE_DB_LOCK_TIMEOUT", defaults.lock_timeout_seconds
        ),
        idle_in_transaction_seconds=_float(
            env, "FLOWFORGE_DB_IDLE_IN_TRANSACTION_TIMEOUT", defaults.idle_in_transaction_seconds
        ),
    )
