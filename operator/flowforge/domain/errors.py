"""The exceptions FlowForge raises, in one tree.

Whose fault it is and whether to try again are separate: the branch says who is to blame
(``UserError``: the input; ``InfrastructureError``: the system), and ``retryable`` says
whether the same call may succeed later. Kubernetes client errors are mapped into the tree
at one edge (``flowforge.kube.errors``), PostgreSQL's serialization failures are retried in
``flowforge.store.transaction`` and never leave it, and a lost race between two moves of
the engine is not an exception at all (``flowforge.domain.decision.Decision.lost``).

::

    FlowForgeError                          retryable: False unless said otherwise
    ├── UserError                           the caller's input is wrong
    │   ├── DefinitionError                 one problem in one WorkflowDefinition (kind, path)
    │   │   ├── DefinitionSchemaError           kind "schema"
    │   │   ├── DuplicateTaskKeyError           kind "duplicate-key"
    │   │   ├── UnknownTaskTypeError            kind "unknown-task-type"
    │   │   ├── UnknownDependencyError          kind "unknown-dependency"
    │   │   ├── CompensationError               kind "compensation"
    │   │   ├── ApprovalGateError               kind "approval-gate"
    │   │   └── CyclicDependencyError           kind "cycle"
    │   ├── InvalidDefinitionError          every DefinitionError of one definition, in order
    │   ├── DefinitionConflictError         same (workflow, version), different content
    │   ├── ManifestError                   a YAML file that cannot be read or parsed
    │   ├── CompositionError                sdk: chain/group/chord built wrongly
    │   ├── ParameterError                  a run's parameters do not fit the declarations
    │   ├── ConditionError                  a task's ``when`` cannot be decided (its field)
    │   │   └── ItemsError                      a ``forEach``'s items cannot be expanded
    │   ├── DefinitionNotFoundError         store: no such published workflow version
    │   ├── RunNotFoundError                store: no such run
    │   ├── ConcurrencyForbiddenError       store: a Forbid run whose key filled up before
    │   │                                   the operator created it
    │   ├── RunRefusedError                 operator: a run whose definition is missing or
    │   │                                   no longer validates
    │   ├── BadReviewError                  admission: an AdmissionReview that is malformed
    │   │                                   or names two namespaces
    │   └── KubernetesRefusal               kube: the apiserver refused (4xx but 429)
    │       └── ForgedConfigMap                 operator: the run's ConfigMap was re-created
    │                                           by someone else (another uid)
    └── InfrastructureError                 the system failed or is not as this code needs
        ├── StoreError                      store: PostgreSQL
        │   ├── SchemaTooNewError               the database is newer than this code
        │   ├── SchemaNotMigratedError          run ``flowforge db migrate``
        │   ├── StaleEpochError                 this operator was deposed: stop acting
        │   ├── LeaseNotHeldError               the lease was lost while renewing
    │   ├── LoginTooPowerfulError           a reading component's login may write or
    │   │                                   bypass row-level security
        │   └── StoredDefinitionInvalidError    a stored definition no longer validates
        ├── NotLeaderError                  operator: this replica does not hold the lease
        └── KubernetesUnavailable           kube: unreachable, 429 or 5xx (retryable)

``KubernetesRefusal`` and ``KubernetesUnavailable`` share ``KubernetesError`` (status,
reason, message). The CLI's own ``CommandError`` (a message and an exit code) and the
development tooling's errors (``flowforge.localdev``) are outside the tree: they never
cross a layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar


class FlowForgeError(Exception):
    """Base of every error FlowForge raises on purpose.

    Two separate questions, answered by two separate things: *whose fault* is the class
    (``UserError``: the input; ``InfrastructureError``: the system), and *whether trying
    again may help* is ``retryable`` (an outage may pass; a deposed operator or a schema
    too new will not). Callers decide to retry from ``retryable`` alone.
    """

    retryable: bool = False


class UserError(FlowForgeError):
    """The caller's input is wrong; the same input will fail the same way."""


class InfrastructureError(FlowForgeError):
    """A part FlowForge depends on failed, or is not in the state this code needs."""


class DefinitionError(UserError):
    """One problem in a WorkflowDefinition, located by a Kubernetes-style field path."""

    kind: ClassVar[str] = "definition"

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "message": self.message}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DefinitionError):
            return NotImplemented
        return (self.kind, self.path, self.message) == (other.kind, other.path, other.message)

    def __hash__(self) -> int:
        return hash((self.kind, self.path, self.message))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, path={self.path!r})"


class DefinitionSchemaError(DefinitionError):
    """The definition does not have the shape the JSON Schema describes."""

    kind = "schema"


class DuplicateTaskKeyError(DefinitionError):
    """Two tasks share a key."""

    kind = "duplicate-key"


class UnknownTaskTypeError(DefinitionError):
    """A task names a type that is not an entry of ``taskTypes``."""

    kind = "unknown-task-type"


class UnknownDependencyError(DefinitionError):
    """A task depends on a key that names no forward task."""

    kind = "unknown-dependency"


class CompensationError(DefinitionError):
    """A compensation task breaks one of the compensation rules."""

    kind = "compensation"


class ApprovalGateError(DefinitionError):
    """An approval gate breaks one of the gate rules (``flowforge.domain.approval``)."""

    kind = "approval-gate"


class CyclicDependencyError(DefinitionError):
    """The forward tasks' dependencies form a cycle; ``cycle`` lists it, first key repeated last."""

    kind = "cycle"

    def __init__(self, cycle: Iterable[str], *, path: str = "spec.tasks") -> None:
        self.cycle: tuple[str, ...] = tuple(cycle)
        super().__init__(f"dependency cycle detected: {' -> '.join(self.cycle)}", path=path)


class InvalidDefinitionError(UserError):
    """A definition with one or more problems; ``errors`` lists all of them, in order."""

    def __init__(self, errors: Iterable[DefinitionError]) -> None:
        self.errors: tuple[DefinitionError, ...] = tuple(errors)
        super().__init__("\n".join(f"{error.path}: {error.message}" for error in self.errors))


class DefinitionConflictError(UserError):
    """A published (workflow, version) already holds different content."""

    def __init__(
        self,
        *,
        namespace: str,
        workflow: str,
        version: int,
        existing_fingerprint: str,
        new_fingerprint: str,
    ) -> None:
        self.namespace = namespace
        self.workflow = workflow
        self.version = version
        self.existing_fingerprint = existing_fingerprint
        self.new_fingerprint = new_fingerprint
        super().__init__(
            f"workflow {workflow!r} version {version} in namespace {namespace!r} is already "
            f"published with fingerprint {existing_fingerprint}; this content has fingerprint "
            f"{new_fingerprint}. A published version is immutable: publish a new version."
        )


class ManifestError(UserError):
    """A manifest file that cannot be read or is not valid YAML/JSON as Kubernetes reads it."""

    def __init__(self, message: str, *, source: str, line: int | None = None) -> None:
        self.source = source
        self.line = line
        self.message = message
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {message}")
