"""The framework-free heart of FlowForge: what a WorkflowDefinition is, and what it implies.

Nothing in this package imports kopf, kubernetes or psycopg (a test enforces it); every other
layer depends on this one, never the reverse.
"""

from flowforge.domain.errors import (
    CompensationError,
    CyclicDependencyError,
    DefinitionConflictError,
    DefinitionError,
    DefinitionSchemaError,
    DuplicateTaskKeyError,
    FlowForgeError,
    InfrastructureError,
    InvalidDefinitionError,
    ManifestError,
    UnknownDependencyError,
    UnknownTaskTypeError,
    UserError,
)
from flowforge.domain.fingerprint import fingerprint
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.manifests import ManifestDocument, load_documents, read_documents
from flowforge.domain.models import ContainerTemplate, DefinitionSpec, EnvVar, TaskSpec
from flowforge.domain.planning import Plan, plan
from flowforge.domain.schema import DEFINITION_SPEC_SCHEMA, shape_errors
from flowforge.domain.validation import graph_errors, parse_definition, validate_spec

__all__ = [
    "DEFINITION_SPEC_SCHEMA",
    "CompensationError",
    "ContainerTemplate",
    "CyclicDependencyError",
    "DefinitionConflictError",
    "DefinitionError",
    "DefinitionSchemaError",
    "DefinitionSpec",
    "DependencyGraph",
    "DuplicateTaskKeyError",
    "EnvVar",
    "FlowForgeError",
    "InfrastructureError",
    "InvalidDefinitionError",
    "ManifestDocument",
    "ManifestError",
    "Plan",
    "TaskSpec",
    "UnknownDependencyError",
    "UnknownTaskTypeError",
    "UserError",
    "fingerprint",
    "graph_errors",
    "load_documents",
    "parse_definition",
    "plan",
    "read_documents",
    "shape_errors",
    "validate_spec",
]
