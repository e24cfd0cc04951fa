"""``flowforge get schedules``, ``describe schedule NAME`` and ``schedule
trigger|suspend|resume NAME``: WorkflowSchedules through the Kubernetes API, as the user.

A trigger sets the annotation ``flowforge.io/trigger`` to a new token; the operator fires
once per token, at the database's now, under the schedule's overlap policy."""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from flowforge.cli import runs
from flowforge.cli.commands import SCHEDULE_TYPES
from flowforge.cli.connections import has_store, kube_client, resolve_namespace, with_store
from flowforge.cli.output import EXIT_OK, CommandError, emit, table
from flowforge.domain.api import GROUP, RUN_PLURAL, VERSION
from flowforge.domain.schedule import PLURAL
from flowforge.kube.errors import KubernetesError, kubernetes_errors
from flowforge.kube.schedule_objects import NOMINAL_TIME_ANNOTATION, SCHEDULE_LABEL

TRIGGER_ANNOTATION = f"{GROUP}/trigger"


def get(args: argparse.Namespace) -> int:
    """``get TYPE``: schedules here, runs in ``runs.py``."""
    if args.type not in SCHEDULE_TYPES:
        return runs.get_runs(args)
    return get_schedules(args)


def describe(args: argparse.Namespace) -> int:
    if args.type not in SCHEDULE_TYPES:
        return runs.describe_run(args)
    return describe_schedule(args)


def _age(stamp: str | None, now: datetime) -> str:
    if not stamp:
        return "<none>"
    seconds = int((now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def schedule_row(body: dict[str, Any], now: datetime) -> list[object]:
    spec, status = body.get("spec", {}), body.get("status") or {}
    last = (status.get("lastFire") or {}).get("nominalTime")
    return [
        body["metadata"]["name"],
        spec.get("schedule", ""),
        spec.get("timeZone", "UTC"),
        str(bool(spec.get("suspend", False))).lower(),
        _age(last, now) if last else "<none>",
        status.get("nextFireTime") or "<none>",
        status.get("activeCount", 0),
        _age(body["metadata"].get("creationTimestamp"), now),
    ]


HEADERS = ("NAME", "SCHEDULE", "TIMEZONE", "SUSPENDED", "LAST FIRE", "NEXT FIRE", "ACTIVE", "AGE")


def get_schedules(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    with kube_client(args) as api, kubernetes_errors():
        listing: Any = k8s.CustomObjectsApi(api).list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL
        )
    items = [
        item for item in listing["items"] if not args.runs or item["metadata"]["name"] in args.runs
    ]
    now = datetime.now(UTC)
    emit(
        args.output,
        data=lambda: items,
        table=lambda _wide: table(HEADERS, (schedule_row(item, now) for item in items)),
        names=lambda: [f"workflowschedule.{GROUP}/{item['metadata']['name']}" for item in items],
    )
    return EXIT_OK


def _read(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    try:
        with kubernetes_errors():
            body: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except KubernetesError as error:
        if error.not_found:
            raise CommandError(f"no WorkflowSchedule {name!r} in namespace {namespace}") from error
        raise
    return dict(body)


def describe_text(
    body: dict[str, Any], made: list[dict[str, Any]], fires: list[dict[str, Any]] | None = None
) -> str:
    spec, status = body.get("spec", {}), body.get("status") or {}
    lines = [
        f"Name:           {body['metadata']['name']}",
        f"Namespace:      {body['metadata']['namespace']}",
        f"Workflow:       {spec.get('workflow')} (version {spec.get('version', 'newest')})",
        f"Schedule:       {spec.get('schedule')} in {spec.get('timeZone', 'UTC')}",
        f"Overlap:        {spec.get('overlapPolicy', 'Skip')}",
        f"Suspended:      {str(bool(spec.get('suspend', False))).lower()}",
        f"Next fires:     {', '.join(status.get('nextFireTimes') or []) or '<none>'}",
        f"Active:         {', '.join(status.get('active') or []) or '<none>'}",
        f"Missed:         {status.get('missed') or {}}",
        f"tzdata:         {status.get('tzdataVersion', '<unknown>')}",
        "Conditions:",
        *(
            f"  {c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
            for c in status.get("conditions") or []
        ),
        "Runs:",
    ]
    rows = sorted(
        made,
        key=lambda run: run["metadata"].get("annotations", {}).get(NOMINAL_TIME_ANNOTATION, ""),
    )
    lines += [
        f"  {run['metadata']['name']}  "
        f"{run['metadata'].get('annotations', {}).get(NOMINAL_TIME_ANNOTATION, '')}  "
        f"{(run.get('status') or {}).get('phase', 'Pending')}"
        for run in rows
    ] or ["  <none>"]
    if fires is not None:  # the store's record: every fire, also of runs pruned by history
        lines.append("Fires (store):")
        lines += [
            f"  {fire['nominalTime']:%Y-%m-%dT%H:%M:%SZ}  {fire['run']}"
            + (f"  backfill {fire['backfill']}" if fire["backfill"] else "")
            + ("  manual" if fire["manual"] else "")
            for fire in fires
        ] or ["  <none>"]
    return "\n".join(lines) + "\n"


def describe_schedule(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    (name,) = args.runs
    with kube_client(args) as api:
        custom = k8s.CustomObjectsApi(api)
        body = _read(custom, namespace, name)
        with kubernetes_errors():
            listing: Any = custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, RUN_PLURAL, label_selector=f"{SCHEDULE_LABEL}={name}"
            )
    made = list(listing["items"])
    fires = None
    if has_store(args):
        from flowforge.store.schedules import schedule_fires

        fires = with_store(args, lambda pool: schedule_fires(pool, namespace=namespace, name=name))
    emit(
        args.output,
        data=lambda: {"schedule": body, "runs": made, "fires": fires},
        table=lambda _wide: describe_text(body, made, fires),
    )
    return EXIT_OK


def _patch(args: argparse.Namespace, patch: dict[str, Any], message: str) -> int:
    namespace = resolve_namespace(args)
    with kube_client(args) as api:
        custom = k8s.CustomObjectsApi(api)
        _read(custom, namespace, args.name)
        with kubernetes_errors():
            patched: Any = custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, args.name, patch
            )
    emit(
        args.output,
        data=lambda: patched,
        table=lambda _wide: f"workflowschedule.{GROUP}/{args.name} {message}\n",
        names=lambda: [f"workflowschedule.{GROUP}/{args.name}"],
    )
    return EXIT_OK


def trigger(args: argparse.Namespace) -> int:
    token = uuid.uuid4().hex[:12]
    patch = {"metadata": {"annotations": {TRIGGER_ANNOTATION: token}}}
    return _patch(args, patch, f"triggered ({token}; the overlap policy applies)")


def suspend(args: argparse.Namespace) -> int:
    return _patch(args, {"spec": {"suspend": True}}, "suspended")


def resume(args: argparse.Namespace) -> int:
    return _patch(args, {"spec": {"suspend": False}}, "resumed (missed times: spec.catchup)")
