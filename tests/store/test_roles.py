"""The store's roles (migration 4, ``store/roles.py``), each tried as its own login role:
the operator makes every move of the engine and cannot delete or truncate history,
retention can; the webhook only reads; a reporting login sees only the namespaces granted
to it and cannot widen that; the server role sees only what its transaction is scoped to."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from flowforge.domain.states import RunPhase
from flowforge.store import roles
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition
from flowforge.store.dispatch import JobCreated, dispatch_due, record_jobs_created
from flowforge.store.errors import StoreError
from flowforge.store.lease import Fence, acquire_lease
from flowforge.store.moves import settle_run
from flowforge.store.pool import open_pool
from flowforge.store.queries import list_tasks
from flowforge.store.retention import prune
from flowforge.store.runs import RunRecord, get_run
from tests.store.conftest import DIAMOND, failure, finish, roll_back, start_run

pytestmark = pytest.mark.store

LoginDsn = Callable[..., str]
SAGA: list[dict[str, Any]] = [
    {"key": "reserve"},
    {"key": "charge", "dependsOn": ["reserve"]},
    {"key": "release", "compensateFor": "reserve"},
]


@pytest.fixture
async def pools() -> AsyncIterator[Callable[[str], Any]]:
    opened: list[Pool] = []

    async def open_as(dsn: str) -> Pool:
        pool = await open_pool(dsn, min_size=1, max_size=2)
        opened.append(pool)
        return pool

    yield open_as
    for pool in opened:
        await pool.close()


async def operator_fence(pool: Pool) -> Fence:
    lease = await acquire_lease(pool, holder="operator", ttl=timedelta(minutes=5))
    assert lease is not None
    return lease.fence


async def start(
    pool: Pool, fence: Fence, tasks: list[dict[str, Any]], *, namespace: str, name: str
) -> RunRecord:
    return (await start_run(pool, fence, tasks, workflow=name, namespace=namespace)).run


async def finished_run(pool: Pool, fence: Fence, *, namespace: str, name: str) -> RunRecord:
    """A diamond run driven to Succeeded with the operator's moves."""
    run = await start(pool, fence, DIAMOND, namespace=namespace, name=name)
    for key in ("extract", "clean", "enrich", "load"):
        await finish(pool, fence, run, key)
    await settle_run(pool, fence=fence, run_id=run.id)
    return await get_run(pool, run.id)


def scalar(dsn: str, query: str) -> Any:
    with psycopg.connect(dsn) as connection:
        row = connection.execute(query.encode()).fetchone()
        assert row is not None
        return row[0]


def test_the_group_roles_exist_and_cannot_log_in(store_dsn: str) -> None:
    with psycopg.connect(store_dsn) as connection:
        rows = connection.execute(
            "SELECT rolname, rolcanlogin, rolsuper, rolbypassrls FROM pg_roles "
            "WHERE rolname = ANY(%s)",
            (list(roles.ALL_ROLES),),
        ).fetchall()
    assert sorted(rows) == sorted((name, False, False, False) for name in roles.ALL_ROLES)


def test_every_flowforge_object_is_owned_by_the_migrator(store_dsn: str) -> None:
    with psycopg.connect(store_dsn) as connection:
        owners = connection.execute(
            "SELECT relname, pg_get_userbyid(relowner) FROM pg_class "
            "WHERE relname LIKE 'flowforge\\_%' AND relkind IN ('r', 'S', 'i')"
        ).fetchall()
    assert owners and {owner for _, owner in owners} == {roles.MIGRATOR}


async def test_the_operator_makes_every_move_of_a_run_and_a_rollback(
    login_role_dsn: LoginDsn, pools: Callable[[str], Any]
) -> None:
    pool: Pool = await pools(login_role_dsn("ff_test_operator", member_of=roles.OPERATOR))
    fence = await operator_fence(pool)

    succeeded = await finished_run(pool, fence, namespace="team-a", name="etl")
    saga = await start(pool, fence, SAGA, namespace="team-a", name="saga")
    await finish(pool, fence, saga, "reserve")
    tasks = {t.task_key: t for t in await list_tasks(pool, saga.id)}
    await dispatch_due(pool, fence=fence, run_id=saga.id)
    charge = JobCreated(
        task_key="charge",
        attempt=tasks["charge"].attempt,
        job="saga-charge-1",
        uid="uid-saga-charge-1",
        created=True,
    )
    await record_jobs_created(pool, fence=fence, run_id=saga.id, jobs=(charge,))
    decision = await finish(pool, fence, saga, "charge", failure())
    ran = await roll_back(pool, fence, saga, decision)
    await settle_run(pool, fence=fence, run_id=saga.id)

    assert succeeded.phase is RunPhase.SUCCEEDED
    assert ran == ["release"]
    assert (await get_run(pool, saga.id)).phase is RunPhase.FAILED


@pytest.mark.parametrize("statement", ["DELETE FROM flowforge_event", "TRUNCATE flowforge_event"])
async def test_the_operator_cannot_delete_or_truncate_history(
    statement: str, login_role_dsn: LoginDsn, pools: Callable[[str], Any]
) -> None:
    dsn = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    pool: Pool = await pools(dsn)
    run = await finished_run(pool, await operator_fence(pool), namespace="team-a", name="etl")
    before = scalar(dsn, f"SELECT count(*) FROM flowforge_event WHERE run_id = {run.id}")

    with (
        psycopg.connect(dsn) as connection,
        pytest.raises(
            pg_errors.InsufficientPrivilege, match="permission denied for table flowforge_event"
        ),
    ):
        connection.execute(statement.encode())

    assert before > 0
    assert scalar(dsn, f"SELECT count(*) FROM flowforge_event WHERE run_id = {run.id}") == before


@pytest.mark.parametrize(
    ("statement", "operation"),
    [("DELETE FROM flowforge_event", "DELETE"), ("TRUNCATE flowforge_event", "TRUNCATE")],
)
def test_history_refuses_delete_and_truncate_even_to_its_owner_and_a_mistaken_grant(
    statement: str, operation: str, store_dsn: str, login_role_dsn: LoginDsn
) -> None:
    migrator = login_role_dsn("ff_test_migrator", member_of=roles.MIGRATOR)
    operator = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        # a deployer's mistake: DELETE and TRUNCATE granted straight to a login
        admin.execute("GRANT DELETE, TRUNCATE ON flowforge_event TO ff_test_operator")

    for dsn, login in ((migrator, "ff_test_migrator"), (operator, "ff_test_operator")):
        with (
            psycopg.connect(dsn) as connection,
            pytest.raises(
                pg_errors.InsufficientPrivilege,
                match=rf"flowforge_event is append-only: {operation} refused for role {login}",
            ) as refused,
        ):
            connection.execute(statement.encode())
        assert refused.value.diag.message_hint is not None
        assert roles.RETENTION in refused.value.diag.message_hint


async def test_retention_deletes_history_and_the_operator_may_not_prune(
    login_role_dsn: LoginDsn, pools: Callable[[str], Any]
) -> None:
    operator_dsn = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    operator: Pool = await pools(operator_dsn)
    retention: Pool = await pools(login_role_dsn("ff_test_retention", member_of=roles.RETENTION))
    run = await finished_run(
        operator, await operator_fence(operator), namespace="team-a", name="etl"
    )

    with pytest.raises(StoreError, match="GRANT flowforge_retention TO ff_test_operator"):
        await prune(operator, older_than=timedelta(0))
    events = scalar(operator_dsn, f"SELECT count(*) FROM flowforge_event WHERE run_id = {run.id}")
    report = await prune(retention, older_than=timedelta(0))

    assert events > 0
    assert (report.runs, report.tasks, report.events) == (1, 4, events)
    assert scalar(operator_dsn, "SELECT count(*) FROM flowforge_event") == 0
    assert (await get_run(operator, run.id)).pruned_at is not None


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO flowforge_lease (name, holder, epoch, expires_at) "
        "VALUES ('x', 'webhook', 1, now())",
        "UPDATE flowforge_definition SET version = version + 1",
        "UPDATE flowforge_run SET cancel_requested = true",
        "DELETE FROM flowforge_run",
        "INSERT INTO flowforge_event (run_id, kind) SELECT id, 'run.forged' FROM flowforge_run",
        "INSERT INTO flowforge_reporting_grant (grantee, namespace) VALUES (current_user, '*')",
        "CREATE TABLE flowforge_extra (id int)",
    ],
)
async def test_the_webhook_reads_and_cannot_write(
    statement: str, login_role_dsn: LoginDsn, pools: Callable[[str], Any]
) -> None:
    operator: Pool = await pools(login_role_dsn("ff_test_operator", member_of=roles.OPERATOR))
    await finished_run(operator, await operator_fence(operator), namespace="team-a", name="etl")
    webhook_dsn = login_role_dsn("ff_test_webhook", member_of=roles.WEBHOOK)
    webhook: Pool = await pools(webhook_dsn)  # the pool's schema check reads the ledger

    stored = await load_definition(webhook, namespace="team-a", workflow="etl", version=1)
    with (
        psycopg.connect(webhook_dsn) as connection,
        pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"),
    ):
        connection.execute(statement.encode())

    assert stored.namespace == "team-a"
    assert scalar(webhook_dsn, "SELECT count(*) FROM flowforge_run") == 1


VISIBLE_QUERIES = {
    "definitions": "SELECT DISTINCT namespace FROM flowforge_definition",
    "runs": "SELECT DISTINCT namespace FROM flowforge_run",
    "tasks": "SELECT DISTINCT r.namespace FROM flowforge_task JOIN flowforge_run r "
    "ON r.id = run_id",
    "edges": "SELECT DISTINCT r.namespace FROM flowforge_task_dependency JOIN flowforge_run "
    "r ON r.id = run_id",
    "events": "SELECT DISTINCT r.namespace FROM flowforge_event JOIN flowforge_run r "
    "ON r.id = run_id",
}


def visible(connection: psycopg.Connection[Any]) -> dict[str, set[str]]:
    return {
        what: {row[0] for row in connection.execute(query.encode()).fetchall()}
        for what, query in VISIBLE_QUERIES.items()
    }


def counts(connection: psycopg.Connection[Any]) -> dict[str, int]:
    found = {}
    for table in ("flowforge_task", "flowforge_task_dependency", "flowforge_event"):
        row = connection.execute(f"SELECT count(*) FROM {table}".encode()).fetchone()
        assert row is not None
        found[table] = int(row[0])
    return found


@pytest.fixture
async def two_teams(
    store_dsn: str, login_role_dsn: LoginDsn, pools: Callable[[str], Any]
) -> dict[str, int]:
    """A finished run in team-a and in team-b; each team's row counts."""
    operator: Pool = await pools(login_role_dsn("ff_test_operator", member_of=roles.OPERATOR))
    fence = await operator_fence(operator)
    await finished_run(operator, fence, namespace="team-a", name="etl")
    await start(operator, fence, SAGA, namespace="team-b", name="saga")
    with psycopg.connect(store_dsn) as admin:
        return counts(admin)


def grant(store_dsn: str, login: str, *namespaces: str) -> None:
    with psycopg.connect(store_dsn) as admin:
        for namespace in namespaces:
            admin.execute(
                "INSERT INTO flowforge_reporting_grant (grantee, namespace) VALUES (%s, %s)",
                (login, namespace),
            )


async def test_a_reporting_login_sees_only_the_namespaces_granted_to_it(
    store_dsn: str, login_role_dsn: LoginDsn, two_teams: dict[str, int]
) -> None:
    alice = login_role_dsn("ff_test_alice", member_of=roles.REPORTING)
    nobody = login_role_dsn("ff_test_nobody", member_of=roles.REPORTING)
    both = login_role_dsn("ff_test_both", member_of=roles.REPORTING)
    grant(store_dsn, "ff_test_alice", "team-a")
    grant(store_dsn, "ff_test_both", "team-a", "team-b")

    with psycopg.connect(alice) as connection:
        seen_by_alice = visible(connection)
        alice_counts = counts(connection)
    with psycopg.connect(nobody) as connection:
        seen_by_nobody = visible(connection)
    with psycopg.connect(both) as connection:
        seen_by_both = visible(connection)
        both_counts = counts(connection)

    assert seen_by_alice == {key: {"team-a"} for key in VISIBLE_QUERIES}
    assert seen_by_nobody == {key: set() for key in VISIBLE_QUERIES}
    assert seen_by_both == {key: {"team-a", "team-b"} for key in VISIBLE_QUERIES}
    assert both_counts == two_teams
    # team-a's diamond: 4 tasks, 4 edges; the saga in team-b adds 3 tasks and 1 edge
    assert alice_counts["flowforge_task"] == 4 < two_teams["flowforge_task"]
    assert alice_counts["flowforge_task_dependency"] == 4
    assert 0 < alice_counts["flowforge_event"] < two_teams["flowforge_event"]


SHADOW_GRANTS = [
    "CREATE TEMP TABLE flowforge_reporting_grant (grantee name, namespace text)",
    "INSERT INTO pg_temp.flowforge_reporting_grant VALUES (current_user, '*')",
]


@pytest.mark.parametrize(
    "widen",
    [
        # the scope a server narrows its reads to: ignored for a reporting login
        ["SET flowforge.namespaces = 'team-b'"],
        ["SELECT flowforge_scope_namespaces(ARRAY['team-b'])"],
        # a temporary table standing in for the grants, found first or named first
        SHADOW_GRANTS,
        [*SHADOW_GRANTS, "SET search_path = pg_temp, public"],
    ],
)
async def test_a_reporting_login_cannot_widen_its_own_grant(
    widen: list[str], store_dsn: str, login_role_dsn: LoginDsn, two_teams: dict[str, int]
) -> None:
    alice = login_role_dsn("ff_test_alice", member_of=roles.REPORTING)
    grant(store_dsn, "ff_test_alice", "team-a")

    with psycopg.connect(alice, autocommit=True) as connection:
        for statement in widen:
            connection.execute(statement.encode())
        seen = visible(connection)
        own_grants = connection.execute(
            "SELECT namespace FROM public.flowforge_reporting_grant"
        ).fetchall()

    assert two_teams["flowforge_task"] > 4
    assert seen == {key: {"team-a"} for key in VISIBLE_QUERIES}
    assert own_grants == [("team-a",)]


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        (
            "INSERT INTO flowforge_reporting_grant (grantee, namespace) "
            "VALUES (current_user, 'team-b')",
            pg_errors.InsufficientPrivilege,
        ),
        ("UPDATE flowforge_reporting_grant SET namespace = '*'", pg_errors.InsufficientPrivilege),
        ("SET ROLE flowforge_server", pg_errors.InsufficientPrivilege),
        ("SET ROLE flowforge_migrator", pg_errors.InsufficientPrivilege),
        (
            "SET row_security = off; SELECT count(*) FROM flowforge_run",
            pg_errors.InsufficientPrivilege,
        ),
        ("UPDATE flowforge_run SET cancel_requested = true", pg_errors.InsufficientPrivilege),
        ("DELETE FROM flowforge_event", pg_errors.InsufficientPrivilege),
    ],
)
async def test_a_reporting_login_is_refused_what_would_widen_or_write(
    statement: str,
    error: type[Exception],
    store_dsn: str,
    login_role_dsn: LoginDsn,
    two_teams: dict[str, int],
) -> None:
    alice = login_role_dsn("ff_test_alice", member_of=roles.REPORTING)
    grant(store_dsn, "ff_test_alice", "team-a")

    with psycopg.connect(alice, autocommit=True) as connection, pytest.raises(error):
        for part in statement.split("; "):
            connection.execute(part.encode())

    with psycopg.connect(store_dsn) as admin:
        assert counts(admin) == two_teams
        grants = admin.execute(
            "SELECT grantee, namespace FROM flowforge_reporting_grant"
        ).fetchall()
    assert grants == [("ff_test_alice", "team-a")]


async def test_the_server_role_reads_only_the_scope_of_its_transaction(
    store_dsn: str, login_role_dsn: LoginDsn, two_teams: dict[str, int]
) -> None:
    server = login_role_dsn("ff_test_server", member_of=roles.SERVER)
    bounded = login_role_dsn("ff_test_bounded_server", member_of=roles.SERVER)
    grant(store_dsn, "ff_test_server", "*")
    grant(store_dsn, "ff_test_bounded_server", "team-a")

    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as connection:
        unscoped = {
            row[0]
            for row in await (await connection.execute(VISIBLE_QUERIES["runs"].encode())).fetchall()
        }
        async with connection.transaction():
            await roles.scope_namespaces(connection, ["team-b"])
            cursor = await connection.execute(VISIBLE_QUERIES["events"].encode())
            scoped = {row[0] for row in await cursor.fetchall()}
        # the scope ends with its transaction, even when set as a session setting
        async with connection.transaction():
            await roles.scope_namespaces(connection, ["team-b"])
            setting = await (await connection.execute("SHOW flowforge.namespaces")).fetchone()
        assert setting is not None
        await connection.execute(
            "SELECT set_config('flowforge.namespaces', %s, false)", (setting[0],)
        )
        cursor = await connection.execute(VISIBLE_QUERIES["runs"].encode())
        stale = {row[0] for row in await cursor.fetchall()}
    async with await psycopg.AsyncConnection.connect(bounded, autocommit=True) as connection:
        async with connection.transaction():
            await roles.scope_namespaces(connection, ["team-a", "team-b"])
            cursor = await connection.execute(VISIBLE_QUERIES["runs"].encode())
            bounded_seen = {row[0] for row in await cursor.fetchall()}
        with pytest.raises(pg_errors.InvalidParameterValue, match="not a namespace"):
            await roles.scope_namespaces(connection, ["team-a,team-b"])

    assert unscoped == set()
    assert scoped == {"team-b"}
    assert stale == set()
    assert bounded_seen == {"team-a"}


ROW_QUERIES = {
    # each table read on its own (no join to the run, whose policy would hide rows too)
    "tasks": "SELECT DISTINCT run_id, namespace FROM flowforge_task",
    "events": "SELECT DISTINCT run_id, namespace FROM flowforge_event",
}


def rows_of(connection: psycopg.Connection[Any]) -> dict[str, set[tuple[int, str]]]:
    return {
        what: {
            (int(run_id), str(namespace))
            for run_id, namespace in connection.execute(query.encode()).fetchall()
        }
        for what, query in ROW_QUERIES.items()
    }


async def test_task_and_event_rows_of_another_namespace_stay_hidden_and_cannot_be_relabelled(
    store_dsn: str, login_role_dsn: LoginDsn, two_teams: dict[str, int]
) -> None:
    """Migration 8 puts the run's namespace on its task and event rows for row security to
    compare: a reader still sees none of another namespace's rows, a scope naming '*'
    widens nothing, and no row can carry another namespace than its run's."""
    alice = login_role_dsn("ff_test_alice", member_of=roles.REPORTING)
    server = login_role_dsn("ff_test_server", member_of=roles.SERVER)
    operator = login_role_dsn("ff_test_operator", member_of=roles.OPERATOR)
    grant(store_dsn, "ff_test_alice", "team-a")
    grant(store_dsn, "ff_test_server", "*")
    with psycopg.connect(store_dsn) as admin:
        run_of = dict(admin.execute("SELECT namespace, id FROM flowforge_run").fetchall())
    team_a = {(run_of["team-a"], "team-a")}

    with psycopg.connect(alice) as connection:
        seen_by_alice = rows_of(connection)
    with psycopg.connect(server) as connection:
        connection.execute("SELECT flowforge_scope_namespaces(ARRAY['team-a'])")
        seen_by_server = rows_of(connection)
        connection.rollback()
        # a scope written by hand for this transaction, naming every namespace
        connection.execute(
            "SELECT set_config('flowforge.namespaces', "
            "extract(epoch FROM transaction_timestamp())::text || '|*,team-b', true)"
        )
        seen_with_star = rows_of(connection)
    forged: list[type[Exception]] = []
    with psycopg.connect(operator, autocommit=True) as connection:
        for statement in (
            "INSERT INTO flowforge_event (run_id, namespace, kind) "
            f"VALUES ({run_of['team-b']}, 'team-a', 'run.forged')",
            f"UPDATE flowforge_task SET namespace = 'team-a' WHERE run_id = {run_of['team-b']}",
            f"INSERT INTO flowforge_event (run_id, kind) VALUES ({run_of['team-b']}, 'run.x')",
        ):
            try:
                connection.execute(statement.encode())
            except psycopg.Error as error:
                forged.append(type(error))

    assert seen_by_alice == {"tasks": team_a, "events": team_a}
    assert seen_by_server == {"tasks": team_a, "events": team_a}
    assert seen_with_star == {
        "tasks": {(run_of["team-b"], "team-b")},
        "events": {(run_of["team-b"], "team-b")},
    }
    assert forged == [
        pg_errors.ForeignKeyViolation,
        pg_errors.ForeignKeyViolation,
        pg_errors.NotNullViolation,
    ]
    with psycopg.connect(store_dsn) as admin:
        assert counts(admin) == two_teams


async def test_a_later_migration_runs_as_the_migrator_and_its_tables_reach_the_operator(
    empty_database_dsn: str,
    postgres_server_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flowforge.store import migrate as migrate_module
    from tests.plugins.postgres import ensure_login_role

    known = migrate_module.known_migrations()
    later = migrate_module.Migration(
        version=known[-1].version + 1,
        name="later",
        sql="CREATE TABLE flowforge_later (id int GENERATED ALWAYS AS IDENTITY, note text)",
    )
    monkeypatch.setattr(migrate_module, "known_migrations", lambda: (*known, later))
    ensure_login_role(postgres_server_dsn, "ff_test_migrator", member_of=roles.MIGRATOR)
    ensure_login_role(postgres_server_dsn, "ff_test_operator", member_of=roles.OPERATOR)
    await migrate_module.migrate(empty_database_dsn)  # schema 1..4 as the database's admin
    with psycopg.connect(empty_database_dsn) as admin:
        admin.execute("DELETE FROM flowforge_schema_migration WHERE version = %s", (later.version,))
        admin.execute("DROP TABLE flowforge_later")

    migrator_dsn = psycopg.conninfo.make_conninfo(empty_database_dsn, user="ff_test_migrator")
    report = await migrate_module.migrate(migrator_dsn, lock_timeout=timedelta(seconds=5))
    operator_dsn = psycopg.conninfo.make_conninfo(empty_database_dsn, user="ff_test_operator")
    with psycopg.connect(operator_dsn) as connection:
        connection.execute("INSERT INTO flowforge_later (note) VALUES ('the operator writes')")
    owner = scalar(
        empty_database_dsn,
        "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'flowforge_later'",
    )

    assert report.applied == (later.version,)
    assert owner == roles.MIGRATOR


async def test_make_dev_gives_each_component_its_own_login_and_migrates_as_the_migrator(
    postgres_server_dsn: str,
) -> None:
    from flowforge.localdev import postgres as localdev
    from flowforge.store.migrate import migrate
    from tests.plugins.postgres import _drop_database

    database = f"flowforge_dev_{uuid.uuid4().hex[:8]}"
    try:
        dsns = localdev.provision(postgres_server_dsn, database=database)
        again = localdev.provision(postgres_server_dsn, database=database)
        report = await migrate(dsns["migrator"])
        logins = {component: scalar(dsn, "SELECT current_user") for component, dsn in dsns.items()}
        owner = scalar(
            dsns["operator"],
            "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'flowforge_event'",
        )
        with (
            psycopg.connect(dsns["operator"]) as connection,
            pytest.raises(pg_errors.InsufficientPrivilege),
        ):
            connection.execute("DELETE FROM flowforge_event")
    finally:
        _drop_database(postgres_server_dsn, database)

    assert again == dsns
    assert report.schema_version >= roles.ROLES_MIGRATION
    assert logins == {c: login for c, (login, _) in localdev.COMPONENT_LOGINS.items()}
    assert owner == roles.MIGRATOR
