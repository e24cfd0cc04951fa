"""``flowforge validate | fingerprint | plan``: offline checks of WorkflowDefinition files.

They read YAML the way the Kubernetes API server does and run the same validators the
admission webhook runs, so a pipeline gets the cluster's verdict before it applies anything.
Documents of another kind are passed over. Exit codes: 0 valid, 1 invalid, 2 usage errors
and files that cannot be read or parsed.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from flowforge.domain.api import DEFINITION_KIND
from flowforge.domain.errors import DefinitionError, DefinitionSchemaError, ManifestError
from flowforge.domain.manifests import ManifestDocument, read_documents
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.planning import Plan, plan
from flowforge.domain.validation import parse_definition, validate_spec

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


@dataclass(frozen=True, slots=True)
class _Verdict:
    file: str
    document: ManifestDocument
    errors: list[DefinitionError]

    @property
    def name(self) -> str | None:
        return _name(self.document)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "index": self.document.index,
            "name": self.name,
            "valid": not self.errors,
            "errors": [error.to_dict() for error in self.errors],
        }


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    validate = subparsers.add_parser(
        "validate",
        help="validate WorkflowDefinition manifests offline",
        description=(
            "Validate every WorkflowDefinition document in the files (other kinds are passed "
            "over). Exit 0 when all are valid, 1 when any is invalid, 2 when a file cannot be "
            "read or parsed. With -o json, print one array with an object per definition: "
            '{"file", "index" (the document\'s position in its file, from 0), "name", '
            '"valid", "errors": [{"kind", "path", "message"}]}.'
        ),
    )
    _add_output_option(validate)
    validate.add_argument("files", nargs="+", metavar="FILE", help="a YAML or JSON manifest")
    validate.set_defaults(handler=run_validate)

    fingerprint = subparsers.add_parser(
        "fingerprint",
        help="print the fingerprint of each WorkflowDefinition in a file",
        description="Print one sha256:<hex> line per WorkflowDefinition in FILE, in file order.",
    )
    fingerprint.add_argument("file", metavar="FILE", help="a YAML or JSON manifest")
    fingerprint.set_defaults(handler=run_fingerprint)

    plan_parser = subparsers.add_parser(
        "plan",
        help="show the schedule of a WorkflowDefinition",
        description=(
            "Show the order, the levels and the compensators of the one WorkflowDefinition in "
            'FILE. With -o json: {"order": [...], "levels": [[...], ...], '
            '"compensation": {"<task>": "<compensator>"}}.'
        ),
    )
    _add_output_option(plan_parser)
    plan_parser.add_argument("file", metavar="FILE", help="a YAML or JSON manifest")
    plan_parser.set_defaults(handler=run_plan)


def _add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="output format"
    )


def _definitions_in(path: str) -> list[ManifestDocument]:
    """The WorkflowDefinition documents of a file; ManifestError when it cannot be read."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as stream:
                text = stream.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ManifestError(f"cannot read the file: {reason}", source=path) from exc
    return [
        document
        for document in read_documents(text, source=path)
        if document.body.get("kind") == DEFINITION_KIND
    ]


def _errors_of(document: ManifestDocument) -> list[DefinitionError]:
    if "spec" not in document.body:
        return [DefinitionSchemaError('missing required field "spec"', path="spec")]
    return validate_spec(document.body["spec"])


def _describe(file: str, document: ManifestDocument, name: str | None) -> str:
    label = name if name is not None else "(no metadata.name)"
    return f"{file}:{document.line}: {DEFINITION_KIND} {label}"


def run_validate(args: argparse.Namespace) -> int:
    verdicts: list[_Verdict] = []
    unreadable = False
    for path in args.files:
        try:
            documents = _definitions_in(path)
        except ManifestError as exc:
            print(f"flowforge validate: {exc}", file=sys.stderr)
            unreadable = True
            continue
        verdicts.extend(_Verdict(path, document, _errors_of(document)) for document in documents)
    if args.output == "json":
        print(json.dumps([verdict.to_dict() for verdict in verdicts], indent=2))
    else:
        for verdict in verdicts:
            header = _describe(verdict.file, verdict.document, verdict.name)
            print(f"{header}: {'valid' if not verdict.errors else 'invalid'}")
            for error in verdict.errors:
                print(f"  {error.path}: {error.message} [{error.kind}]")
        if not verdicts and not unreadable:
            print("no WorkflowDefinition documents found", file=sys.stderr)
    if unreadable:
        return EXIT_USAGE
    return EXIT_INVALID if any(verdict.errors for verdict in verdicts) else EXIT_OK


def _parse_all(
    path: str, command: str
) -> tuple[list[tuple[ManifestDocument, DefinitionSpec]], int]:
    """The parsed definitions of a file and the exit code its problems call for."""
    try:
        documents = _definitions_in(path)
    except ManifestError as exc:
        print(f"flowforge {command}: {exc}", file=sys.stderr)
        return [], EXIT_USAGE
    parsed: list[tuple[ManifestDocument, DefinitionSpec]] = []
    status = EXIT_OK
    for document in documents:
        errors = _errors_of(document)
        if errors:
            status = EXIT_INVALID
            print(f"{_describe(path, document, _name(document))}: invalid", file=sys.stderr)
            for error in errors:
                print(f"  {error.path}: {error.message} [{error.kind}]", file=sys.stderr)
            continue
        parsed.append((document, parse_definition(document.body["spec"])))
    return parsed, status


def _name(document: ManifestDocument) -> str | None:
    metadata = document.body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def run_fingerprint(args: argparse.Namespace) -> int:
    parsed, status = _parse_all(args.file, "fingerprint")
    for _, definition in parsed:
        print(definition.fingerprint)
    if status == EXIT_OK and not parsed:
        print(
            f"flowforge fingerprint: {args.file}: no WorkflowDefinition documents", file=sys.stderr
        )
        return EXIT_USAGE
    return status


def run_plan(args: argparse.Namespace) -> int:
    parsed, status = _parse_all(args.file, "plan")
    if status != EXIT_OK:
        return status
    if len(parsed) != 1:
        print(
            f"flowforge plan: {args.file} holds {len(parsed)} WorkflowDefinition documents; "
            "plan needs exactly one",
            file=sys.stderr,
        )
        return EXIT_USAGE
    _, definition = parsed[0]
    schedule = plan(definition)
    if args.output == "json":
        print(json.dumps(schedule.to_dict(), indent=2))
    else:
        print(_plan_text(definition, schedule))
    return EXIT_OK


def _plan_text(definition: DefinitionSpec, schedule: Plan) -> str:
    lines = [
        f"workflow {definition.workflow} version {definition.version}  {definition.fingerprint}",
        f"{len(schedule.order)} tasks in {len(schedule.levels)} levels "
        "(a level starts when the one above it has succeeded):",
    ]
    width = len(str(len(schedule.levels) - 1))
    for number, level in enumerate(schedule.levels):
        lines.append(f"  level {number:>{width}}: {'  '.join(level)}")
    if schedule.compensation:
        lines.append("compensation on failure (run one at a time, last succeeded first):")
        key_width = max(len(key) for key in schedule.compensation)
        for forward, compensator in schedule.compensation.items():
            lines.append(f"  {forward:<{key_width}}  undone by  {compensator}")
    else:
        lines.append("compensation on failure: none declared")
    return "\n".join(lines)
