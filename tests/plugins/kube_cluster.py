"""pytest fixtures for the real local Kubernetes control plane.

- ``cluster`` (session): a control plane started for this pytest process in its own
  temporary folder, on its own free ports, stopped at the end of the session. Set
  FLOWFORGE_CLUSTER_DIR to reuse (and keep) a cluster started with
  ``python -m flowforge.localdev.controlplane up --dir DIR``.
- ``flowforge_crds`` (session): the checked-in crds/*.yaml applied and Established.
- ``namespace`` (function): a fresh namespace, deleted after the test.

A missing binary fails the tests with the build command; it never skips them.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowforge.domain.api import GROUP
from flowforge.localdev.binaries import BinariesMissingError, find_bin_dir, repo_root
from flowforge.localdev.cluster import KubectlError, wait_established
from flowforge.localdev.controlplane import Cluster, kubectl, start_cluster, stop_cluster
from tests.support.waiting import wait_until_blocking

_startup_report: list[str] = []


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        bin_dir = find_bin_dir()
    except BinariesMissingError as error:
        pytest.fail(f"local Kubernetes control plane unavailable: {error}", pytrace=False)
    reuse_dir = os.environ.get("FLOWFORGE_CLUSTER_DIR")
    state_dir = Path(reuse_dir) if reuse_dir else tmp_path_factory.mktemp("kube-cluster")
    started = start_cluster(state_dir=state_dir, bin_dir=bin_dir)
    _startup_report.append(
        f"local control plane at {started.server} ready in {started.startup_seconds:.1f} s "
        f"(state {started.state_dir})"
    )
    try:
        yield started
    finally:
        if not reuse_dir:
            stop_cluster(state_dir)


@pytest.fixture(scope="session")
def flowforge_crds(cluster: Cluster) -> list[str]:
    """Apply crds/*.yaml and wait until the apiserver serves them; returns CRD names."""
    crds_dir = repo_root() / "crds"
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(crds_dir))
    names = [path.name.removesuffix(".yaml") for path in sorted(crds_dir.glob("*.yaml"))]
    try:
        wait_established(cluster, [f"crd/{name}" for name in names])
    except KubectlError as error:
        pytest.fail(f"the CRDs are not Established after 60 s: {error}")
    _refresh_discovery(cluster, group=GROUP, expected=len(names))
    return names


def _refresh_discovery(cluster: Cluster, *, group: str, expected: int) -> None:
    # kubectl caches API discovery; `api-resources` refetches it, so that commands
    # which trust the cache (explain, get by category) see the new kinds.
    def served() -> bool:
        listed = kubectl(cluster, "api-resources", f"--api-group={group}", "-o", "name")
        return len(listed.stdout.split()) >= expected

    wait_until_blocking(served, timeout=30, what=f"the apiserver to serve the {group} kinds")


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own for one test, named after it, deleted afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:6]}"
    kubectl(cluster, "create", "namespace", name)
    _wait_for_default_service_account(cluster, name)
    try:
        yield name
    finally:
        kubectl(cluster, "delete", "namespace", name, "--wait=false", check=False)


def _wait_for_default_service_account(cluster: Cluster, namespace: str) -> None:
    # Pods are refused until the controller-manager has created the namespace's
    # default ServiceAccount; waiting here keeps that race out of the tests.
    kubectl(
        cluster, "wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=30s"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _startup_report:
        terminalreporter.write_line(line)
