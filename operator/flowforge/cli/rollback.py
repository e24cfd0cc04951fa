"""``flowforge rollback retry|skip RUN COMPENSATOR`` (finish a halted rollback),
``flowforge pause|resume RUN`` and ``flowforge approve|reject RUN TASK`` (an approval gate).

Each creates a WorkflowRunAction (``flowforge.domain.run_actions``) through the Kubernetes
API as the user, so admission records them as the actor and checks their ``recover`` (``pause``,
``approve``) verb on the run; the operator applies it once and writes the result to its status
(``kubectl get wfa`` shows it; ``flowforge describe run`` the history).
"""

from __future__ import annotations

import argparse
from typing import Any

from kubernetes import client as k8s

from flowforge.cli.connections import kube_client, resolve_namespace
from flowforge.cli.output import EXIT_OK, CommandError, emit
from flowforge.domain.api import API_VERSION, GROUP, VERSION
from flowforge.domain.run_actions import KIND, PLURAL, RunActionKind, parse_action
from flowforge.kube.errors import kubernetes_errors

_ACTIONS = {
    "retry": RunActionKind.RETRY_COMPENSATOR,
    "skip": RunActionKind.SKIP_COMPENSATOR,
    "pause": RunActionKind.PAUSE,
    "resume": RunActionKind.RESUME,
    "approve": RunActionKind.APPROVE,
    "reject": RunActionKind.REJECT,
}


def action_body(args: argparse.Namespace) -> dict[str, Any]:
    """The WorkflowRunAction ``args`` ask for; a CommandError naming what is wrong."""
    kind = _ACTIONS[args.action_verb]
    spec: dict[str, Any] = {"run": args.run, "action": kind.value}
    if getattr(args, "compensator", None):
        spec["compensator"] = args.compensator
    if getattr(args, "task", None):
        spec["task"] = args.task
    if args.reason:
        spec["reason"] = args.reason
    _, errors = parse_action(spec)
    if errors:
        raise CommandError("; ".join(f"{path}: {problem}" for path, problem in errors))
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"generateName": f"{args.run[:40]}-{args.action_verb}-"},
        "spec": spec,
    }


def rollback_action(args: argparse.Namespace) -> int:
    body = action_body(args)
    namespace = resolve_namespace(args)
    with kube_client(args) as api:
        custom = k8s.CustomObjectsApi(api)
        with kubernetes_errors():
            created: Any = custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body
            )
    name = str(created["metadata"]["name"])
    what = f"{PLURAL[:-1]}.{GROUP}/{name}"
    part = body["spec"].get("compensator") or body["spec"].get("task")
    target = f"{part} of {args.run}" if part else args.run
    emit(
        args.output,
        data=lambda: created,
        table=lambda _wide: (
            f"{what} created: {body['spec']['action']} "
            f"{target} (kubectl get wfa {name} shows the result)\n"
        ),
        names=lambda: [what],
    )
    return EXIT_OK
