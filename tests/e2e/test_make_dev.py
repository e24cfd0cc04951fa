"""The `make dev` path, end to end: everything starts, the examples reach their expected
phases on the local control plane, and `make dev-down` leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowforge.localdev.controlplane import kubectl, load_cluster

pytestmark = pytest.mark.cluster


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command_line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in command_line and int(entry.name) != os.getpid():
            found.append(f"{entry.name}: {command_line[:200]}")
    return found


def _dev(action: str, state_dir: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowforge.localdev.dev", action, "--dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def dev_dir() -> Iterator[Path]:
    # Under /tmp: the local PostgreSQL runs as an unprivileged account that must reach it.
    with tempfile.TemporaryDirectory(prefix="flowforge-dev-test-", dir="/tmp") as directory:
        state_dir = Path(directory)
        state_dir.chmod(0o755)
        yield state_dir
        _dev("down", state_dir, timeout=120)


def _the_server_shows_the_examples_to_the_dev_user(dev_dir: Path, listing: str) -> None:
    """`make dev` prints the server's URL and how to get a token; that token lists the
    examples through it."""
    url = next(
        line.split(": ", 1)[1]
        for line in listing.splitlines()
        if line.startswith("flowforge server (API and UI): ")
    )
    assert "kubectl create token dev-user -n default" in listing
    cluster = load_cluster(dev_dir / "cluster")
    assert cluster is not None
    token = kubectl(cluster, "create", "token", "dev-user", "-n", "default").stdout.strip()
    request = urllib.request.Request(
        f"{url}/api/v1/runs?namespace=default", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        names = {run["name"] for run in json.loads(response.read())["items"]}
    assert {"etl-2026-11-30", "order-1001"} <= names


def test_make_dev_runs_the_examples_and_dev_down_stops_everything(dev_dir: Path) -> None:
    started = _dev("up", dev_dir, timeout=900)
    assert started.returncode == 0, started.stdout + started.stderr
    listing = started.stdout
    assert "==> examples" in listing
    rows = {
        line.split()[1]: line.split()
        for line in listing.splitlines()
        if line.startswith("default ")
    }
    assert rows["etl-2026-11-30"][4] == "Succeeded", listing
    assert rows["etl-2026-11-30"][5] == "4/4", listing
    assert rows["order-1001"][4] == "Failed", listing
    _the_server_shows_the_examples_to_the_dev_user(dev_dir, listing)

    again = _dev("up", dev_dir, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already running" in again.stdout, "re-running make dev reuses what runs"

    assert _processes_mentioning(str(dev_dir)), "the dev processes run from the state folder"
    stopped = _dev("down", dev_dir, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert _processes_mentioning(str(dev_dir)) == []
