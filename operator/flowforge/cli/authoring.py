"""``flowforge render | graph``: from Python to manifests, and from manifests to pictures.

``render module:attr`` imports a workflow written with :mod:`flowforge.sdk` (a document, a
list of documents, or a callable returning either) and prints it as YAML for a GitOps
repository, or as JSON. ``graph FILE`` draws the DAG of a WorkflowDefinition file as Mermaid
or Graphviz DOT text. Exit codes: 0 success, 1 an invalid definition, 2 usage errors and
inputs that cannot be read or imported.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from flowforge.domain.errors import (
    DefinitionError,
    DefinitionSchemaError,
    ManifestError,
    UserError,
)
from flowforge.domain.manifests import ManifestDocument, read_documents
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.rendering import (
    DIRECTIONS,
    GRAPH_FORMATS,
    MERMAID_DEFAULT_MAX_EDGES,
    Direction,
    GraphFormat,
    edge_count,
    render_graph,
)
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.sdk import DEFINITION_KIND, to_yaml

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


class _CommandError(Exception):
    """One line for the user, and the exit code it calls for."""

    def __init__(self, message: str, *, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class GraphSource:
    """What ``graph`` draws: a definition and, for a run, the state of each task."""

    definition: DefinitionSpec
    states: Mapping[str, str] | None = None


GraphSourceLoader = Callable[[argparse.Namespace], GraphSource]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    render = subparsers.add_parser(
        "render",
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
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="output format"
    )
    render.set_defaults(handler=run_render)

    graph = subparsers.add_parser(
        "graph",
        help="draw the DAG of a WorkflowDefinition as Mermaid or Graphviz DOT text",
        description=(
            "Print the DAG of the WorkflowDefinition in FILE (choose one with --name when the "
            "file holds several): forward tasks with their dependencies, and compensators as "
            "hexagons with a dashed edge to the task they undo. Paste Mermaid into Markdown; "
            "pipe DOT into `dot -Tsvg`."
        ),
    )
    graph.add_argument("source", metavar="FILE", help="a YAML or JSON manifest ('-' for stdin)")
    graph.add_argument(
        "-f", "--format", choices=GRAPH_FORMATS, default="mermaid", dest="graph_format"
    )
    graph.add_argument(
        "--direction", choices=DIRECTIONS, default="TD", help="top-down (TD) or left-right (LR)"
    )
    graph.add_argument("--name", help="metadata.name or spec.workflow of the definition to draw")
    graph.set_defaults(handler=run_graph, graph_source_loader=load_definition_file)


def run_render(args: argparse.Namespace) -> int:
    try:
        documents = _documents_of(_import_target(args.target))
        for position, document in enumerate(documents):
            _check_definition(document, position=position)
    except _CommandError as exc:
        return _fail("render", exc, verbose=args.verbose)
    if args.output == "json":
        payload: Any = (
            documents[0]
            if len(documents) == 1
            else {"apiVersion": "v1", "kind": "List", "items": documents}
        )
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(to_yaml(documents))
    return EXIT_OK


def run_graph(args: argparse.Namespace) -> int:
    loader: GraphSourceLoader = args.graph_source_loader
    try:
        source = loader(args)
        text = graph_text(source, output_format=args.graph_format, direction=args.direction)
    except _CommandError as exc:
        return _fail("graph", exc, verbose=args.verbose)
    edges = edge_count(source.definition)
    if args.graph_format == "mermaid" and edges > MERMAID_DEFAULT_MAX_EDGES:
        print(
            f"flowforge graph: note: {edges} edges; Mermaid renderers refuse more than "
            f"{MERMAID_DEFAULT_MAX_EDGES} unless configured with a higher maxEdges "
            "(or use --format dot)",
            file=sys.stderr,
        )
    sys.stdout.write(text)
    return EXIT_OK


def graph_text(source: GraphSource, *, output_format: GraphFormat, direction: Direction) -> str:
    """The drawing of ``source``; a states mapping naming unknown tasks is a usage error."""
    try:
        return render_graph(
            source.definition,
            output_format=output_format,
            direction=direction,
            states=source.states,
        )
    except ValueError as exc:
        raise _CommandError(str(exc)) from exc


def load_definition_file(args: argparse.Namespace) -> GraphSource:
    """The one WorkflowDefinition of ``args.source`` (or the one called ``args.name``)."""
    path: str = args.source
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        documents = read_documents(text, source=path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _CommandError(f"{path}: cannot read the file: {reason}") from exc
    except ManifestError as exc:
        raise _CommandError(str(exc)) from exc
    definitions = [doc for doc in documents if doc.body.get("kind") == DEFINITION_KIND]
    if args.name is not None:
        definitions = [doc for doc in definitions if args.name in _names_of(doc)]
    if len(definitions) != 1:
        wanted = DEFINITION_KIND if args.name is None else f"{DEFINITION_KIND} {args.name!r}"
        hint = " (choose one with --name)" if len(definitions) > 1 else ""
        raise _CommandError(f"{path} holds {len(definitions)} {wanted} documents{hint}")
    document = definitions[0]
    errors = validate_spec(document.body.get("spec"))
    if errors:
        details = "; ".join(f"{error.path}: {error.message}" for error in errors)
        raise _CommandError(
            f"{path}:{document.line}: invalid {DEFINITION_KIND}: {details}",
            exit_code=EXIT_INVALID,
        )
    return GraphSource(definition=parse_definition(document.body["spec"]))


def _names_of(document: ManifestDocument) -> set[str]:
    metadata, spec = document.body.get("metadata"), document.body.get("spec")
    names = {metadata.get("name")} if isinstance(metadata, dict) else set()
    if isinstance(spec, dict):
        names.add(spec.get("workflow"))
    return {name for name in names if isinstance(name, str)}


def _import_target(target: str) -> object:
    module_name, separator, attribute_path = target.rpartition(":")
    if not separator or not module_name or not attribute_path:
        raise _CommandError(f"{target!r} is not MODULE:ATTR (for example pipelines.etl:etl)")
    module = _import_module(module_name)
    value: object = module
    for attribute in attribute_path.split("."):
        try:
            value = getattr(value, attribute)
        except AttributeError as exc:
            raise _CommandError(f"{module_name} has no attribute {attribute_path!r}") from exc
    if callable(value):
        try:
            value = value()
        except UserError as exc:
            raise _CommandError(f"{target}: {exc}", exit_code=EXIT_INVALID) from exc
        except Exception as exc:
            raise _CommandError(f"calling {target} failed: {type(exc).__name__}: {exc}") from exc
    return value


def _import_module(module_name: str) -> ModuleType:
    if module_name.endswith(".py") or os.sep in module_name:
        return _import_file(Path(module_name))
    added_to_path = "" not in sys.path and os.getcwd() not in sys.path
    if added_to_path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except UserError as exc:
        raise _CommandError(f"{module_name}: {exc}", exit_code=EXIT_INVALID) from exc
    except Exception as exc:
        raise _CommandError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from exc
    finally:
        if added_to_path:
            sys.path.remove(os.getcwd())


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise _CommandError(f"{path}: no such file")
    name = f"_flowforge_render_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _CommandError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except UserError as exc:
        raise _CommandError(f"{path}: {exc}", exit_code=EXIT_INVALID) from exc
    except Exception as exc:
        raise _CommandError(f"cannot import {path}: {type(exc).__name__}: {exc}") from exc
    return module


def _documents_of(value: object) -> list[dict[str, Any]]:
    items: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    documents = [dict(item) for item in items if isinstance(item, Mapping)]
    if not documents or len(documents) != len(items):
        raise _CommandError(
            "the target must be a manifest document (a mapping), a list of them, or a "
            f"callable returning one; got {type(value).__name__}"
        )
    return documents


def _check_definition(document: Mapping[str, Any], *, position: int) -> None:
    if document.get("kind") != DEFINITION_KIND:
        return
    errors: list[DefinitionError]
    if "spec" not in document:
        errors = [DefinitionSchemaError('missing required field "spec"', path="spec")]
    else:
        errors = validate_spec(document["spec"])
    if errors:
        details = "; ".join(f"{error.path}: {error.message}" for error in errors)
        raise _CommandError(
            f"document {position} is an invalid {DEFINITION_KIND}: {details}",
            exit_code=EXIT_INVALID,
        )


def _fail(command: str, error: _CommandError, *, verbose: bool) -> int:
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    print(f"flowforge {command}: {error}", file=sys.stderr)
    return error.exit_code
