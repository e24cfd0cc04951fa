"""``flowforge runs list|show``, ``cancel``, ``retry``, ``logs``, and ``graph RUN``.

``runs`` reads the store, the system of record, so it works after the Kubernetes objects
are gone. ``cancel`` and ``retry`` act through the Kubernetes API as a user would (the
operator does the rest); ``logs`` reads the task Pods' logs through the API. Connection
options: ``--dsn`` (or ``$FLOWFORGE_DSN``), ``--kubeconfig`` (or ``$KUBECONFIG``),
``-n/--namespace`` (default: the kubeconfig context's namespace, else ``default``).
Exit codes: 0 success, 1 the request failed (unknown run, API or store refusal), 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from flowforge.cli import authoring
from flowforge.cli.run_report import RunReport, load_report, report_text, runs_table
from flowforge.domain.api import (
    API_VERSION,
    GROUP,
    RETRY_OF_ANNOTATION,
    RUN_KIND,
    RUN_PLURAL,
    VERSION,
)
from flowforge.domain.errors import FlowForgeError
from flowforge.kube.jobs import CONTAINER_NAME, LABEL_ATTEMPT, LABEL_RUN, LABEL_TASK, label_value
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition_by_id
from flowforge.store.pool import open_pool
from flowforge.store.queries import list_tasks
from flowforge.store.reuse import (
    NamedRun,
    find_run_by_name,
    list_runs_by_namespace,
    reusable_tasks,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
DSN_VARIABLE = "FLOWFORGE_DSN"
_RETRY_SUFFIX = re.compile(r"-retry-\d+$")
MAX_RETRY_NAMES = 50
T = TypeVar("T")


class CommandError(Exception):
    """One line for the user, and the exit code it calls for."""

    def __init__(self, message: str, *, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# connection options, shared with ``flowforge doctor``


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn", default=None, help=f"PostgreSQL connection string (default: ${DSN_VARIABLE})"
    )


def add_kube_options(parser: argparse.ArgumentParser, *, namespace: bool = True) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)",
    )
    if namespace:
        parser.add_argument(
            "-n",
            "--namespace",
            default=None,
            help="namespace (default: the kubeconfig context's, else default)",
        )


def store_dsn(args: argparse.Namespace) -> str:
    dsn = getattr(args, "dsn", None) or os.environ.get(DSN_VARIABLE)
    if not dsn:
        raise CommandError(f"no database: pass --dsn or set {DSN_VARIABLE}", exit_code=EXIT_USAGE)
    return str(dsn)


def resolve_namespace(args: argparse.Namespace) -> str:
    if getattr(args, "namespace", None):
        return str(args.namespace)
    try:
        _, active = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=getattr(args, "kubeconfig", None)
        )
    except (k8s_config.ConfigException, OSError, TypeError):
        return "default"
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


def kube_client(args: argparse.Namespace) -> k8s.ApiClient:
    try:
        api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=getattr(args, "kubeconfig", None)
        )
    except (k8s_config.ConfigException, OSError) as error:
        raise CommandError(f"cannot load the kubeconfig: {error}", exit_code=EXIT_USAGE) from error
    return api


def api_reason(error: ApiException) -> str:
    """The apiserver's own message of a refusal, else its HTTP status."""
    try:
        message = json.loads(error.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or f"{error.status} {error.reason}").splitlines()[0]


async def _with_store(dsn: str, work: Callable[[Pool], Awaitable[T]]) -> T:
    pool = await open_pool(dsn, min_size=1, max_size=2, name="flowforge-cli")
    try:
        return await work(pool)
    finally:
        await pool.close()


def with_store(args: argparse.Namespace, work: Callable[[Pool], Awaitable[T]]) -> T:
    dsn = store_dsn(args)
    try:
        return asyncio.run(_with_store(dsn, work))
    except (FlowForgeError, psycopg.Error) as error:
        raise CommandError(f"store: {str(error).strip().splitlines()[0]}") from error


def fail(command: str, error: CommandError, *, verbose: bool) -> int:
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    print(f"flowforge {command}: {error}", file=sys.stderr)
    return error.exit_code


def _handled(command: str, action: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    def handler(args: argparse.Namespace) -> int:
        try:
            return action(args)
        except CommandError as error:
            return fail(command, error, verbose=args.verbose)
        except (ApiException, HTTPError) as error:
            reason = api_reason(error) if isinstance(error, ApiException) else str(error)
            wrapped = CommandError(f"Kubernetes API: {reason}")
            wrapped.__cause__ = error
            return fail(command, wrapped, verbose=args.verbose)

    return handler


# registration


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = subparsers.add_parser("runs", help="list and show runs from the store")
    runs_commands = runs.add_subparsers(dest="runs_command", metavar="COMMAND")
    runs.set_defaults(handler=lambda _args: _usage(runs))

    list_parser = runs_commands.add_parser(
        "list",
        help="the newest runs of a namespace",
        description="List the newest runs of a namespace from the store, newest first: "
        "workflow, version, phase, progress, start and duration.",
    )
    _add_store_and_namespace(list_parser)
    list_parser.add_argument("--limit", type=int, default=50, help="how many runs (default 50)")
    _add_output(list_parser)
    list_parser.set_defaults(handler=_handled("runs list", _runs_list))

    show = runs_commands.add_parser(
        "show",
        help="one run: every task's state, attempts, durations, exit codes, rollback",
        description="Show one run from the store: its phase, every forward task with its "
        "attempts, durations, exit codes and failure reasons, and the compensation steps in "
        "the order they ran. Works after the WorkflowRun object is gone.",
    )
    show.add_argument("run", metavar="RUN", help="the WorkflowRun's name")
    _add_store_and_namespace(show)
    _add_output(show)
    show.set_defaults(handler=_handled("runs show", _runs_show))

    cancel = subparsers.add_parser(
        "cancel",
        help="stop a run (what succeeded is rolled back)",
        description="Set spec.cancel=true on the WorkflowRun; the operator stops its tasks "
        "and runs the compensators of what succeeded.",
    )
    cancel.add_argument("run", metavar="RUN")
    add_kube_options(cancel)
    cancel.set_defaults(handler=_handled("cancel", _cancel))

    retry = subparsers.add_parser(
        "retry",
        help="run a failed or cancelled run again, reusing what still stands",
        description="Create a new WorkflowRun RUN-retry-N with the same workflow, version and "
        f"parameters, annotated {RETRY_OF_ANNOTATION}: RUN. Tasks of RUN that succeeded and "
        "were not rolled back (nor depend on work that was) are not run again.",
    )
    retry.add_argument("run", metavar="RUN")
    _add_store_and_namespace(retry)
    retry.set_defaults(handler=_handled("retry", _retry))

    logs = subparsers.add_parser(
        "logs",
        help="the logs of a run's task Pods",
        description="Print the logs of the Pods of RUN (of its task TASK only, when given), "
        "every attempt, oldest first. Pods go with their Jobs: logs are gone once a Job is.",
    )
    logs.add_argument("run", metavar="RUN")
    logs.add_argument("task", metavar="TASK", nargs="?")
    add_kube_options(logs)
    logs.set_defaults(handler=_handled("logs", _logs))

    graph = subparsers.choices.get("graph")
    if graph is not None:
        attach_run_graphs(graph)


def attach_run_graphs(graph: argparse.ArgumentParser) -> None:
    """Let ``flowforge graph`` draw a run (by name, coloured by task state) as well as a
    file: adds the connection options and plugs in ``load_graph_source``."""
    _add_store_and_namespace(graph)
    for action in graph._actions:
        if action.dest == "source":
            action.metavar = "FILE|RUN"
            action.help = "a YAML or JSON manifest ('-' for stdin), or the name of a run"
    graph.set_defaults(graph_source_loader=load_graph_source)


def _add_store_and_namespace(parser: argparse.ArgumentParser) -> None:
    add_store_option(parser)
    add_kube_options(parser)


def _add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


# runs list / show


def _runs_list(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)

    async def work(pool: Pool) -> list[RunReport]:
        runs = await list_runs_by_namespace(pool, namespace=namespace, limit=args.limit)
        return [await load_report(pool, run, with_tasks=False) for run in runs]

    reports = with_store(args, work)
    if args.output == "json":
        print(json.dumps([report.to_dict() for report in reports], indent=2))
    elif not reports:
        print(f"no runs in namespace {namespace}", file=sys.stderr)
    else:
        sys.stdout.write(runs_table(reports))
    return EXIT_OK


async def _named(pool: Pool, *, namespace: str, name: str) -> NamedRun:
    run = await find_run_by_name(pool, namespace=namespace, name=name)
    if run is None:
        raise CommandError(f"no run {name!r} in namespace {namespace} (in the store)")
    return run


def _runs_show(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)

    async def work(pool: Pool) -> RunReport:
        return await load_report(pool, await _named(pool, namespace=namespace, name=args.run))

    report = with_store(args, work)
    if args.output == "json":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        sys.stdout.write(report_text(report))
    return EXIT_OK


# graph RUN


def _is_file(source: str) -> bool:
    return (
        source == "-"
        or Path(source).exists()
        or Path(source).suffix in (".yaml", ".yml", ".json")
        or "/" in source
    )


def load_graph_source(args: argparse.Namespace) -> authoring.GraphSource:
    """``graph``'s loader: a file as ``authoring`` reads it, else a run from the store, with
    the state of each of its tasks."""
    if _is_file(args.source):
        return authoring.load_definition_file(args)
    if not (getattr(args, "dsn", None) or os.environ.get(DSN_VARIABLE)):
        raise authoring._CommandError(
            f"{args.source}: no such file; to draw the run of that "
            f"name, pass --dsn or set {DSN_VARIABLE}"
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

    try:
        return with_store(args, work)
    except CommandError as error:
        raise authoring._CommandError(str(error), exit_code=error.exit_code) from error


# cancel / retry / logs


def _cancel(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    with kube_client(args) as api:
        custom = k8s.CustomObjectsApi(api)
        try:
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, RUN_PLURAL, args.run, {"spec": {"cancel": True}}
            )
        except ApiException as error:
            if error.status == 404:
                raise CommandError(
                    f"no WorkflowRun {args.run!r} in namespace {namespace}"
                ) from error
            raise
    print(f"workflowrun/{args.run} cancel requested")
    return EXIT_OK


def retry_name(old: str, attempt: int) -> str:
    return f"{_RETRY_SUFFIX.sub('', old)}-retry-{attempt}"


def _retry(args: argparse.Namespace) -> int:
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
    if old.phase == "succeeded":
        raise CommandError(f"run {old.name} succeeded: there is nothing to retry")
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {"annotations": {RETRY_OF_ANNOTATION: old.name}},
        "spec": {
            "workflow": old.workflow,
            "version": old.version,
            "parameters": dict(old.parameters),
        },
    }
    with kube_client(args) as api:
        custom = k8s.CustomObjectsApi(api)
        for number in range(1, MAX_RETRY_NAMES + 1):
            body["metadata"]["name"] = retry_name(old.name, number)
            try:
                custom.create_namespaced_custom_object(GROUP, VERSION, namespace, RUN_PLURAL, body)
            except ApiException as error:
                if error.status == 409:
                    continue
                raise
            break
        else:
            raise CommandError(f"{retry_name(old.name, 1)} .. -{MAX_RETRY_NAMES} all exist")
    reused = ", ".join(sorted(reusable)) or "none"
    print(
        f"workflowrun/{body['metadata']['name']} created: retry of {old.name} "
        f"({old.workflow} v{old.version}); reusing {len(reusable)} tasks ({reused})"
    )
    return EXIT_OK


def _logs(args: argparse.Namespace) -> int:
    namespace = resolve_namespace(args)
    selector = f"{LABEL_RUN}={label_value(args.run)}"
    if args.task:
        selector += f",{LABEL_TASK}={label_value(args.task)}"
    what = f"run {args.run}" + (f" task {args.task}" if args.task else "")
    with kube_client(args) as api:
        core = k8s.CoreV1Api(api)
        # raw JSON: the client's models type every field as optional
        response: Any = core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
        pods: list[dict[str, Any]] = json.loads(response.data).get("items", [])
        if not pods:
            raise CommandError(
                f"no Pods of {what} in namespace {namespace}: they go with their "
                "Jobs (see `flowforge runs show` for outcomes)"
            )

        def order(pod: dict[str, Any]) -> tuple[str, int, str]:
            labels = pod["metadata"].get("labels") or {}
            return (
                labels.get(LABEL_TASK, ""),
                int(labels.get(LABEL_ATTEMPT) or 0),
                pod["metadata"].get("creationTimestamp") or "",
            )

        failures = 0
        for pod in sorted(pods, key=order):
            name, labels = pod["metadata"]["name"], pod["metadata"].get("labels") or {}
            title = (
                f"{labels.get(LABEL_TASK, '?')} attempt {labels.get(LABEL_ATTEMPT, '?')} "
                f"(pod {name})"
            )
            try:
                text = str(core.read_namespaced_pod_log(name, namespace, container=CONTAINER_NAME))
            except ApiException as error:
                failures += 1
                print(
                    f"flowforge logs: {title}: the API cannot serve its logs: {api_reason(error)}",
                    file=sys.stderr,
                )
                continue
            if len(pods) > 1:
                print(f"==> {title} <==")
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return EXIT_FAILED if failures else EXIT_OK
