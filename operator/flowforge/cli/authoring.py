"""``flowforge render | graph``: from Python to manifests, and from manifests to pictures.

``render module:attr`` imports a workflow written with :mod:`flowforge.sdk` (a document, a
list of documents, or a callable returning either) and prints it as YAML for a GitOps
repository, as JSON, or as kind/name lines. ``graph FILE`` draws the DAG of a
WorkflowDefinition file as Mermaid or Graphviz DOT text. A target or file that cannot be
imported or opened is a usage error (2, as argparse's own FileType reports it); an invalid
definition is 1.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from flowforge.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    to_json,
)
from flowforge.domain.errors import DefinitionError, DefinitionSchemaError, UserError
from flowforge.domain.manifests import ManifestDocument, read_documents
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.rendering import (
    MERMAID_DEFAULT_MAX_EDGES,
    Direction,
    GraphFormat,
    edge_count,
    render_graph,
)
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.sdk import DEFINITION_KIND, to_yaml


@dataclass(frozen=True, slots=True)
class GraphSource:
    """What ``graph`` draws: a definition and, for a run, the state of each task."""

    definition: DefinitionSpec
    states: Mapping[str, str] | None = None


GraphSourceLoader = Callable[[argparse.Namespace], GraphSource]


def run_render(args: argparse.Namespace) -> int:
    documents = _documents_of(_import_target(args.target))
    for position, document in enumerate(documents):
        _check_definition(document, position=position)
    if args.output == "json":
        payload: Any = (
            documents[0]
            if len(documents) == 1
            else {"apiVersion": "v1", "kind": "List", "items": documents}
        )
        sys.stdout.write(to_json(payload))
    elif args.output == "name":
        sys.stdout.write("".join(f"{_resource_name(document)}\n" for document in documents))
    else:
        sys.stdout.write(to_yaml(documents))
    return EXIT_OK


def _resource_name(document: Mapping[str, Any]) -> str:
    """``kind.group/name`` as kubectl prints it (``configmap/x`` for the core group)."""
    group = str(document.get("apiVersion", "")).rpartition("/")[0]
    kind = str(document.get("kind", "")).lower()
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return f"{kind}.{group}/{name}" if group else f"{kind}/{name}"


def run_graph(args: argparse.Namespace) -> int:
    loader: GraphSourceLoader = args.graph_source_loader
    source = loader(args)
    text = graph_text(source, output_format=args.graph_format, direction=args.direction)
    edges = edge_count(source.definition)
    if args.graph_format == "mermaid" and edges > MERMAID_DEFAULT_MAX_EDGES:
        print(
            f"flowforge graph: note: {edges} edges; Mermaid renderers refuse more than "
            f"{MERMAID_DEFAULT_MAX_EDGES} unless configured with a higher maxEdges "
            "(or use -o dot)",
            file=sys.stderr,
        )
    sys.stdout.write(text)
    return EXIT_OK


def graph_text(source: GraphSource, *, output_format: GraphFormat, direction: Direction) -> str:
    """The drawing of ``source``. States naming tasks the definition lacks can only come from
    a store whose rows disagree with its definitions: a system failure."""
    try:
        return render_graph(
            source.definition,
            output_format=output_format,
            direction=direction,
            states=source.states,
        )
    except ValueError as exc:
        raise CommandError(str(exc), exit_code=EXIT_UNAVAILABLE) from exc


def load_definition_file(args: argparse.Namespace) -> GraphSource:
    """The one WorkflowDefinition of ``args.source`` (or the one called ``args.name``)."""
    path: str = args.source
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        documents = read_documents(text, source=path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CommandError(f"{path}: cannot read the file: {reason}", exit_code=EXIT_USAGE) from exc
    definitions = [doc for doc in documents if doc.body.get("kind") == DEFINITION_KIND]
    if args.name is not None:
        definitions = [doc for doc in definitions if args.name in _names_of(doc)]
    if len(definitions) != 1:
        wanted = DEFINITION_KIND if args.name is None else f"{DEFINITION_KIND} {args.name!r}"
        hint = " (choose one with --name)" if len(definitions) > 1 else ""
        raise CommandError(
            f"{path} holds {len(definitions)} {wanted} documents{hint}", exit_code=EXIT_USAGE
        )
    document = definitions[0]
    errors = validate_spec(document.body.get("spec"))
    if errors:
        details = "; ".join(f"{error.path}: {error.message}" for error in errors)
        raise CommandError(
            f"{path}:{document.line}: invalid {DEFINITION_KIND}: {details}",
            exit_code=EXIT_FAILED,
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
        raise CommandError(
            f"{target!r} is not MODULE:ATTR (for example pipelines.etl:etl)", exit_code=EXIT_USAGE
        )
    module = _import_module(module_name)
    value: object = module
    for attribute in attribute_path.split("."):
        try:
            value = getattr(value, attribute)
        except AttributeError as exc:
            raise CommandError(
                f"{module_name} has no attribute {attribute_path!r}", exit_code=EXIT_USAGE
            ) from exc
    if callable(value):
        try:
            value = value()
        except UserError as exc:
            raise CommandError(f"{target}: {exc}", exit_code=EXIT_FAILED) from exc
        except Exception as exc:
            raise CommandError(
                f"calling {target} failed: {type(exc).__name__}: {exc}", exit_code=EXIT_USAGE
            ) from exc
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
        raise CommandError(f"{module_name}: {exc}", exit_code=EXIT_FAILED) from exc
    except Exception as exc:
        raise CommandError(
            f"cannot import {module_name}: {type(exc).__name__}: {exc}", exit_code=EXIT_USAGE
        ) from exc
    finally:
        if added_to_path:
            sys.path.remove(os.getcwd())


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise CommandError(f"{path}: no such file", exit_code=EXIT_USAGE)
    name = f"_flowforge_render_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CommandError(f"{path}: not an importable Python file", exit_code=EXIT_USAGE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except UserError as exc:
        raise CommandError(f"{path}: {exc}", exit_code=EXIT_FAILED) from exc
    except Exception as exc:
        raise CommandError(
            f"cannot import {path}: {type(exc).__name__}: {exc}", exit_code=EXIT_USAGE
        ) from exc
    return module


def _documents_of(value: object) -> list[dict[str, Any]]:
    items: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    documents = [dict(item) for item in items if isinstance(item, Mapping)]
    if not documents or len(documents) != len(items):
        raise CommandError(
            "the target must be a manifest document (a mapping), a list of them, or a "
            f"callable returning one; got {type(value).__name__}",
            exit_code=EXIT_USAGE,
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
        raise CommandError(
            f"document {position} is an invalid {DEFINITION_KIND}: {details}",
            exit_code=EXIT_FAILED,
        )
