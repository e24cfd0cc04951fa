"""The read API against the real control plane and PostgreSQL: a ServiceAccount bound in
namespace A (a real token from ``kubectl create token``) reads A's runs and nothing of B;
no token or a bad one is a 401; hostile parameters are 400s naming the parameter."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client as k8s

from flowforge.kube.reviews import ApiReviews
from tests.plugins.api_server import (
    ApiServer,
    Tenancy,
    create_run,
    started_api_server,
    wait_phase,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
async def finished_runs(tenancy: Tenancy, engine: object) -> dict[str, str]:
    """A diamond run that succeeded in A and one in B."""
    names = {tenancy.a: "diamond-a", tenancy.b: "diamond-b"}
    for namespace, name in names.items():
        create_run(tenancy.api, namespace, name, "diamond")
    for namespace, name in names.items():
        await wait_phase(tenancy.api, namespace, name, {"Succeeded"})
    return names


def test_no_token_or_a_bad_one_is_unauthorized(api_server: ApiServer) -> None:
    for token in (None, "not-a-token", "x" * 20000):
        answer = api_server.request("/api/v1/whoami", token=token)
        assert answer.status == 401, answer.body
        assert answer.json()["error"]["reason"] == "Unauthorized"
    assert api_server.request("/healthz").body == b"ok"
    assert api_server.request("/api/v1/runs").status == 401


def test_whoami_names_the_service_account(api_server: ApiServer, tenancy: Tenancy) -> None:
    answer = api_server.request("/api/v1/whoami", token=tenancy.reader_token)
    assert answer.status == 200, answer.body
    assert answer.json()["username"] == f"system:serviceaccount:{tenancy.a}:reader"
    assert "system:serviceaccounts" in answer.json()["groups"]


def test_a_user_of_namespace_a_sees_only_a(
    api_server: ApiServer, tenancy: Tenancy, finished_runs: dict[str, str]
) -> None:
    token = tenancy.reader_token
    listed = api_server.request("/api/v1/runs", token=token).json()
    assert {(r["namespace"], r["name"]) for r in listed["items"]} >= {(tenancy.a, "diamond-a")}
    assert all(r["namespace"] == tenancy.a for r in listed["items"])
    in_a = api_server.request(f"/api/v1/runs?namespace={tenancy.a}", token=token).json()
    run = next(r for r in in_a["items"] if r["name"] == "diamond-a")
    assert run["phase"] == "Succeeded" and run["progress"]["succeeded"] == 4
    assert run["workflow"] == "diamond" and run["version"] == 1 and run["queue"] is None
    assert run["durationSeconds"] is not None and run["createdAt"].endswith("Z")

    forbidden = api_server.request(f"/api/v1/runs?namespace={tenancy.b}", token=token)
    assert forbidden.status == 403 and forbidden.json()["error"]["reason"] == "Forbidden"
    assert tenancy.b in forbidden.json()["error"]["message"]
    for path in (
        f"/api/v1/namespaces/{tenancy.b}/runs/diamond-b",
        f"/api/v1/namespaces/{tenancy.b}/runs/diamond-b/graph",
        f"/api/v1/namespaces/{tenancy.b}/runs/diamond-b/tasks/a",
        f"/api/v1/namespaces/{tenancy.b}/runs/diamond-b/tasks/a/attempts/1/log",
        f"/api/v1/namespaces/{tenancy.b}/runs/diamond-b/stream",
        f"/api/v1/namespaces/{tenancy.b}/definitions",
    ):
        assert api_server.request(path, token=token).status == 403, path
    namespaces = api_server.request("/api/v1/namespaces", token=token).json()
    assert namespaces == {"items": [{"name": tenancy.a}], "continue": None}


async def test_the_namespaces_are_read_page_by_page_to_the_last(tenancy: Tenancy) -> None:
    """The server's LIST of namespaces follows the apiserver's continue tokens: with two a
    page it reads every namespace (more than four here) with its uid."""
    reviews = ApiReviews.connect(kubeconfig=str(tenancy.kubeconfig))
    try:
        paged = await reviews.namespace_uids(page_size=2)
        named = await reviews.namespace_uids([tenancy.b, tenancy.a, "no-such-namespace"])
    finally:
        reviews.close()
    listed = k8s.CoreV1Api(tenancy.api).list_namespace().items
    assert paged == {item.metadata.name: item.metadata.uid for item in listed}
    assert len(paged) > 4
    assert named == {tenancy.b: paged[tenancy.b], tenancy.a: paged[tenancy.a]}


def test_run_detail_graph_and_task(
    api_server: ApiServer, tenancy: Tenancy, finished_runs: dict[str, str]
) -> None:
    token, base = tenancy.reader_token, f"/api/v1/namespaces/{tenancy.a}/runs/diamond-a"
    detail = api_server.request(base, token=token).json()
    assert [t["name"] for t in detail["tasks"]] == ["a", "b", "c", "d"]
    assert [t["level"] for t in detail["tasks"]] == [0, 1, 1, 2]
    d = detail["tasks"][3]
    assert d["dependsOn"] == ["b", "c"] and d["state"] == "succeeded" and d["attempts"] == 1
    assert d["exitCode"] == 0 and d["durationSeconds"] is not None
    assert detail["tasks"][0]["compensator"] == {
        "name": "undo-a",
        "state": "not_triggered",
        "type": "quick",
    }
    assert detail["compensation"]["state"] == "NotTriggered"
    assert {c["type"]: c["status"] for c in detail["conditions"]}["Ready"] == "True"
    kinds = [event["kind"] for event in detail["events"]]
    assert kinds[0] == "run.created" and kinds[-1] == "run.succeeded"
    graph = api_server.request(f"{base}/graph", token=token).json()
    assert graph["levels"] == 3
    assert sorted(map(tuple, graph["edges"])) == [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]
    assert {n["id"]: n["state"] for n in graph["nodes"]} == dict.fromkeys("abcd", "succeeded")
    task = api_server.request(f"{base}/tasks/b", token=token).json()
    (attempt,) = task["attemptHistory"]
    assert attempt["number"] == 1 and attempt["state"] == "succeeded"
    assert attempt["jobName"] and attempt["exitCode"] == 0
    missing = api_server.request(f"{base}/tasks/zzz", token=token)
    assert missing.status == 404 and missing.json()["error"]["reason"] == "NotFound"


def test_hostile_parameters_are_refused_by_name(api_server: ApiServer, tenancy: Tenancy) -> None:
    token = tenancy.reader_token
    for query, parameter in (
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=abc", "limit"),
        ("namespace=Bad_NS", "namespace"),
        ("phase=';drop", "phase"),
        ("continue=%%%", "continue"),
        ("continue=eyJiZWZvcmUiOiAtMX0", "continue"),
    ):
        answer = api_server.request(f"/api/v1/runs?{query}", token=token)
        assert answer.status == 400, (query, answer.body)
        assert answer.json()["error"]["reason"] == "BadRequest"
        assert parameter in answer.json()["error"]["message"], answer.body
    bad_name = api_server.request(f"/api/v1/namespaces/{tenancy.a}/runs/..%2Fx", token=token)
    assert bad_name.status in (400, 404)


def test_openapi_and_the_ui_files(api_server: ApiServer) -> None:
    document = api_server.request("/api/v1/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert "/api/v1/namespaces/{namespace}/runs/{name}/stream" in document["paths"]
    assert {"RunSummary", "RunDetail", "Graph", "RunChange"} <= set(
        document["components"]["schemas"]
    )
    # client-side routes get the UI's page (or, in a checkout without the built UI, a 404
    # that says so); every answer carries the strict policy
    page = api_server.request("/runs/some-ns/some-run")
    assert page.status == 200 or b"not built" in page.body
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    assert api_server.request("/api/v1/nothing-here").status == 404


def test_definitions_with_versions_fingerprints_and_graph(
    api_server: ApiServer, tenancy: Tenancy
) -> None:
    token, base = tenancy.reader_token, f"/api/v1/namespaces/{tenancy.a}/definitions"
    listed = api_server.request(base, token=token).json()["items"]
    assert {item["name"] for item in listed} == {"diamond", "failing", "slow"}
    diamond = next(item for item in listed if item["name"] == "diamond")
    (version,) = diamond["versions"]
    assert version["version"] == 1 and version["fingerprint"].startswith("sha256:")
    assert version["tasks"] == 5
    detail = api_server.request(f"{base}/diamond", token=token).json()
    (shown,) = detail["versions"]
    assert shown["fingerprint"] == version["fingerprint"]
    assert shown["taskTypes"]["quick"]["image"] == "busybox:1.36"
    assert {node["id"] for node in shown["graph"]["nodes"]} == {"a", "b", "c", "d"}
    assert all(node["state"] is None for node in shown["graph"]["nodes"])
    assert shown["graph"]["rollback"] == ["undo-a"]
    missing = api_server.request(f"{base}/nope", token=token)
    assert missing.status == 404


def test_the_ui_s_files_hashed_assets_cached_and_nothing_outside(
    tenancy: Tenancy, tmp_path: Path
) -> None:
    static = tmp_path / "static"
    (static / "assets").mkdir(parents=True)
    (static / "index.html").write_text("<!doctype html><title>FlowForge</title>")
    (static / "assets" / "app-3f2a.js").write_text("console.log('ui')")
    (tmp_path / "secret.txt").write_text("not for you")
    with started_api_server(tenancy, tmp_path / "ui.log", "--static-dir", str(static)) as ui:
        for route in ("/", "/runs/team-a/etl-1", "/definitions/x"):
            page = ui.request(route)
            assert page.status == 200 and b"<title>FlowForge</title>" in page.body, route
            assert page.headers["cache-control"] == "no-cache"
            assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        asset = ui.request("/assets/app-3f2a.js")
        assert asset.status == 200 and asset.body == b"console.log('ui')"
        assert asset.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert ui.request("/assets/missing.js").status == 404
        for sneaky in ("/assets/..%2F..%2Fsecret.txt", "/..%2Fsecret.txt", "/%2e%2e/secret.txt"):
            assert b"not for you" not in ui.request(sneaky).body, sneaky
