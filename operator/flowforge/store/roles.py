"""The store's database roles (``migrations/0004_roles.sql``) and who may do what.

Group roles (NOLOGIN, cluster-global, so the names carry the ``flowforge_`` prefix; the
migration creates them once per server and every database grants them the same rights).
A deployer makes one login role per component and grants it the group, e.g.::

    CREATE ROLE ff_operator LOGIN PASSWORD '...' IN ROLE flowforge_operator;
    CREATE ROLE ff_migrate  LOGIN PASSWORD '...' IN ROLE flowforge_migrator;
    GRANT flowforge_retention TO ff_prune;   -- an existing login

=========================  ====================================================================
``flowforge_migrator``     owns every FlowForge table and function; ``flowforge db migrate``
                           (the Helm pre-upgrade hook) runs later migrations as this role
``flowforge_operator``     SELECT, INSERT, UPDATE on the engine's tables; no DELETE, no
                           TRUNCATE, nothing on the reporting grants or the migration ledger
``flowforge_webhook``      SELECT only (admission reads definitions, writes nothing)
``flowforge_retention``    the only role that deletes: old finished runs' task rows, edges and
                           history (``flowforge db prune``, ``retention.prune``)
``flowforge_reporting``    SELECT, row by row: the namespaces granted in
                           ``flowforge_reporting_grant`` to the reading role
``flowforge_server``       a reporting role for ``flowforge server``: its grants, narrowed to
                           the namespaces the current transaction was scoped to
=========================  ====================================================================

History (``flowforge_event``) is append-only: a row trigger refuses UPDATE, and statement
triggers refuse DELETE and TRUNCATE to every role that does not have the privileges of
``flowforge_retention`` (privileges already refuse them to all but retention and the owner).
A published definition (``flowforge_definition``) is immutable (migration 14): a row
trigger refuses every UPDATE that changes any of its columns, to every role, the owner
included, and DELETE and TRUNCATE are refused as for history. The operator's UPDATE
privilege on the table therefore cannot change what a published version runs.

Threat model of the reporting roles
-----------------------------------
*Who is trusted.* Superusers and the migrator (the schema's owner) can do anything, row
security included (PostgreSQL exempts owners; the owner could drop any trigger): only
administrators hold those credentials. Whoever writes ``flowforge_reporting_grant`` (only
the owner may) decides what every reporting login reads.

*A reporting login* (an analyst, a BI tool) holds its own DSN and can run any SQL. It reads
definitions, runs, tasks, edges and events only of namespaces granted to its role name
(``current_user``); a task, edge or event is visible exactly when its run is (task and event
rows carry their run's namespace, held to it by a foreign key, migration 8). It cannot
widen that: it has no write privilege anywhere; ``SET ROLE`` reaches only roles it is a
member of; setting ``flowforge.namespaces`` (any role may set a custom setting) changes
nothing for a role that is not a member of ``flowforge_server``; a temporary table named
like the grants does not stand in for them (the check function pins its ``search_path``
with ``pg_temp`` last); ``row_security = off`` makes its queries fail, not bypass.

*The read API server* (``flowforge server``) cannot have a database role per Kubernetes user.
It authenticates a request with a TokenReview, authorises each namespace with a
SubjectAccessReview, and then, in the transaction that serves the request, calls
``SELECT flowforge_scope_namespaces(ARRAY['ns-a', 'ns-b'])`` (``scope_namespaces`` below)
before reading. Its login is a member of ``flowforge_server`` and has grants like any
reporting login (``'*'`` for every namespace, or a bounded list). It reads the
intersection of its grants and the scope. The scope is bound to the transaction that set
it (it carries the transaction's start time): a plain ``SET`` or a scope left behind on a
pooled connection reads nothing, and no scope reads nothing (fail closed). What this does
not defend against: whoever holds the server's DSN, or injects SQL into it, can scope
itself to any namespace within the server's grants, exactly as the server can; so the
server's DSN is a secret like the operator's, and its grants bound the damage. The server
refuses to start on a login that could do more than read as ``flowforge_server``
(``require_read_only_login``): a superuser, BYPASSRLS or the owner would ignore the scope. A scope
set by a role other than the server is not trusted at all, which is why a reporting login
can never widen its own view.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from flowforge.store.connection import Connection
from flowforge.store.errors import LoginTooPowerfulError

MIGRATOR = "flowforge_migrator"
OPERATOR = "flowforge_operator"
WEBHOOK = "flowforge_webhook"
RETENTION = "flowforge_retention"
REPORTING = "flowforge_reporting"
SERVER = "flowforge_server"
ALL_ROLES = (MIGRATOR, OPERATOR, WEBHOOK, RETENTION, REPORTING, SERVER)
# the migration that creates them
ROLES_MIGRATION = 4


async def is_member(connection: Connection, role: str) -> bool:
    """Whether the connection's current role may ``SET ROLE`` to ``role`` (False if the
    role does not exist yet)."""
    cursor = await connection.execute(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = %(role)s) "
        "AND pg_catalog.pg_has_role(current_user, %(role)s, 'MEMBER')",
        {"role": role},
    )
    row = await cursor.fetchone()
    return bool(row and row[0])


async def set_local_role(connection: Connection, role: str) -> None:
    """Act as ``role`` until the end of the current transaction."""
    await connection.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))


async def scope_namespaces(connection: Connection, namespaces: Sequence[str]) -> None:
    """Narrow what a ``flowforge_server`` login reads to ``namespaces``, for the current
    transaction only (call it inside the transaction that reads)."""
    await connection.execute("SELECT flowforge_scope_namespaces(%s::text[])", (list(namespaces),))


# What the connection's login can reach: its own attributes and those of every role it may
# SET ROLE to (a membership without INHERIT still lets it act as that role).
LOGIN_POWERS_QUERY = """
WITH reachable AS (
    SELECT r.oid, r.rolname, r.rolsuper, r.rolbypassrls FROM pg_catalog.pg_roles AS r
    WHERE pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER')
), store_tables AS (
    SELECT c.oid, c.relname, c.relowner FROM pg_catalog.pg_class AS c
    WHERE c.relnamespace = pg_catalog.current_schema()::regnamespace
      AND c.relkind IN ('r', 'p') AND c.relname LIKE 'flowforge\\_%'
)
SELECT current_user,
    (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user),
    ARRAY(SELECT rolname FROM reachable WHERE rolsuper AND rolname <> current_user ORDER BY 1),
    ARRAY(SELECT rolname FROM reachable WHERE rolbypassrls ORDER BY 1),
    ARRAY(SELECT DISTINCT pg_catalog.pg_get_userbyid(t.relowner) FROM store_tables AS t
          WHERE t.relowner IN (SELECT oid FROM reachable) ORDER BY 1),
    ARRAY(SELECT t.relname FROM store_tables AS t WHERE EXISTS (
              SELECT FROM reachable AS r WHERE pg_catalog.has_table_privilege(
                  r.oid, t.oid, 'INSERT, UPDATE, DELETE, TRUNCATE'))
          ORDER BY 1)
"""


async def require_read_only_login(connection: Connection) -> None:
    """Refuse (``LoginTooPowerfulError``) a login that is or may become a superuser, bypasses
    row-level security, owns a store table, or may INSERT, UPDATE, DELETE or TRUNCATE one:
    a component that only reads (the read API server) must not be able to do more."""
    cursor = await connection.execute(LOGIN_POWERS_QUERY)
    row = await cursor.fetchone()
    assert row is not None
    login, superuser, superusers, bypassers, owners, writable = row
    powers: list[str] = []
    if superuser:
        powers.append("is a superuser (it bypasses row-level security and may write anything)")
    else:
        if superusers:
            powers.append(f"may act as superuser {', '.join(superusers)}")
        if bypassers:
            powers.append(f"bypasses row-level security (BYPASSRLS, as {', '.join(bypassers)})")
        if owners:
            powers.append(f"owns the store's tables (as {', '.join(owners)})")
        if writable:
            powers.append(f"may INSERT, UPDATE, DELETE or TRUNCATE {', '.join(writable)}")
    if powers:
        raise LoginTooPowerfulError(login=login, powers=powers, wanted=SERVER)
