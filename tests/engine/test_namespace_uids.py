"""The operator records the uid of the run's namespace with the run (migration 15), read
from the apiserver, so that the read API can tell a re-created namespace from the one whose
name it took; a refusal to read it (RBAC) records none and does not stop the run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from flowforge.domain.validation import parse_definition
from flowforge.kube.errors import KubernetesRefusal, KubernetesUnavailable
from flowforge.operator.runs import NamespaceUids, RunRefusedError
from flowforge.store.definitions import publish_definition
from flowforge.store.queries import find_run_id_by_uid
from flowforge.store.runs import get_run
from tests.engine.conftest import NAMESPACE, Harness

pytestmark = pytest.mark.store

ONE_TASK = [{"key": "only"}]


async def recorded_uid(harness: Harness, run_id: int) -> str | None:
    async with harness.pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT namespace_uid FROM flowforge_run WHERE id = %s", (run_id,)
        )
        row = await cursor.fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


async def test_a_run_records_the_uid_its_namespace_has(harness: Harness) -> None:
    harness.kube.namespaces[NAMESPACE] = "uid-of-team-a"

    run = await harness.start("etl", ONE_TASK)

    assert await recorded_uid(harness, run.run_id) == "uid-of-team-a"
    assert (await get_run(harness.pool, run.run_id)).namespace == NAMESPACE


async def test_a_refusal_to_read_the_namespace_records_no_uid_and_the_run_starts(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    async def forbidden(namespace: str) -> str | None:
        raise KubernetesRefusal("namespaces is forbidden", status=403, reason="Forbidden")

    harness.engine.namespaces._read = forbidden  # an operator without `get namespaces`

    first = await harness.start("first", ONE_TASK)
    second = await harness.start("second", ONE_TASK)

    assert await recorded_uid(harness, first.run_id) is None
    assert await recorded_uid(harness, second.run_id) is None
    assert len(harness.kube.created) == 2  # both runs started
    warnings = [r for r in caplog.records if "namespace uids are not recorded" in r.message]
    assert len(warnings) == 1


def reader(
    answers: dict[str, str | None], calls: list[str]
) -> Callable[[str], Awaitable[str | None]]:
    async def read(namespace: str) -> str | None:
        calls.append(namespace)
        return answers.get(namespace)

    return read


async def test_uids_are_kept_a_while_and_read_again_after() -> None:
    calls: list[str] = []
    answers: dict[str, str | None] = {"team-a": "old"}
    uids = NamespaceUids(reader(answers, calls), ttl=3600)
    fresh = NamespaceUids(reader(answers, calls), ttl=0)

    assert [await uids.uid("team-a"), await uids.uid("team-a"), await uids.uid("gone")] == [
        "old",
        "old",
        None,
    ]
    answers["team-a"] = "new"  # deleted and re-created
    assert await fresh.uid("team-a") == "new"
    assert calls == ["team-a", "gone", "team-a"]


async def test_an_apiserver_that_does_not_answer_is_not_a_missing_namespace() -> None:
    async def down(namespace: str) -> str | None:
        raise KubernetesUnavailable("no answer", status=None, reason="Timeout")

    with pytest.raises(KubernetesUnavailable):  # the creation is retried, never made uid-less
        await NamespaceUids(down).uid("team-a")


async def test_a_run_never_runs_a_definition_of_an_earlier_namespace_of_the_same_name(
    harness: Harness,
) -> None:
    """The old team-a published payroll v5 (its configs, images); team-a was deleted and
    re-created by someone else, who applies a run naming payroll v5."""
    document = {
        "workflow": "payroll",
        "version": 1,
        "taskTypes": {"py": {"image": "registry.example/payroll:1"}},
        "tasks": [{"key": "pay", "type": "py", "config": {"bank": "secret"}}],
    }
    await publish_definition(
        harness.pool,
        namespace=NAMESPACE,
        definition=parse_definition(document),
        namespace_uid="uid-of-the-old-team-a",
    )
    harness.kube.namespaces[NAMESPACE] = "uid-of-the-new-team-a"
    body = harness.stored_run("steal", workflow="payroll")

    with pytest.raises(RunRefusedError, match="published in an earlier namespace named team-a"):
        await harness.engine.start_run(body)

    assert (
        await find_run_id_by_uid(harness.pool, namespace=NAMESPACE, uid=body["metadata"]["uid"])
        is None
    )
    assert harness.kube.created == []
    message = harness.kube.runs[(NAMESPACE, "steal")]["status"]["message"]
    assert "publish the workflow here under a new version" in message
