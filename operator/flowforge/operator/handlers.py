"""kopf handlers of the run engine.

WorkflowRuns, Jobs and Jobs' Pods are watched with ``@kopf.on.event``: kopf writes no annotations
or finalizers of its own onto either, so a standby operator (which sees every event too and
ignores it) leaves no "handled" marks that would hide work from the leader. The one mark is
FlowForge's own finalizer on a run, added and removed by the leader (``finalizer.py``):
deleting a run waits until its rollback has settled. Every handler is idempotent (a 410
re-list replays every object); the reconciler is the backstop for anything an event missed,
and runs at once when this operator becomes the leader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from flowforge.domain.api import (
    DEFINITION_PLURAL,
    GROUP,
    POLICY_PLURAL,
    PREFIX,
    RUN_PLURAL,
    VERSION,
)
from flowforge.domain.run_actions import PLURAL as ACTION_PLURAL
from flowforge.domain.schedule import PLURAL as SCHEDULE_PLURAL
from flowforge.kube.client import KubeClient
from flowforge.kube.jobs import LABEL_MANAGED_BY, MANAGED_BY
from flowforge.kube.schedule_objects import ScheduleObjects
from flowforge.operator import health, memory, metrics, tracing
from flowforge.operator.actions import process_action
from flowforge.operator.engine import Engine
from flowforge.operator.finalizer import observe_run
from flowforge.operator.leadership import Leadership
from flowforge.operator.publishing import PendingPublisher, publish_event
from flowforge.operator.reconciler import Reconciler
from flowforge.operator.schedules import ScheduleController
from flowforge.operator.settings import OperatorSettings
from flowforge.store.lease import Fence
from flowforge.store.pool import open_pool, pool_size_for
from flowforge.store.session import LEASE_LIMITS
from flowforge.store.single import SingleConnection

logger = logging.getLogger("flowforge.operator")
OWN_OBJECTS = f"{LABEL_MANAGED_BY}={MANAGED_BY}"  # Jobs and their Pods' template
WATCH_LIST_CHUNK = 10


class NoDiffBase(kopf.DiffBaseStorage):
    """No essence for kopf to diff: every handler here is an event handler, which gets no
    diff. kopf's annotations storage deep-copies each object (a run's status, a Job) on
    every watch event to build one, which was the biggest share of kopf's own CPU."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return kopf.BodyEssence()

    def fetch(self, *, body: Any) -> None:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        raise RuntimeError("a change handler needs kopf's diff-base storage: set it back")


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf would own its finalizer for change handlers (there are none); never ours
    settings.persistence.finalizer = f"{PREFIX}/kopf-finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING
    # kopf's first listing of each kind (and its re-listing after a 410) in pages of a few
    # objects: one unpaged LIST of every Job labelled as FlowForge's is whatever size its
    # creators chose (kopf bounds pages by count only). The price: a start lists 10,000
    # Jobs in 1,000 requests
    settings.watching.chunk_size = WATCH_LIST_CHUNK
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    select_on_the_server(settings)

    config = OperatorSettings.from_environment()
    settings.queueing.worker_limit = config.event_workers
    settings.queueing.idle_timeout = config.event_worker_idle_seconds
    # With a list of namespaces the operator may not list namespaces at all (namespaced
    # RBAC); without this kopf retries that scan for about a minute before going on.
    settings.scanning.disabled = bool(config.namespaces)
    pool = await open_pool(
        config.dsn,
        min_size=2,
        max_size=config.store_pool_size or pool_size_for(config.event_workers),
        limits=config.store_limits,
        wait_seconds=config.store_wait_seconds,
    )
    kube = KubeClient.connect(
        kubeconfig=config.kubeconfig,
        api_qps=config.kube_api_qps,
        api_burst=config.kube_api_burst,
        threads=config.kube_api_threads,
    )
    lease_connection = SingleConnection(config.dsn, limits=LEASE_LIMITS, name="flowforge-lease")
    leadership = Leadership(
        lease_connection,
        identity=config.identity,
        ttl=config.lease_ttl,
        renew_every=config.lease_renew_seconds,
    )
    engine = Engine(pool=pool, kube=kube, settings=config, leadership=leadership)
    # a run may be seen before its definition's watch event: publish from the stored object
    engine.runs.publish_pending = PendingPublisher(
        pool=pool, kube=kube, namespace_uid=engine.namespaces.uid
    )
    reconciler = Reconciler(engine, interval=config.reconcile_interval_seconds)

    schedules = ScheduleController(
        pool=pool,
        objects=ScheduleObjects(kube.api_client),
        fence=lambda: leadership.fence,
        failures=engine.failures,
    )

    async def gained(fence: Fence) -> None:
        logger.info("leading with fencing epoch %d", fence.epoch)
        reconciler.kick()
        schedules.wake()  # its first pass now, not up to max_sleep after the takeover

    leadership.on_gained = gained
    if config.metrics_port:
        metrics.serve(host=config.metrics_host, port=config.metrics_port)
    # on when OTEL_EXPORTER_OTLP_ENDPOINT is set; its exporter process starts when leading
    tracing.configure(dsn=config.dsn, leading=leadership.wait_until_leader)
    probes = health.Health(stall_seconds=config.loop_stall_seconds)
    if config.health_port:
        memo.health_server = health.serve(probes, host=config.metrics_host, port=config.health_port)
    memo.pool = pool
    memo.lease_connection = lease_connection
    memo.kube = kube
    memo.engine = engine
    memo.schedules = schedules
    memo.background = [
        asyncio.create_task(memo.schedules.run_forever(), name="flowforge-schedules"),
        asyncio.create_task(leadership.run(), name="flowforge-lease"),
        asyncio.create_task(reconciler.run_forever(), name="flowforge-reconciler"),
        asyncio.create_task(health.heartbeat(probes), name="flowforge-heartbeat"),
        asyncio.create_task(health.check_database(probes, config.dsn), name="flowforge-ready"),
        asyncio.create_task(memory.release_periodically(), name="flowforge-memory"),
    ]


def select_on_the_server(settings: kopf.OperatorSettings) -> None:
    """The apiserver sends only FlowForge's Jobs and task Pods (a handler's ``labels`` filter
    alone is applied by kopf, after every object has come). Pods in every phase, not only
    succeeded ones: a running Pod whose files come from its annotation is judged when that
    annotation changes (``domain/observed_pod.py::files_forged``); the other events of a
    running Pod end in the handler before any store or API call."""
    settings.watching.label_selectors["batch", "v1", "jobs"] = OWN_OBJECTS
    settings.watching.label_selectors["v1", "pods"] = OWN_OBJECTS


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    for task in memo.get("background", []):
        task.cancel()
    engine: Engine | None = memo.get("engine")
    if engine is not None:
        await engine.shutdown()
        await engine.leadership.release()
    await tracing.shutdown()
    if memo.get("kube") is not None:
        memo.kube.close()
    if memo.get("lease_connection") is not None:
        await memo.lease_connection.close()
    if memo.get("health_server") is not None:
        memo.health_server.shutdown()
    if memo.get("pool") is not None:
        await memo.pool.close()


def _engine(memo: kopf.Memo) -> Engine | None:
    engine: Engine | None = memo.get("engine")
    if engine is None or not engine.leadership.is_leader:
        return None
    return engine


async def _guarded(engine: Engine, what: str, action: Awaitable[object]) -> None:
    # no kopf retries for events: the reconciler is the retry (``failures.py``)
    await engine.failures.guard(action, what=what)


async def _own_object_event(
    memo: kopf.Memo,
    event: kopf.RawEvent,
    *,
    kind: str,
    handle: Callable[[Engine, Mapping[str, Any], str | None], Awaitable[None]],
) -> None:
    """An event of a Job or Pod the operator manages, to the leading engine's ``handle``."""
    engine = _engine(memo)
    if engine is None:
        return
    body = event["object"]
    what = f"{kind} {body['metadata'].get('name')}"
    await _guarded(engine, what, handle(engine, body, event.get("type")))


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_MANAGED_BY: MANAGED_BY})
async def job_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    await _own_object_event(memo, event, kind="Job", handle=Engine.on_job_event)


@kopf.on.event("v1", "pods", labels={LABEL_MANAGED_BY: MANAGED_BY})
async def pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A task's Pod succeeded: its attempt's success is recorded at once, when the Pod is one
    its Job counts (``Engine.on_pod_event``); the Job watch stays the complete fallback. A
    Pod of the run's Job whose files annotation was changed fails its attempt."""
    await _own_object_event(memo, event, kind="Pod", handle=Engine.on_pod_event)


@kopf.on.event(GROUP, VERSION, RUN_PLURAL)
async def run_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    engine = _engine(memo)
    if engine is None:
        return
    body = event["object"]
    name = f"WorkflowRun {body['metadata'].get('namespace')}/{body['metadata'].get('name')}"
    if event.get("type") == "DELETED":
        await _guarded(engine, name, engine.run_deleted(body))
        return
    await _guarded(engine, name, observe_run(engine, body))


@kopf.on.event(GROUP, VERSION, ACTION_PLURAL)
async def action_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A person's WorkflowRunAction: applied to its run once (``operator/actions.py``)."""
    engine = _engine(memo)
    if event.get("type") == "DELETED" or engine is None:
        return
    body = event["object"]
    name = f"WorkflowRunAction {body['metadata'].get('namespace')}/{body['metadata'].get('name')}"
    await _guarded(engine, name, process_action(engine, body))


@kopf.on.event(GROUP, VERSION, DEFINITION_PLURAL)
async def definition_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Publish the stored definition (idempotent, by content: admission never publishes), and
    show its task count and fingerprint (or why it is unusable) in its status; an event of a
    generation already judged costs no parse (``publishing.py::already_judged``)."""
    engine = _engine(memo)
    if event.get("type") == "DELETED" or engine is None:
        return
    body = event["object"]
    metadata = body["metadata"]
    published = publish_event(
        body, pool=engine.pool, kube=engine.kube, namespace_uid=engine.namespaces.uid
    )
    await _guarded(engine, f"WorkflowDefinition {metadata.get('name')}", published)


@kopf.on.event(GROUP, VERSION, POLICY_PLURAL)
async def policy_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A FlowForgePolicy changed (or went): copy the namespace's limits into the store, where
    every dispatch reads them."""
    engine = _engine(memo)
    if engine is None:
        return
    namespace = str(event["object"]["metadata"].get("namespace"))
    await _guarded(engine, f"FlowForgePolicy of {namespace}", engine.policy_changed(namespace))


@kopf.on.event(GROUP, VERSION, SCHEDULE_PLURAL)
async def schedule_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Every operator keeps the schedules it sees; the leader's controller fires them."""
    if memo.get("schedules") is not None:
        memo.schedules.observe(event.get("type"), event["object"])
