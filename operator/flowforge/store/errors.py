"""Errors raised by the PostgreSQL store.

User errors are about what someone asked for (an unknown run, a definition that no longer
validates); infrastructure errors are about the system (a deposed operator, a schema this
code does not know).
"""

from __future__ import annotations

from flowforge.domain.errors import InfrastructureError, UserError


class ConcurrencyForbiddenError(UserError):
    """A run of a ``Forbid`` workflow whose concurrency key is full when the operator
    creates it: admission let it through on an earlier count (the operator had not recorded
    the other run yet, or two creations raced)."""


class StoreError(InfrastructureError):
    """A failure of the store that is not caused by the caller's input."""


class SchemaTooNewError(StoreError):
    def __init__(self, *, database_version: int, known_version: int) -> None:
        self.database_version = database_version
        self.known_version = known_version
        super().__init__(
            f"the database schema is at version {database_version}, newer than the newest "
            f"this FlowForge knows ({known_version}); upgrade FlowForge before running it "
            "against this database"
        )


class SchemaNotMigratedError(StoreError):
    def __init__(self, *, database_version: int, known_version: int) -> None:
        self.database_version = database_version
        self.known_version = known_version
        super().__init__(
            f"the database schema is at version {database_version}, this FlowForge needs "
            f"{known_version}; run `flowforge db migrate`"
        )


class StaleEpochError(StoreError):
    """A write carried a fencing epoch older than the lease's: the writer was deposed."""

    def __init__(self, *, lease: str, epoch: int, current_epoch: int | None) -> None:
        self.lease = lease
        self.epoch = epoch
        self.current_epoch = current_epoch
        super().__init__(
            f"write refused: fencing epoch {epoch} of lease {lease!r} is stale "
            f"(current epoch: {current_epoch}); another operator holds the lease"
        )


class LeaseNotHeldError(StoreError):
    def __init__(self, *, lease: str, holder: str, epoch: int) -> None:
        self.lease = lease
        self.holder = holder
        self.epoch = epoch
        super().__init__(f"lease {lease!r} epoch {epoch} is no longer held by {holder!r}")


class StoredDefinitionInvalidError(StoreError):
    """A definition row no longer validates (changed by hand, lost data, older rules)."""

    def __init__(self, *, namespace: str, workflow: str, version: int, reason: str) -> None:
        self.namespace = namespace
        self.workflow = workflow
        self.version = version
        self.reason = reason
        super().__init__(
            f"stored definition {namespace}/{workflow} v{version} no longer validates, "
            f"refusing to use it: {reason}"
        )


class DefinitionNotFoundError(UserError):
    def __init__(self, *, namespace: str, workflow: str, version: int | None) -> None:
        self.namespace = namespace
        self.workflow = workflow
        self.version = version
        which = f"version {version}" if version is not None else "any version"
        super().__init__(f"workflow {namespace}/{workflow} has no published {which}")


class RunNotFoundError(UserError):
    def __init__(self, *, run: str) -> None:
        self.run = run
        super().__init__(f"run {run} does not exist in the store")


class LoginTooPowerfulError(StoreError):
    """A component that only reads was given a login that may write or see past row-level
    security; ``powers`` says what it may do, one phrase each."""

    def __init__(self, *, login: str, powers: list[str], wanted: str) -> None:
        self.login = login
        self.powers = powers
        super().__init__(
            f"database login {login!r} {'; '.join(powers)}: refusing to run on it; give "
            f"this component a login that is a member of {wanted} and nothing more"
        )
