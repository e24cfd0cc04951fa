"""PostgreSQL stopped for 30 s, and paused (SIGSTOP) for 30 s, while runs are in flight.

Runs pause and then all finish, exactly once; the operator rides it out without leader
flapping (one acquisition; at most one "stopped acting" and one "acting again"); readiness
goes false during the outage and true after; liveness stays true (the loop is never blocked);
and after the database is back nothing is stuck longer than the statement timeout.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flowforge.kube.webhook_config import TIMEOUT_SECONDS as WEBHOOK_TIMEOUT_SECONDS
from flowforge.kube.webhook_config import VALIDATE_DEFINITION_HANDLER_ID
from flowforge.localdev import postgres as localdev
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.connection import Pool
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
from tests.plugins.operator import JobCreationLog, OperatorProcess, RunDriver, wait_for_leader
from tests.plugins.webhooks import WebhookHttps, spawn_webhook_server, stop_webhook_server
from tests.support.admission import ADMIN, admission_review, definition
from tests.support.exactly_once import assert_exactly_once, diamond
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

OUTAGE_SECONDS = 30.0
STATEMENT_TIMEOUT = 5.0
RUNS = 5


def probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


class ProbeLog:
    """/readyz and /healthz, sampled every 0.25 s from a thread of the test."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, ready, live)

    async def run(self) -> None:
        while True:
            ready = await asyncio.to_thread(probe, self.port, "/readyz")
            live = await asyncio.to_thread(probe, self.port, "/healthz")
            self.samples.append((time.monotonic(), ready, live))
            await asyncio.sleep(0.25)

    def ready_between(self, start: float, end: float) -> set[int]:
        return {ready for at, ready, _ in self.samples if start <= at <= end}

    def first_ready_after(self, moment: float) -> float | None:
        return next((at for at, ready, _ in self.samples if at >= moment and ready == 200), None)


def server_processes(data_directory: Path) -> list[int]:
    """The postmaster and its children (backends, background workers), by pid."""
    postmaster = int((data_directory / "postmaster.pid").read_text().splitlines()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(entry.name))
    return [postmaster, *children]


@contextmanager
def paused(data_directory: Path) -> Iterator[None]:
    pids = server_processes(data_directory)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in reversed(pids):
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
async def outage_postgres() -> AsyncIterator[tuple[Path, int, str]]:
    """A PostgreSQL server of this test alone, to stop or pause and restart on its port."""
    directory = Path(tempfile.mkdtemp(prefix="flowforge-outage-"))
    server = localdev.start(directory, settings={"fsync": "off"})
    await migrate(server.dsn)
    try:
        yield directory, server.port, server.dsn
    finally:
        localdev.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


def lease_lines(operator: OperatorProcess) -> dict[str, int]:
    text = operator.log_path.read_text(errors="replace")
    return {
        "acquired": text.count(" acquired by "),
        "stopped": text.count("not renewed before it expired"),
        "resumed": text.count("after expiry: acting again"),
        "deposed": text.count("another operator took over"),
    }


@pytest.mark.parametrize("fault", ["stopped", "paused"])
async def test_runs_ride_out_a_thirty_second_postgres_outage(
    fault: str,
    operators: Callable[..., OperatorProcess],
    driver: RunDriver,
    outage_postgres: tuple[Path, int, str],
) -> None:
    directory, port, dsn = outage_postgres
    health_port = free_port()
    pool: Pool = await open_pool(dsn, min_size=1, max_size=4)
    outage_driver = RunDriver(api=driver.api, namespace=driver.namespace, pool=pool)
    env = {
        "FLOWFORGE_HEALTH_PORT": str(health_port),
        "FLOWFORGE_DB_STATEMENT_TIMEOUT": str(STATEMENT_TIMEOUT),
        "FLOWFORGE_LOOP_STALL": "3",
    }
    operator = operators(dsn=dsn, env=env)
    probes = ProbeLog(health_port)
    sampling = asyncio.create_task(probes.run())
    try:
        await wait_for_leader(pool, operator.identity, process=operator)
        await outage_driver.publish(diamond(f"outage-{fault}"))
        log = JobCreationLog(driver.api, driver.namespace)
        names = [f"outage-{fault}-{i}" for i in range(RUNS)]
        for name in names:
            outage_driver.create_run(name, workflow=f"outage-{fault}")
        await wait_until(
            lambda: len(outage_driver.jobs()) >= RUNS, timeout=60, what="a Job of every run"
        )
        began = time.monotonic()
        if fault == "stopped":
            await pool.close()
            localdev.stop(directory)
            await asyncio.sleep(OUTAGE_SECONDS)
            phases = {n: (outage_driver.run(n).get("status") or {}).get("phase") for n in names}
            localdev.start(directory, settings={"fsync": "off", "port": str(port)})
            pool = await open_pool(dsn, min_size=1, max_size=4)
            outage_driver.pool = pool
        else:
            with paused(directory / "data"):
                await asyncio.sleep(OUTAGE_SECONDS)
                phases = {n: (outage_driver.run(n).get("status") or {}).get("phase") for n in names}
        back = time.monotonic()
        assert "Failed" not in phases.values(), phases
        assert not set(phases.values()) <= {"Succeeded"}, f"runs did not pause: {phases}"
        finished = await outage_driver.wait_finished(names, timeout=60)
        done = time.monotonic()
        assert set(finished.values()) == {"Succeeded"}, (finished, operator.log_tail())
        await log.caught_up(jobs=4 * RUNS)
        log.close()
        assert operator.running, "the operator must ride out the outage, not die"
        await assert_exactly_once(outage_driver, log, names)

        ready_again = probes.first_ready_after(back)
        recovered = done - back
        lines = lease_lines(operator)
        print(
            f"\n{fault}: outage {back - began:.1f} s, ready again after"
            f" {None if ready_again is None else round(ready_again - back, 1)} s,"
            f" all runs finished {recovered:.1f} s after, lease lines {lines}"
        )
        # readiness false during the outage, true again soon after it
        assert probes.ready_between(began + 6, back - 1) == {503}, probes.samples
        assert ready_again is not None and ready_again - back < STATEMENT_TIMEOUT + 5
        # liveness never failed once served: the loop was never blocked
        served = next(at for at, _, live in probes.samples if live == 200)
        assert {live for at, _, live in probes.samples if at >= served} == {200}, probes.samples
        # nothing hung past the statement timeout (plus psycopg's cancel) once it was back
        assert recovered < 2 * STATEMENT_TIMEOUT + 20, recovered
        assert lines["acquired"] == 1 and lines["deposed"] == 0, lines
        assert lines["stopped"] <= 1 and lines["resumed"] == lines["stopped"], lines
    finally:
        sampling.cancel()
        await pool.close()


def test_admission_answers_before_the_apiserver_gives_up_while_postgres_is_paused(
    cluster: Cluster,
    flowforge_crds: list[str],
    outage_postgres: tuple[Path, int, str],
    tmp_path: Path,
) -> None:
    """A wedged database must not hang `kubectl apply` for the webhook's whole timeout: the
    webhook's pool bounds every read (``store/session.py::WEBHOOK_LIMITS``) and refuses."""
    directory, _, dsn = outage_postgres
    namespace = f"pg-paused-{os.getpid()}"
    kubectl(cluster, "create", "namespace", namespace)  # the templates' dry-run needs it
    server = spawn_webhook_server(cluster, directory=tmp_path, dsn=dsn)
    https = WebhookHttps(server, client=cluster.webhook_client)
    review = admission_review(  # an administrator, so that only the store can refuse it
        definition(name="paused") | {"metadata": {"name": "paused", "namespace": namespace}},
        namespace=namespace,
        user=ADMIN,
    )
    try:
        before = https.post(VALIDATE_DEFINITION_HANDLER_ID, review).json()["response"]
        with paused(directory / "data"):
            started = time.monotonic()
            during = https.post(VALIDATE_DEFINITION_HANDLER_ID, review, timeout=30).json()
            elapsed = time.monotonic() - started
        after = https.post(VALIDATE_DEFINITION_HANDLER_ID, review).json()["response"]
    finally:
        stop_webhook_server(server)
    assert before["allowed"] is True, before
    assert during["response"]["allowed"] is False, during
    assert elapsed < WEBHOOK_TIMEOUT_SECONDS - 1, elapsed  # then the apiserver gives up
    assert after["allowed"] is True, after
