"""The chart's bundled PostgreSQL gives each component a login of its own (issue 24).

- rendered: each Deployment reads only its own login's Secret, the migrations run as the
  database's owner, and the logins' passwords are their own;
- the rendered logins script's SQL, applied with psql to the real test PostgreSQL as the
  owner (twice: the pod applies it on every start), makes each login a member of its group
  role only, and the server's login is one ``flowforge server`` accepts.
"""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from flowforge.localdev.postgres import find_binary
from flowforge.store import roles
from flowforge.store.errors import LoginTooPowerfulError
from tests.plugins.helm import Helm, Manifest

BUNDLED = {"database": {"existingSecret": "", "bundled": {"enabled": True}}}
OWNER_SECRET = "ff-flowforge-postgresql"
GROUPS = {"operator": roles.OPERATOR, "webhook": roles.WEBHOOK, "server": roles.SERVER}


@pytest.fixture(scope="module")
def bundled(helm: Helm) -> list[Manifest]:
    return helm.template(BUNDLED)


def _named(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    return found


def _secret_refs(container: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (env["valueFrom"]["secretKeyRef"]["name"], env["valueFrom"]["secretKeyRef"]["key"])
        for env in container.get("env", [])
        if "secretKeyRef" in env.get("valueFrom", {})
    }


def test_each_deployment_reads_only_its_own_logins_dsn(bundled: list[Manifest]) -> None:
    passwords = {}
    for component, group in GROUPS.items():
        pod = _named(bundled, "Deployment", f"ff-flowforge-{component}")["spec"]["template"]
        (main,) = pod["spec"]["containers"]
        assert _secret_refs(main) == {(f"{OWNER_SECRET}-{component}", "dsn")}, component
        # the migrations (operator and webhook pods) run as the owner, before the component
        for init in pod["spec"].get("initContainers", []):
            assert _secret_refs(init) == {(OWNER_SECRET, "dsn")}, component
        data = _named(bundled, "Secret", f"{OWNER_SECRET}-{component}")["data"]
        login, password, dsn = (
            base64.b64decode(data[k]).decode() for k in ("login", "password", "dsn")
        )
        assert login == f"ff_{component}", group
        assert dsn.startswith(f"postgresql://{login}:{password}@ff-flowforge-postgresql."), dsn
        passwords[component] = password
    owner = base64.b64decode(_named(bundled, "Secret", OWNER_SECRET)["data"]["password"]).decode()
    assert len({*passwords.values(), owner}) == 4
    assert all(len(password) == 32 for password in passwords.values())
    statefulset = _named(bundled, "StatefulSet", OWNER_SECRET)["spec"]["template"]["spec"]
    logins = next(c for c in statefulset["containers"] if c["name"] == "logins")
    environment = {e["name"]: e.get("value") for e in logins["env"]}
    assert sorted(environment["FLOWFORGE_COMPONENTS"].split()) == sorted(
        f"{component}:{group}" for component, group in GROUPS.items()
    )
    assert _secret_refs(logins) == {(OWNER_SECRET, "password")}
    mounted = {v["secret"]["secretName"] for v in statefulset["volumes"] if "secret" in v}
    assert mounted == {f"{OWNER_SECRET}-{component}" for component in GROUPS}


@pytest.fixture
def test_logins(postgres_server_dsn: str) -> Iterator[dict[str, str]]:
    """Login names of this test's own (roles are global to the session's server)."""
    suffix = uuid.uuid4().hex[:8]
    logins = {component: f"ff_chart_{component}_{suffix}" for component in GROUPS}
    yield logins
    with psycopg.connect(postgres_server_dsn, autocommit=True) as connection:
        for login in logins.values():
            connection.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login)))


def _psql(dsn: str, script: str, *, directory: Path, **environment: str) -> None:
    path = directory / f"{uuid.uuid4().hex}.sql"
    path.write_text(script)
    completed = subprocess.run(
        [str(find_binary("psql")), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(path)],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr


async def test_the_logins_script_makes_each_login_a_member_of_its_group_only(
    bundled: list[Manifest], store_dsn: str, test_logins: dict[str, str], tmp_path: Path
) -> None:
    scripts = _named(bundled, "ConfigMap", f"{OWNER_SECRET}-logins")["data"]
    for _ in range(2):
        for component, login in test_logins.items():
            _psql(
                store_dsn,
                scripts["login.sql"],
                directory=tmp_path,
                FLOWFORGE_LOGIN=login,
                FLOWFORGE_PASSWORD=f"pw-{login}",
                FLOWFORGE_GROUP=GROUPS[component],
            )
        _psql(
            store_dsn,
            scripts["grant.sql"],
            directory=tmp_path,
            FLOWFORGE_LOGIN=test_logins["server"],
        )

    with psycopg.connect(store_dsn) as admin:
        rows = admin.execute(
            "SELECT r.rolname, r.rolcanlogin, r.rolsuper OR r.rolbypassrls OR r.rolcreaterole, "
            "ARRAY(SELECT g.rolname FROM pg_auth_members AS m JOIN pg_roles AS g "
            "ON g.oid = m.roleid WHERE m.member = r.oid) "
            "FROM pg_roles AS r WHERE r.rolname = ANY(%s)",
            (list(test_logins.values()),),
        ).fetchall()
        grants = admin.execute(
            "SELECT namespace FROM flowforge_reporting_grant WHERE grantee = %s",
            (test_logins["server"],),
        ).fetchall()
    assert sorted(rows) == sorted(
        (login, True, False, [GROUPS[component]]) for component, login in test_logins.items()
    )
    assert grants == [("*",)]
    verdicts = {}
    for component, login in test_logins.items():
        dsn = psycopg.conninfo.make_conninfo(store_dsn, user=login, password=f"pw-{login}")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as connection:
            try:
                await roles.require_read_only_login(connection)
                verdicts[component] = "reads only"
            except LoginTooPowerfulError:
                verdicts[component] = "writes"
    # each login has its group's rights: the operator's writes, the others read
    assert verdicts == {"operator": "writes", "webhook": "reads only", "server": "reads only"}
