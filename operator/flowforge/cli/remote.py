"""``get runs``, ``describe run`` (and ``--watch``), ``graph RUN`` and ``logs`` through
``flowforge server``, as the caller: what they print is made from the API's shapes
(``docs/api.md``), in the same columns as the admin mode's."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from flowforge.cli.api_client import ServerClient, path_of
from flowforge.cli.authoring import GraphSource
from flowforge.cli.output import EXIT_FAILED, EXIT_OK, CommandError, emit, table
from flowforge.cli.run_report import duration_text, other_counts
from flowforge.domain.models import ContainerTemplate, DefinitionSpec, TaskSpec

Json = Mapping[str, Any]


def _run_path(namespace: str, name: str, *rest: str) -> str:
    return path_of("namespaces", namespace, "runs", name, *rest)


def _age(text: str | None) -> str:
    if not text:
        return "-"
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return duration_text((datetime.now(UTC) - moment).total_seconds())


def phase_text(run: Json) -> str:
    if run.get("compensating"):
        return f"{run['phase']} (rolling back)"
    if run.get("cancelRequested") and not run.get("finishedAt"):
        return f"{run['phase']} (cancel requested)"
    return str(run["phase"])


def runs_table(runs: Sequence[Json], *, wide: bool) -> str:
    headers = ["NAME", "WORKFLOW", "VERSION", "PHASE", "PROGRESS", "AGE", "DURATION"]
    if wide:
        headers += ["UID", "CREATED", "FINISHED"]
    rows = []
    for run in runs:
        progress = run["progress"]
        row = [
            run["name"],
            run["workflow"],
            str(run["version"]),
            phase_text(run),
            f"{progress['succeeded']}/{progress['total']}",
            _age(run.get("createdAt")),
            duration_text(run.get("durationSeconds")),
        ]
        if wide:
            row += [run["uid"], run.get("createdAt") or "-", run.get("finishedAt") or "-"]
        rows.append(row)
    return table(headers, rows)


def _task_cells(task: Json, *, wide: bool) -> list[str]:
    reason, message = task.get("reason") or "", task.get("message") or ""
    detail = (f"{reason}: {message}" if reason and message else reason or message).replace(
        "\n", " "
    )
    exit_code = "-" if task.get("exitCode") is None else str(task["exitCode"])
    cells = [str(task["state"]), str(task["attempts"]), duration_text(task.get("durationSeconds"))]
    cells.append(exit_code)
    if wide:
        return [*cells, task.get("startedAt") or "-", task.get("finishedAt") or "-", detail]
    return [*cells, detail[:100]]


def report_text(run: Json, *, wide: bool = False) -> str:
    progress = run["progress"]
    others = other_counts(progress)
    lines = [
        f"Run:        {run['namespace']}/{run['name']} (uid {run['uid']})",
        f"Workflow:   {run['workflow']} v{run['version']}",
        f"Phase:      {phase_text(run)}",
        f"Progress:   {progress['succeeded']}/{progress['total']} succeeded"
        + (f", {others}" if others else ""),
        f"Created:    {run.get('createdAt')}",
        f"Finished:   {run.get('finishedAt') or '-'}  (duration "
        f"{duration_text(run.get('durationSeconds'))})",
    ]
    if run.get("parameters"):
        lines.append(f"Parameters: {json.dumps(run['parameters'], sort_keys=True)}")
    if run.get("retryOf"):
        lines.append(f"Retry of:   {run['retryOf']}")
    text = "\n".join(lines) + "\n"
    headers = ["STATE", "ATTEMPTS", "DURATION", "EXIT"]
    headers += ["STARTED", "FINISHED", "REASON"] if wide else ["REASON"]
    if run.get("tasksOmitted"):
        text += f"\n{progress['total']} tasks: too many to list (see `flowforge graph`)\n"
    elif run.get("tasks"):
        text += "\n" + table(
            ["TASK", *headers],
            [[task["name"], *_task_cells(task, wide=wide)] for task in run["tasks"]],
        )
    steps = run.get("compensation", {}).get("steps") or []
    if steps:
        rollback = run["compensation"]
        text += f"\nCompensation ({rollback['state']}, in the order it runs):\n" + table(
            ["STEP", "COMPENSATOR", "UNDOES", "STATE", "STARTED", "FINISHED"],
            [
                [
                    str(step["order"]),
                    step["compensator"],
                    step["task"],
                    step["state"],
                    step.get("startedAt") or "-",
                    step.get("finishedAt") or "-",
                ]
                for step in steps
            ],
        )
    return text


def get_runs(args: argparse.Namespace, client: ServerClient, namespace: str) -> int:
    names: list[str] = args.runs
    if names:
        runs = [client.get(_run_path(namespace, name)) for name in names]
    else:
        runs = client.get("/runs", namespace=namespace, limit=min(max(args.limit, 1), 500))["items"]
    if not runs and args.output in (None, "wide"):
        print(f"No runs found in {namespace} namespace.", file=sys.stderr)
        return EXIT_OK
    emit(
        args.output,
        data=lambda: runs,
        table=lambda wide: runs_table(runs, wide=wide),
        names=lambda: (f"workflowrun.flowforge.io/{run['name']}" for run in runs),
    )
    return EXIT_OK


def describe_run(args: argparse.Namespace, client: ServerClient, namespace: str) -> int:
    (name,) = args.runs
    run = client.get(_run_path(namespace, name))
    emit(
        args.output,
        data=lambda: run,
        table=lambda wide: report_text(run, wide=wide),
        names=lambda: [f"workflowrun.flowforge.io/{name}"],
    )
    if getattr(args, "watch", False) and args.output in (None, "wide"):
        return watch_run(client, namespace=namespace, name=name)
    return EXIT_OK


def watch_run(client: ServerClient, *, namespace: str, name: str) -> int:
    """Follow the run live: one line per task that changes, and the phase, until it ends."""
    phase = None
    for kind, change in client.stream(_run_path(namespace, name, "stream")):
        run = change["run"]
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        if kind == "change":
            for task, state in sorted(change["states"].items()):
                print(f"{stamp}  {task:<30} {state}", flush=True)
        if phase_text(run) != phase:
            phase = phase_text(run)
            progress = run["progress"]
            print(
                f"{stamp}  run {name}: {phase} ({progress['succeeded']}/{progress['total']})",
                flush=True,
            )
    return EXIT_OK


def run_graph_source(client: ServerClient, *, namespace: str, name: str) -> GraphSource:
    """The run's graph as a definition the renderer draws, with each task's state."""
    graph = client.get(_run_path(namespace, name, "graph"))
    upstreams: dict[str, list[str]] = {node["id"]: [] for node in graph["nodes"]}
    for upstream, task in graph["edges"]:
        upstreams[task].append(upstream)
    types = {node["type"] for node in graph["nodes"]} | {c["type"] for c in graph["compensators"]}
    spec = DefinitionSpec(
        workflow=graph.get("workflow") or name,
        version=graph.get("version") or 1,
        task_types={kind: ContainerTemplate(image="-") for kind in types},
        tasks=(
            *(
                TaskSpec(key=node["id"], type=node["type"], depends_on=tuple(upstreams[node["id"]]))
                for node in graph["nodes"]
            ),
            *(
                TaskSpec(key=c["id"], type=c["type"], compensate_for=c["task"])
                for c in graph["compensators"]
            ),
        ),
    )
    states = {node["id"]: node["state"] for node in graph["nodes"] if node.get("state")}
    states.update({c["id"]: c["state"] for c in graph["compensators"] if c.get("state")})
    return GraphSource(definition=spec, states=states or None)


def print_logs(args: argparse.Namespace, client: ServerClient, namespace: str) -> int:
    run = client.get(_run_path(namespace, args.run))
    tasks = [task for task in run.get("tasks") or [] if not args.task or task["name"] == args.task]
    if args.task and not tasks:
        tasks = [client.get(_run_path(namespace, args.run, "tasks", args.task))]
    attempts = [
        (task["name"], number) for task in tasks for number in range(1, task["attempts"] + 1)
    ]
    what = f"run {args.run}" + (f" task {args.task}" if args.task else "")
    if not attempts:
        raise CommandError(f"no attempts of {what} in namespace {namespace} have run yet")
    failures = 0
    for task, number in attempts:
        title = f"{task} attempt {number}"
        try:
            text = client.text(
                _run_path(namespace, args.run, "tasks", task, "attempts", str(number), "log")
            )
        except CommandError as error:
            failures += 1
            print(f"flowforge logs: {title}: {error}", file=sys.stderr)
            continue
        if len(attempts) > 1:
            print(f"==> {title} <==")
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return EXIT_FAILED if failures else EXIT_OK
