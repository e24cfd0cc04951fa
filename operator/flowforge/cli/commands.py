"""Every ``flowforge`` command, its arguments and its help: the whole grammar in one place.

One grammar, kubectl's: ``flowforge VERB [TYPE] [NAME] [flags]``. Verbs on definition files
(``validate``, ``fingerprint``, ``plan``, ``graph``, ``render``) take the files; verbs on runs
(``get``, ``describe``) take a resource type as kubectl does, and those that only apply to a
run (``cancel``, ``retry``, ``logs``) take its name; ``db`` groups the store's administration
as ``kubectl config`` groups the kubeconfig's. ``runs list`` and ``runs show`` remain as hidden
aliases of ``get runs`` and ``describe run``.

Building the parser imports only argparse: each handler is named as ``module:function`` and
imported when its command runs, so ``flowforge --help`` does not load the Kubernetes client,
psycopg or pydantic.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import TYPE_CHECKING

from flowforge.cli.lazy import LazyFunction, LazyHandler
from flowforge.cli.output import add_output_option

DSN_VARIABLE = "FLOWFORGE_DSN"
SERVER_VARIABLE = "FLOWFORGE_SERVER"  # flowforge.cli.api_client.SERVER_VARIABLE
# the values of modules too heavy to import for --help; tests/unit/test_cli_grammar.py holds
# each equal to its source
GRAPH_FORMATS = ("mermaid", "dot")  # flowforge.domain.rendering.GRAPH_FORMATS
DIRECTIONS = ("TD", "LR")  # flowforge.domain.rendering.DIRECTIONS
WEBHOOK_CONFIGURATION = "flowforge-admission"  # flowforge.kube.webhook_config
OPERATOR_LEASE = "operator"  # flowforge.store.lease.DEFAULT_LEASE
RUN_TYPES = ("runs", "run", "workflowruns", "workflowrun", "wfr")
SCHEDULE_TYPES = ("schedules", "schedule", "workflowschedules", "workflowschedule", "wfs")

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

if TYPE_CHECKING:
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s`` or ``2w``."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit s, m, h, d or w (e.g. 30d)"
        )
    return timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])


MIN_PRUNE_AGE = timedelta(hours=1)


def parse_prune_age(text: str) -> timedelta:
    """A duration of at least an hour: ``0s`` would delete the history of every finished run,
    including those that finished a moment ago and are still being looked at."""
    age = parse_duration(text)
    if age < MIN_PRUNE_AGE:
        raise argparse.ArgumentTypeError(
            f"--older-than {text.strip()} is under 1h: it would delete the history of runs "
            "that just finished; give at least 1h (e.g. 30d)"
        )
    return age


def refuse_token_on_argv(_: str) -> str:
    raise argparse.ArgumentTypeError(
        "a token on the command line is visible to every user of this machine (ps, shell "
        "history): use --token-file FILE (e.g. --token-file <(kubectl create token NAME)) "
        "or $FLOWFORGE_TOKEN"
    )


def register_all(subparsers: Subcommands) -> None:
    _register_definition_files(subparsers)
    _register_runs(subparsers)
    _register_schedules(subparsers)
    _register_operations(subparsers)


def _command(
    subparsers: Subcommands, name: str, *, handler: str, help: str, description: str = ""
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help, description=description or help)
    parser.set_defaults(handler=LazyHandler(handler), command_name=name)
    return parser


def add_store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn", default=None, help=f"PostgreSQL connection string (default: ${DSN_VARIABLE})"
    )


def add_kube_options(parser: argparse.ArgumentParser, *, namespace: bool = True) -> None:
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    if namespace:
        parser.add_argument(
            "-n",
            "--namespace",
            default=None,
            help="namespace (default: the kubeconfig context's, else default)",
        )


def add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help=f"flowforge server to read through as yourself (default: ${SERVER_VARIABLE}, "
        "else server: in ~/.config/flowforge/config.yaml)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="file holding the bearer token for the server (default: $FLOWFORGE_TOKEN, else "
        "the kubeconfig context's)",
    )
    parser.add_argument("--token", type=refuse_token_on_argv, help=argparse.SUPPRESS)
    parser.add_argument(
        "--allow-http",
        action="store_true",
        help="send the token to a server on plain http:// other than this machine's loopback "
        "(anyone on the path can read it)",
    )
    parser.add_argument(
        "--admin",
        action="store_true",
        help="read the store directly with --dsn / $FLOWFORGE_DSN (administrators; without "
        "--admin or --dsn, $FLOWFORGE_DSN is not read)",
    )


def _add_store_and_kube(parser: argparse.ArgumentParser) -> None:
    add_store_option(parser)
    add_kube_options(parser)


def _add_reader_options(parser: argparse.ArgumentParser) -> None:
    _add_store_and_kube(parser)
    add_server_options(parser)


# definition files


def _register_definition_files(subparsers: Subcommands) -> None:
    validate = _command(
        subparsers,
        "validate",
        handler="flowforge.cli.definitions:run_validate",
        help="validate WorkflowDefinition manifests offline, as the cluster would",
        description=(
            "Validate every WorkflowDefinition document in the files (other kinds are passed "
            "over), reading YAML as the Kubernetes API server reads it. Exit 0 when all are "
            "valid, 1 when any is invalid or a file does not parse, 2 when a file cannot be "
            "opened. -o json|yaml: one list with an item per definition: {file, index (the "
            "document's position in its file, from 0), name, valid, fingerprint, errors: "
            "[{kind, path, message}]}; -o wide adds the fingerprint of each valid one."
        ),
    )
    add_output_option(validate)
    validate.add_argument("files", nargs="+", metavar="FILE", help="a YAML or JSON manifest")

    fingerprint = _command(
        subparsers,
        "fingerprint",
        handler="flowforge.cli.definitions:run_fingerprint",
        help="print the fingerprint of each WorkflowDefinition in a file",
        description="Print one sha256:<hex> line per WorkflowDefinition in FILE, in file order "
        "(-o wide: with its name, workflow and version).",
    )
    add_output_option(fingerprint)
    fingerprint.add_argument("file", metavar="FILE", help="a YAML or JSON manifest")

    plan = _command(
        subparsers,
        "plan",
        handler="flowforge.cli.definitions:run_plan",
        help="show the schedule of a WorkflowDefinition: levels and compensation",
        description=(
            "Show the order, the levels and the compensators of a run of the one "
            "WorkflowDefinition in FILE with the parameters given by -p. -o json|yaml: {order: "
            "[...], levels: [[...], ...], compensation: {task: compensator}, parameters: {...}, "
            "skipped: [{task, reason, when}]}; -o wide: one row per task with its level, "
            "dependencies and compensator; -o name: the tasks in order."
        ),
    )
    add_output_option(plan)
    plan.add_argument("file", metavar="FILE", help="a YAML or JSON manifest")
    plan.add_argument(
        "-p",
        "--parameter",
        action="append",
        default=[],
        dest="parameters",
        metavar="NAME=VALUE",
        help="a run parameter (repeatable): VALUE as text for a string parameter, else JSON "
        '(-p \'regions=["eu","us"]\'); the plan is the run the operator would create: '
        "defaults filled in, tasks whose when is false skipped (ConditionFalse)",
    )

    graph = _command(
        subparsers,
        "graph",
        handler="flowforge.cli.authoring:run_graph",
        help="draw the DAG of a definition file or of a run as Mermaid or Graphviz DOT",
        description=(
            "Print the DAG of the WorkflowDefinition in FILE (choose one with --name when the "
            "file holds several), or of the run RUN coloured by the state of each task: forward "
            "tasks with their dependencies, and compensators as hexagons with a dashed edge to "
            "the task they undo. Paste Mermaid into Markdown; pipe DOT into `dot -Tsvg`."
        ),
    )
    graph.add_argument(
        "source",
        metavar="FILE|RUN",
        help="a YAML or JSON manifest ('-' for stdin), or the name of a run",
    )
    graph.add_argument(
        "-o",
        "--output",
        "--format",
        choices=GRAPH_FORMATS,
        default="mermaid",
        dest="graph_format",
        metavar="FORMAT",
        help="mermaid (default) or dot; --format is the same flag (not -f: kubectl's -f is a file)",
    )
    graph.add_argument(
        "--direction", choices=DIRECTIONS, default="TD", help="top-down (TD) or left-right (LR)"
    )
    graph.add_argument("--name", help="metadata.name or spec.workflow of the definition to draw")
    _add_reader_options(graph)
    graph.set_defaults(
        graph_source_loader=LazyFunction("flowforge.cli.graph_sources:load_graph_source")
    )

    render = _command(
        subparsers,
        "render",
        handler="flowforge.cli.authoring:run_render",
        help="print a workflow written in Python as a YAML manifest",
        description=(
            "Import TARGET, given as module:attribute (module may also be a path to a .py "
            "file; the current directory is importable), and print it as a manifest. The "
            "attribute is a WorkflowDefinition document built with flowforge.sdk.workflow, a "
            "list of documents, or a callable with no arguments returning either. Each "
            "WorkflowDefinition is validated as the cluster would validate it first."
        ),
    )
    render.add_argument("target", metavar="MODULE:ATTR", help="e.g. pipelines.etl:definition")
    render.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json", "name"),
        default="yaml",
        help="yaml (default), json (one object, or a List of several), or name (kind/name)",
    )


# runs


def _add_get_arguments(parser: argparse.ArgumentParser, *, names: str | int) -> None:
    parser.add_argument("runs", nargs=names, metavar="RUN", help="a WorkflowRun's name")
    _add_reader_options(parser)
    add_output_option(parser)


def _add_watch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="then follow the run live through the server: a line per change, until it ends",
    )


def _add_phase_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--phase",
        metavar="PHASE",
        help="only runs in this phase: Queued (the runs a limit holds back), Running, "
        "Succeeded, Failed or Cancelled",
    )


def _register_runs(subparsers: Subcommands) -> None:
    get = _command(
        subparsers,
        "get",
        handler="flowforge.cli.schedules:get",
        help="list runs from the store (kubectl get for WorkflowRuns, after they are gone too)",
        description=(
            "List the newest runs of a namespace from the store (the system of record, so "
            "this works after the WorkflowRun objects are deleted), newest first: workflow, "
            "version, phase, progress, age and duration; with RUN names, only those. -o wide "
            "adds uid, creation and finish times; -o json|yaml prints the runs (with their "
            "tasks when named); -o name prints workflowrun.flowforge.io/NAME lines."
        ),
    )
    get.add_argument(
        "type",
        choices=RUN_TYPES + SCHEDULE_TYPES,
        metavar="TYPE",
        help="runs (wfr), schedules (wfs)",
    )
    get.add_argument("--limit", type=int, default=50, help="how many runs (default 50)")
    _add_phase_option(get)
    _add_get_arguments(get, names="*")

    describe = _command(
        subparsers,
        "describe",
        handler="flowforge.cli.schedules:describe",
        help="one run in detail: every task's state, attempts, exit codes, the rollback",
        description=(
            "Show one run from the store: its phase, every forward task with its attempts, "
            "durations, exit codes and failure reasons, and the compensation steps in the "
            "order they ran. Works after the WorkflowRun object is gone. -o wide adds start "
            "and finish times and does not cut reasons short."
        ),
    )
    describe.add_argument(
        "type", choices=RUN_TYPES + SCHEDULE_TYPES, metavar="TYPE", help="run (wfr), schedule (wfs)"
    )
    _add_get_arguments(describe, names=1)
    _add_watch(describe)

    # the spellings of before `get`/`describe`, kept as hidden aliases
    runs = subparsers.add_parser("runs")
    aliases = runs.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)
    for alias, verb, handler, names in (
        ("list", "get", "flowforge.cli.schedules:get", "*"),
        ("show", "describe", "flowforge.cli.schedules:describe", 1),
    ):
        parser = aliases.add_parser(alias)
        if verb == "get":
            parser.add_argument("--limit", type=int, default=50)
            _add_phase_option(parser)
        _add_get_arguments(parser, names=names)
        if verb == "describe":
            _add_watch(parser)
        parser.set_defaults(handler=LazyHandler(handler), command_name=verb, type="runs")

    cancel = _command(
        subparsers,
        "cancel",
        handler="flowforge.cli.runs:cancel_run",
        help="stop a run (what succeeded is rolled back)",
        description="Set spec.cancel=true on the WorkflowRun; the operator stops its tasks "
        "and runs the compensators of what succeeded.",
    )
    cancel.add_argument("run", metavar="RUN")
    add_kube_options(cancel)
    add_output_option(cancel, forms=("json", "yaml", "name"), detail="(the WorkflowRun)")

    retry = _command(
        subparsers,
        "retry",
        handler="flowforge.cli.runs:retry_run",
        help="run a failed or cancelled run again, reusing what still stands",
        description="Create a new WorkflowRun RUN-retry-N with the same workflow, version and "
        "parameters and spec.retryOf: RUN (checked at admission). Tasks of RUN that succeeded and "
        "were not rolled back (nor depend on work that was) are not run again.",
    )
    retry.add_argument("run", metavar="RUN")
    _add_store_and_kube(retry)
    add_output_option(retry, forms=("json", "yaml", "name"), detail="(the new WorkflowRun)")

    rollback = subparsers.add_parser(
        "rollback",
        help="finish a halted rollback: retry or skip the compensator it halted at",
        description="Create a WorkflowRunAction as you (admission records you as its actor "
        "and checks the recover verb on the run); the operator applies it once and the "
        "rollback goes on in its order. The run stays Failed.",
    )
    verbs = rollback.add_subparsers(dest="rollback_command", metavar="COMMAND", required=True)
    for verb, help_text in (
        ("retry", "run the halted compensator again with fresh attempts"),
        ("skip", "mark the halted compensator skipped by you (--reason required)"),
    ):
        parser = verbs.add_parser(verb, help=help_text, description=help_text)
        parser.set_defaults(
            handler=LazyHandler("flowforge.cli.rollback:rollback_action"),
            command_name=f"rollback {verb}",
            action_verb=verb,
        )
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("compensator", metavar="COMPENSATOR")
        parser.add_argument(
            "--reason", default="", help="why (kept in the run's history; required for skip)"
        )
        add_kube_options(parser)
        add_output_option(parser, forms=("json", "yaml", "name"), detail="(the action)")

    for verb, help_text in (
        ("pause", "pause a run: no task or compensator starts until it is resumed"),
        ("resume", "resume a paused run (a cancel asked meanwhile is applied then)"),
    ):
        parser = subparsers.add_parser(
            verb,
            help=help_text,
            description=f"{help_text}. Creates a WorkflowRunAction as you (admission records "
            "you as its actor and checks the pause verb on the run); running Jobs finish.",
        )
        parser.set_defaults(
            handler=LazyHandler("flowforge.cli.rollback:rollback_action"),
            command_name=verb,
            action_verb=verb,
        )
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("--reason", default="", help="why (kept in the run's history)")
        add_kube_options(parser)
        add_output_option(parser, forms=("json", "yaml", "name"), detail="(the action)")

    for verb, help_text in (
        ("approve", "approve a run's approval gate (each person counts once)"),
        ("reject", "reject a run's approval gate: it fails and the run rolls back"),
    ):
        parser = subparsers.add_parser(
            verb,
            help=help_text,
            description=f"{help_text}. Creates a WorkflowRunAction as you (admission records "
            "you as its actor and checks the approve verb on the run); the gate's approvers "
            "decide whether it counts.",
        )
        parser.set_defaults(
            handler=LazyHandler("flowforge.cli.rollback:rollback_action"),
            command_name=verb,
            action_verb=verb,
        )
        parser.add_argument("run", metavar="RUN")
        parser.add_argument("task", metavar="TASK", help="the approval gate's task key")
        parser.add_argument(
            "--reason", default="", help="why (kept in the run's history; required for reject)"
        )
        add_kube_options(parser)
        add_output_option(parser, forms=("json", "yaml", "name"), detail="(the action)")

    logs = _command(
        subparsers,
        "logs",
        handler="flowforge.cli.runs:print_logs",
        help="the logs of a run's task Pods",
        description="Print the logs of the Pods of RUN (of its task TASK only, when given), "
        "every attempt, oldest first. Pods go with their Jobs: logs are gone once a Job is.",
    )
    logs.add_argument("run", metavar="RUN")
    logs.add_argument("task", metavar="TASK", nargs="?")
    add_kube_options(logs)
    add_server_options(logs)


def _register_schedules(subparsers: Subcommands) -> None:
    schedule = subparsers.add_parser(
        "schedule", help="act on a WorkflowSchedule: trigger, suspend, resume"
    )
    verbs = schedule.add_subparsers(dest="schedule_command", metavar="COMMAND", required=True)
    for verb, help in (
        ("trigger", "fire now, once, under the schedule's overlap policy"),
        ("suspend", "fire nothing until resumed"),
        ("resume", "fire again; missed times follow spec.catchup"),
    ):
        parser = verbs.add_parser(verb, help=help, description=help)
        parser.add_argument("name", metavar="NAME", help="the WorkflowSchedule's name")
        add_kube_options(parser)
        add_output_option(parser, forms=("json", "yaml", "name"), detail="(the schedule)")
        parser.set_defaults(
            handler=LazyHandler(f"flowforge.cli.schedules:{verb}"), command_name=f"schedule {verb}"
        )


# the installation


def _register_operations(subparsers: Subcommands) -> None:
    server = _command(
        subparsers,
        "server",
        handler="flowforge.server.main:run_from_cli",
        help="serve the read API and the web UI (flowforge server --help for its options)",
        description="Serve the read API (docs/api.md) and the web UI on 127.0.0.1:8080: every "
        "request authenticated with a TokenReview and authorised per namespace with "
        "SubjectAccessReviews. Options: --dsn (a flowforge_server login; "
        "$FLOWFORGE_SERVER_DSN), --kubeconfig, --host, --port, --poll-seconds.",
    )
    # its options are the server's own (flowforge.server.main), handed over unparsed
    server.set_defaults(options=[])
    doctor = _command(
        subparsers,
        "doctor",
        handler="flowforge.cli.doctor:run_doctor",
        help="check the cluster, CRDs, store, operator lease, runs and webhooks",
        description=(
            "Checks, in order: the cluster answers; the CRDs are installed, Established, and "
            "carry the schema this FlowForge generates; the store answers and its schema "
            "version is the one this FlowForge needs; an operator holds the lease; no run has "
            "been silent for too long; the admission webhook configurations exist, their CA "
            "is not expiring, and the webhook server answers with a certificate that CA "
            "signed. Each finding says what to do. Exit 0 when every check passes, 1 on "
            "findings. -o json|yaml: {ok, checks: [{check, ok, message, advice}]}."
        ),
    )
    add_store_option(doctor)
    add_kube_options(doctor, namespace=False)
    doctor.add_argument(
        "--webhook-configuration",
        default=WEBHOOK_CONFIGURATION,
        metavar="NAME",
        help=f"webhook configurations' name (default {WEBHOOK_CONFIGURATION})",
    )
    doctor.add_argument(
        "--lease", default=OPERATOR_LEASE, help=f"the operator's lease (default {OPERATOR_LEASE})"
    )
    doctor.add_argument(
        "--stuck-after",
        type=parse_duration,
        default=timedelta(minutes=30),
        metavar="DURATION",
        help="a running run with no event for this long is a finding (30m)",
    )
    doctor.add_argument(
        "--cert-warning",
        type=parse_duration,
        default=timedelta(days=7),
        metavar="DURATION",
        help="a certificate expiring sooner than this is a finding (7d)",
    )
    add_output_option(doctor, forms=("json", "yaml"))

    db = subparsers.add_parser("db", help="manage the PostgreSQL store: migrate, prune")
    db_commands = db.add_subparsers(dest="db_command", metavar="COMMAND", required=True)
    migrate = _command(
        db_commands,
        "migrate",
        handler="flowforge.cli.db:run_migrate",
        help="apply the schema migrations (a no-op when up to date)",
        description="Apply missing schema migrations in one transaction, under an advisory "
        "lock, as the flowforge_migrator role (the DSN's login must be a member once schema 4 "
        "is in). Refuses a database whose schema is newer than this FlowForge knows.",
    )
    add_store_option(migrate)
    migrate.add_argument(
        "--lock-timeout",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="give up when a statement waits longer than this for a table lock, e.g. 10s "
        "(default: wait)",
    )
    add_output_option(migrate, forms=("json", "yaml"))
    prune = _command(
        db_commands,
        "prune",
        handler="flowforge.cli.db:run_prune",
        help="delete finished runs' task rows and events older than a cutoff",
        description="Delete the task rows, dependency rows and events of runs that finished "
        "before the cutoff, as the flowforge_retention role (the DSN's login must be a "
        "member). Runs that are not finished are never touched; the run rows stay, "
        "with their final task counts.",
    )
    add_store_option(prune)
    prune.add_argument(
        "--older-than",
        required=True,
        type=parse_prune_age,
        metavar="DURATION",
        help="age of a run's finish before it is pruned, at least 1h, e.g. 30d",
    )
    add_output_option(prune, forms=("json", "yaml"))
    for parser in (migrate, prune):
        parser.set_defaults(command_name=f"db {parser.prog.split()[-1]}")
