"""``flowforge validate | fingerprint | plan``: offline checks of WorkflowDefinition files.

They read YAML the way the Kubernetes API server does and run the same validators the
admission webhook runs, so a pipeline gets the cluster's verdict before it applies anything.
Documents of another kind are passed over. A file that does not parse is invalid input (1);
one that cannot be opened is a usage error (2), as argparse's FileType reports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from flowforge.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    emit,
    table,
)
from flowforge.domain.api import DEFINITION_KIND, GROUP
from flowforge.domain.errors import (
    DefinitionError,
    DefinitionSchemaError,
    InvalidDefinitionError,
    ManifestError,
)
from flowforge.domain.expansion import CONDITION_FALSE
from flowforge.domain.manifests import ManifestDocument, read_documents
from flowforge.domain.models import ApprovalSpec, DefinitionSpec
from flowforge.domain.planning import Plan, plan
from flowforge.domain.validation import parse_definition


@dataclass(frozen=True, slots=True)
class _Verdict:
    """One WorkflowDefinition document of a file, checked once: its errors or its model."""

    file: str
    document: ManifestDocument
    errors: tuple[DefinitionError, ...]
    definition: DefinitionSpec | None

    @classmethod
    def of(cls, file: str, document: ManifestDocument) -> _Verdict:
        if "spec" not in document.body:
            missing = DefinitionSchemaError('missing required field "spec"', path="spec")
            return cls(file, document, (missing,), None)
        try:
            definition = parse_definition(document.body["spec"])
        except InvalidDefinitionError as invalid:
            return cls(file, document, invalid.errors, None)
        return cls(file, document, (), definition)

    @property
    def name(self) -> str | None:
        metadata = self.document.body.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        return name if isinstance(name, str) else None

    @property
    def where(self) -> str:
        label = self.name if self.name is not None else "(no metadata.name)"
        return f"{self.file}:{self.document.line}: {DEFINITION_KIND} {label}"

    @property
    def resource_name(self) -> str:
        return f"{DEFINITION_KIND.lower()}.{GROUP}/{self.name or ''}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "index": self.document.index,
            "name": self.name,
            "valid": not self.errors,
            "fingerprint": None if self.definition is None else self.definition.fingerprint,
            "errors": [error.to_dict() for error in self.errors],
        }


def _verdicts_of(path: str) -> list[_Verdict]:
    """The checked WorkflowDefinition documents of a file.

    A file that cannot be opened is a usage error; one that does not parse, a ManifestError.
    """
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as stream:
                text = stream.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CommandError(f"{path}: cannot read the file: {reason}", exit_code=EXIT_USAGE) from exc
    return [
        _Verdict.of(path, document)
        for document in read_documents(text, source=path)
        if document.body.get("kind") == DEFINITION_KIND
    ]


def _error_lines(verdict: _Verdict) -> list[str]:
    return [f"  {error.path}: {error.message} [{error.kind}]" for error in verdict.errors]


def run_validate(args: argparse.Namespace) -> int:
    verdicts: list[_Verdict] = []
    status = EXIT_OK
    for path in args.files:
        try:
            verdicts.extend(_verdicts_of(path))
        except (CommandError, ManifestError) as exc:
            print(f"flowforge validate: {exc}", file=sys.stderr)
            code = exc.exit_code if isinstance(exc, CommandError) else EXIT_FAILED
            status = max(status, code)

    def text(wide: bool) -> str:
        lines = []
        for verdict in verdicts:
            if verdict.definition is None:
                lines += [f"{verdict.where}: invalid", *_error_lines(verdict)]
            else:
                suffix = f" {verdict.definition.fingerprint}" if wide else ""
                lines.append(f"{verdict.where}: valid{suffix}")
        return "".join(f"{line}\n" for line in lines)

    emit(
        args.output,
        data=lambda: [verdict.to_dict() for verdict in verdicts],
        table=text,
        names=lambda: (verdict.resource_name for verdict in verdicts),
    )
    if not verdicts and status == EXIT_OK:
        print("no WorkflowDefinition documents found", file=sys.stderr)
    if any(verdict.errors for verdict in verdicts):
        status = max(status, EXIT_FAILED)
    return status


def _valid_definitions(path: str) -> tuple[list[_Verdict], int]:
    """The valid definitions of a file, and the exit code the invalid ones call for (their
    errors are printed)."""
    verdicts = _verdicts_of(path)
    for verdict in verdicts:
        if verdict.errors:
            print("\n".join([f"{verdict.where}: invalid", *_error_lines(verdict)]), file=sys.stderr)
    valid = [verdict for verdict in verdicts if verdict.definition is not None]
    return valid, EXIT_FAILED if len(valid) < len(verdicts) else EXIT_OK


def run_fingerprint(args: argparse.Namespace) -> int:
    valid, status = _valid_definitions(args.file)
    if status == EXIT_OK and not valid:
        raise CommandError(f"{args.file}: no WorkflowDefinition documents", exit_code=EXIT_USAGE)

    def text(wide: bool) -> str:
        if not wide:
            return "".join(f"{verdict.to_dict()['fingerprint']}\n" for verdict in valid)
        return table(
            ["FILE", "NAME", "WORKFLOW", "VERSION", "FINGERPRINT"],
            [_fingerprint_row(verdict) for verdict in valid],
        )

    emit(
        args.output,
        data=lambda: [verdict.to_dict() for verdict in valid],
        table=text,
        names=lambda: (verdict.resource_name for verdict in valid),
    )
    return status


def _fingerprint_row(verdict: _Verdict) -> list[str]:
    definition = verdict.definition
    assert definition is not None
    return [
        f"{verdict.file}:{verdict.document.line}",
        verdict.name or "-",
        definition.workflow,
        str(definition.version),
        definition.fingerprint,
    ]


def run_plan(args: argparse.Namespace) -> int:
    valid, status = _valid_definitions(args.file)
    if status != EXIT_OK:
        return status
    if len(valid) != 1:
        raise CommandError(
            f"{args.file} holds {len(valid)} WorkflowDefinition documents; plan needs exactly one",
            exit_code=EXIT_USAGE,
        )
    definition = valid[0].definition
    assert definition is not None
    schedule = plan(definition, parameter_values(definition, args.parameters))
    emit(
        args.output,
        data=schedule.to_dict,
        table=lambda wide: (
            _plan_table(definition, schedule) if wide else _plan_text(definition, schedule)
        ),
        names=lambda: (f"task/{key}" for key in schedule.order),
    )
    return EXIT_OK


def parameter_values(definition: DefinitionSpec, pairs: list[str]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs as a run's ``spec.parameters``: the text of a string (or an
    undeclared) parameter, the JSON of any other."""
    types = {declaration.name: declaration.type for declaration in definition.parameters}
    values: dict[str, Any] = {}
    for pair in pairs:
        name, equals, text = pair.partition("=")
        if not equals or not name:
            raise CommandError(f"-p {pair!r}: expected NAME=VALUE", exit_code=EXIT_USAGE)
        if types.get(name, "string") == "string":
            values[name] = text
            continue
        try:
            values[name] = json.loads(text)
        except ValueError:
            raise CommandError(
                f"-p {name}: {text!r} is not JSON (parameter {name} is of type {types[name]})",
                exit_code=EXIT_USAGE,
            ) from None
    return values


def _plan_table(definition: DefinitionSpec, schedule: Plan) -> str:
    level_of = {key: number for number, level in enumerate(schedule.levels) for key in level}
    tasks = {key: definition.task_of(key) for key in [*schedule.order, *schedule.skipped]}
    return table(
        ["TASK", "LEVEL", "TYPE", "DEPENDS-ON", "COMPENSATOR"],
        [
            [
                key,
                str(level_of[key]),
                tasks[key].type or "approval",
                ",".join(sorted(tasks[key].depends_on)) or "-",
                schedule.compensation.get(key, "-"),
            ]
            for key in schedule.order
        ]
        + [
            [
                key,
                CONDITION_FALSE,  # in no level: the run skips it
                tasks[key].type or "approval",
                ",".join(sorted(tasks[key].depends_on)) or "-",
                "-",
            ]
            for key in schedule.skipped
        ],
    )


def _plan_text(definition: DefinitionSpec, schedule: Plan) -> str:
    lines = [
        f"workflow {definition.workflow} version {definition.version}  {definition.fingerprint}",
        f"{len(schedule.order)} tasks in {len(schedule.levels)} levels "
        "(a level starts when the one above it has succeeded):",
    ]
    if schedule.parameters:
        lines.append(f"parameters: {json.dumps(dict(schedule.parameters), sort_keys=True)}")
    width = len(str(len(schedule.levels) - 1))
    for number, level in enumerate(schedule.levels):
        lines.append(f"  level {number:>{width}}: {'  '.join(level)}")
    for key, when in schedule.skipped.items():
        lines.append(f"  skipped {key}: {CONDITION_FALSE} (when {when})")
    for task in definition.forward_tasks:
        if task.approval is not None and task.key in _planned(schedule):
            lines.append(f"  approval gate {task.key}: {_approval_text(task.approval)}")
    if schedule.compensation:
        lines.append("compensation on failure (run one at a time, last succeeded first):")
        key_width = max(len(key) for key in schedule.compensation)
        for forward, compensator in schedule.compensation.items():
            lines.append(f"  {forward:<{key_width}}  undone by  {compensator}")
    else:
        lines.append("compensation on failure: none declared")
    if definition.finally_tasks:
        order = " -> ".join(task.key for task in definition.finally_tasks)
        lines.append(f"finally (once the outcome is decided, one at a time): {order}")
    return "\n".join(lines) + "\n"


def _planned(schedule: Plan) -> set[str]:
    """The keys the run runs (in a level)."""
    return {key for level in schedule.levels for key in level}


def _approval_text(approval: ApprovalSpec) -> str:
    """How a gate passes, as ``plan`` prints it."""
    approvers = approval.approvers
    who = (
        "anyone with the approve verb"
        if approvers is None
        else ", ".join([*approvers.users, *(f"group {g}" for g in approvers.groups)])
    )
    text = f"{approval.required} approval(s) from {who}"
    if approval.forbid_self:
        text += ", not the run's creator"
    if approval.timeout_seconds is not None:
        text += f"; rejected after {approval.timeout_seconds} s"
    return text
