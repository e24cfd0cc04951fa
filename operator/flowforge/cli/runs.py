"""``flowforge get runs``, ``describe run``, ``cancel``, ``retry``, ``logs`` and ``graph RUN``.

``get`` and ``describe`` read the store, the system of record, so they work after the
Kubernetes objects are gone. ``cancel`` and ``retry`` act through the Kubernetes API as a user
would (the operator does the rest); ``logs`` reads the task Pods' logs through the API.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from kubernetes import client as k8s

from flowforge.cli import authoring, remote
from flowforge.cli.commands import DSN_VARIABLE
from flowforge.cli.connections import (
    has_store,
    kube_client,
    require_reader,
    resolve_namespace,
    server_client,
    with_store,
)
from flowforge.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError, emit
from flowforge.cli.run_report import RunReport, load_report, report_text, runs_table
from flowforge.domain.api import (
    API_VERSION,
    GROUP,
    RUN_KIND,
    RUN_PLURAL,
    VERSION,
)
from flowforge.domain.states import RunPhase
from flowforge.kube.errors import KubernetesError, kubernetes_errors
from flowforge.kube.jobs import CONTAINER_NAME, LABEL_ATTEMPT, LABEL_RUN, LABEL_TASK, label_value
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition_by_id
from flowforge.store.queries import list_tasks
from flowforge.store.reuse import (
    NamedRun,
    find_run_by_name,
    list_runs_by_namespace,
    reusable_tasks,
)

_RETRY_SUFFIX = re.compile(r"-retry-\d+$")
MAX_RETRY_NAMES = 50


def resource_name(run: str) -> str:
    """``kind.group/name``, as ``kubectl -o name`` prints a custom resource."""
    return f"{RUN_KIND.lower()}.{GROUP}/{run}"


async def _named(pool: Pool, *, namespace: str, name: str) -> NamedRun:
    run = await find_run_by_name(pool, namespace=namespace, name=name)
    if run is None:
        raise CommandError(f"no run {name!r} in namespace {namespace} (in the store)")
    return run


# get / describe


def get_runs(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    server = server_client(args)
    if server is not None:
        return remote.get_runs(args, server, namespace)
    require_reader(args)
    names: list[str] = args.runs
    with_tasks = bool(names) and args.output in ("json", "yaml")
    phase = getattr(args, "phase", None)
    if phase is not None and phase not in {str(p) for p in RunPhase}:
        raise CommandError(
            f"--phase: {phase!r} is not a run phase ({', '.join(str(p) for p in RunPhase)})",
            exit_code=EXIT_USAGE,
        )

    async def work(pool: Pool) -> list[RunReport]:
        if names:
            runs = [await _named(pool, namespace=namespace, name=name) for name in names]
        else:
            runs = await list_runs_by_namespace(
                pool, namespace=namespace, limit=args.limit, phase=phase
            )
        return [await load_report(pool, run, with_tasks=with_tasks) for run in runs]

    reports = with_store(args, work)
    if not reports and args.output in (None, "wide"):
        print(f"No runs found in {namespace} namespace.", file=sys.stderr)
        return EXIT_OK
    emit(
        args.output,
        data=lambda: [report.to_dict() for report in reports],
        table=lambda wide: runs_table(reports, wide=wide),
        names=lambda: (resource_name(report.run.name) for report in reports),
    )
    return EXIT_OK


def describe_run(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    server = server_client(args)
    if server is not None:
        return remote.describe_run(args, server, namespace)
    if getattr(args, "watch", False):
        raise CommandError("--watch follows a run through flowforge server: pass --server URL")
    require_reader(args)
    (name,) = args.runs

    async def work(pool: Pool) -> RunReport:
        return await load_report(pool, await _named(pool, namespace=namespace, name=name))

    report = with_store(args, work)
    emit(
        args.output,
        data=report.to_dict,
        table=lambda wide: report_text(report, wide=wide),
        names=lambda: [resource_name(report.run.name)],
    )
    return EXIT_OK


# graph RUN


def load_run_graph(args: argparse.Namespace) -> authoring.GraphSource:
    """The definition of the run ``args.source`` from the store, with the state of each of
    its tasks (through the server when one is configured)."""
    server = server_client(args)
    if server is not None:
        return remote.run_graph_source(server, namespace=resolve_namespace(args), name=args.source)
    if not has_store(args):
        raise CommandError(
            f"{args.source}: no such file; to draw the run of that name, pass --server URL "
            f"(or, as an administrator, --dsn, or --admin with {DSN_VARIABLE} set)",
            exit_code=EXIT_USAGE,
        )
    namespace = resolve_namespace(args)

    async def work(pool: Pool) -> authoring.GraphSource:
        run = await _named(pool, namespace=namespace, name=args.source)
        stored = await load_definition_by_id(pool, run.definition_id)
        states = {task.task_key: task.state for task in await list_tasks(pool, run.id)}
        if run.pruned_at is not None:
            print(
                f"flowforge graph: note: the task rows of {run.name} were pruned; "
                "drawing without states",
                file=sys.stderr,
            )
        return authoring.GraphSource(definition=stored.spec, states=states or None)

    return with_store(args, work)


# cancel / retry / logs


def _print_object(args: argparse.Namespace, body: dict[str, Any], message: str) -> None:
    name = str(body.get("metadata", {}).get("name"))
    emit(
        args.output,
        data=lambda: body,
        table=lambda _wide: f"{resource_name(name)} {message}\n",
        names=lambda: [resource_name(name)],
    )


def cancel_run(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    with kube_client(args) as api:
        custom = k8s.CustomObjectsApi(api)
        try:
            with kubernetes_errors():
                patched: Any = custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    RUN_PLURAL,
                    args.run,
                    {"spec": {"cancel": True}},
                )
        except KubernetesError as error:
            if error.not_found:
                raise CommandError(
                    f"no WorkflowRun {args.run!r} in namespace {namespace}"
                ) from error
            raise
    _print_object(args, patched, "cancel requested")
    return EXIT_OK


def retry_name(old: str, attempt: int) -> str:
    return f"{_RETRY_SUFFIX.sub('', old)}-retry-{attempt}"


def retry_run(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)

    async def work(pool: Pool) -> tuple[NamedRun, frozenset[str]]:
        run = await _named(pool, namespace=namespace, name=args.run)
        return run, await reusable_tasks(pool, namespace=namespace, run_name=args.run)

    old, reusable = with_store(args, work)
    if not old.finished:
        raise CommandError(
            f"run {old.name} is still {old.phase}: wait for it to finish, or "
            f"stop it with `flowforge cancel {old.name}`"
        )
    if old.phase == RunPhase.SUCCEEDED:
        raise CommandError(f"run {old.name} succeeded: there is nothing to retry")
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {},
        "spec": {
            "workflow": old.workflow,
            "version": old.version,
            "parameters": dict(old.parameters),
            "retryOf": old.name,
        },
    }
    with kube_client(args) as api:
        custom = k8s.CustomObjectsApi(api)
        for number in range(1, MAX_RETRY_NAMES + 1):
            body["metadata"]["name"] = retry_name(old.name, number)
            try:
                with kubernetes_errors():
                    created: Any = custom.create_namespaced_custom_object(
                        GROUP, VERSION, namespace, RUN_PLURAL, body
                    )
            except KubernetesError as error:
                if error.conflict:
                    continue
                raise
            break
        else:
            raise CommandError(f"{retry_name(old.name, 1)} .. -{MAX_RETRY_NAMES} all exist")
    reused = ", ".join(sorted(reusable)) or "none"
    _print_object(
        args,
        created,
        f"created: retry of {old.name} ({old.workflow} v{old.version}); "
        f"reusing {len(reusable)} tasks ({reused})",
    )
    return EXIT_OK


def _pod_order(pod: dict[str, Any]) -> tuple[str, int, str]:
    labels = pod["metadata"].get("labels") or {}
    return (
        labels.get(LABEL_TASK, ""),
        int(labels.get(LABEL_ATTEMPT) or 0),
        pod["metadata"].get("creationTimestamp") or "",
    )


def print_logs(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    server = server_client(args)
    if server is not None:
        return remote.print_logs(args, server, namespace)
    selector = f"{LABEL_RUN}={label_value(args.run)}"
    if args.task:
        selector += f",{LABEL_TASK}={label_value(args.task)}"
    what = f"run {args.run}" + (f" task {args.task}" if args.task else "")
    with kube_client(args) as api:
        core = k8s.CoreV1Api(api)
        with kubernetes_errors():
            # raw JSON: the client's models type every field as optional
            response: Any = core.list_namespaced_pod(
                namespace, label_selector=selector, _preload_content=False
            )
        pods: list[dict[str, Any]] = json.loads(response.data).get("items", [])
        if not pods:
            raise CommandError(
                f"no Pods of {what} in namespace {namespace}: they go with their "
                "Jobs (see `flowforge describe run` for outcomes)"
            )
        failures = 0
        for pod in sorted(pods, key=_pod_order):
            name, labels = pod["metadata"]["name"], pod["metadata"].get("labels") or {}
            title = (
                f"{labels.get(LABEL_TASK, '?')} attempt {labels.get(LABEL_ATTEMPT, '?')} "
                f"(pod {name})"
            )
            try:
                with kubernetes_errors():
                    text = str(
                        core.read_namespaced_pod_log(name, namespace, container=CONTAINER_NAME)
                    )
            except KubernetesError as error:
                failures += 1
                print(
                    f"flowforge logs: {title}: the API cannot serve its logs: {error.message}",
                    file=sys.stderr,
                )
                continue
            if len(pods) > 1:
                print(f"==> {title} <==")
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return EXIT_FAILED if failures else EXIT_OK
