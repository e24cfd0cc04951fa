"""The real operator as a child process; CPU time from /proc; the profiler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psycopg

PROFILE_DIR = os.environ.get("FLOWFORGE_BENCH_PROFILE", "")
# What every bench's operator differs in from the shipped one: Jobs are kept (the watchers
# read them after the run) and its Job creations are not rate-limited below the cluster's.
BENCH_OPERATOR_ARGS = ("--job-ttl", "-1")
BENCH_OPERATOR_ENV = {"FLOWFORGE_JOB_CREATION_QPS": "200"}


def start_operator(
    *,
    dsn: str,
    kubeconfig: Path,
    namespace: str,
    log: Path,
    metrics_port: int,
    identity: str = "bench",
    extra_args: Sequence[str] = BENCH_OPERATOR_ARGS,
    extra_env: Mapping[str, str] = BENCH_OPERATOR_ENV,
    python_path: Path | None = None,
    command: Sequence[str] | None = None,
    settle_seconds: float = 8,
) -> subprocess.Popen[bytes]:
    """The real operator (``python -m flowforge.operator``) on ``namespace``, logging to
    ``log``, given ``settle_seconds`` to start its watches; ``python_path``: run another
    checkout's code; ``command``: what runs it instead (e.g. a probe)."""
    environment = {**os.environ, **extra_env}
    if python_path is not None:
        environment["PYTHONPATH"] = str(python_path)
    operator = subprocess.Popen(
        [
            *(command or (sys.executable, "-m", "flowforge.operator")),
            "--dsn",
            dsn,
            "--namespace",
            namespace,
            "--kubeconfig",
            str(kubeconfig),
            "--identity",
            identity,
            "--metrics-port",
            str(metrics_port),
            *extra_args,
        ],
        env=environment,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    if PROFILE_DIR:
        Profiler.sample(operator.pid, Path(PROFILE_DIR) / f"operator-{namespace}.txt")
    time.sleep(settle_seconds)
    return operator


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Profiler:
    """``FLOWFORGE_BENCH_PROFILE=DIR``: py-spy samples the operator's Python while it holds the
    GIL, that is its CPU time and not its waits (py-spy is its own process, so the CPU figures
    do not count it), into DIR, and PostgreSQL's pg_stat_statements counts the statements of
    the measured part of a turn (``begin`` .. ``report``)."""

    @staticmethod
    def sample(pid: int, output: Path) -> None:
        output.parent.mkdir(parents=True, exist_ok=True)
        py_spy = Path(sys.executable).parent / "py-spy"
        command = [str(py_spy), "record", "--nonblocking", "--gil", "-r", "50", "-f", "raw"]
        subprocess.Popen(
            [*command, "-o", str(output), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # ends when the operator does

    @staticmethod
    def begin(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            connection.execute("SELECT pg_stat_statements_reset()")

    @staticmethod
    def report(dsn: str, *, tasks: int, output: Path) -> None:
        with psycopg.connect(dsn, autocommit=True) as connection:
            rows = connection.execute(
                "SELECT calls, total_exec_time, query FROM pg_stat_statements "
                "WHERE query NOT LIKE '%%pg_stat_statements%%' ORDER BY calls DESC"
            ).fetchall()
        lines = [
            f"{calls / max(tasks, 1):8.2f} calls/task {ms / max(tasks, 1):8.3f} ms/task  "
            + " ".join(str(query).split())[:160]
            for calls, ms, query in rows
        ]
        total = sum(int(row[0]) for row in rows) / max(tasks, 1)
        output.write_text(f"{total:.2f} statements/task over {tasks} tasks\n" + "\n".join(lines))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a running process and of every descendant, live or reaped,
    from /proc."""
    ticks = 0
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    pending = [pid]
    while pending:
        current = pending.pop()
        if current in stats:
            ticks += sum(int(value) for value in stats[current][11:15])
        pending.extend(children.get(current, []))
    return ticks / os.sysconf("SC_CLK_TCK")


def cluster_cpu_seconds(cluster_dir: Path) -> float:
    """CPU time so far of the control plane's own processes (kube-apiserver, etcd,
    kube-controller-manager, kube-scheduler, kwok): those whose command line names
    ``cluster_dir``, where kwokctl keeps their state."""
    marker = str(cluster_dir).encode()
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "cmdline").read_bytes():
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        ticks += sum(int(value) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_pid(directory: Path) -> int:
    """The postmaster of the local server in ``directory`` (localdev_postgres.start's)."""
    return int((directory / "data" / "postmaster.pid").read_text().split()[0])
