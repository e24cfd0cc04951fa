"""Memory benchmark: the operator's RSS before, during and after 1,000 finished runs, this
code against a baseline (main, from a ``git worktree``); and a 10,000-task definition's size
as parsed models against its compact in-memory form.

The real operator process (``python -m flowforge.operator``) runs against the local control
plane (kwok) and a local PostgreSQL. Runs of several workflows (single-task, one definition
each) are created in waves; RSS is read from ``/proc/PID/status`` (``VmRSS``) after a
warm-up (start), every half second while the runs go (peak), and once everything finished
and the operator was idle for a while (end). Each code's operator is its own process on its
own namespace, one after the other, on the same cluster and database.

Target (issue 3/6): 1,000 finished runs leave RSS within 10% of where it started. Usage:

    .venv/bin/python bench/bench_memory.py [--runs 1000] [--wave 50] [--workflows 20]
        [--baseline main | --no-baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from bench_definition import generate_spec
from flowforge.domain.api import GROUP, RUN_PLURAL, VERSION
from flowforge.domain.compact import RunDefinition
from flowforge.domain.validation import parse_definition
from flowforge.store.definitions import publish_definition
from flowforge.store.pool import open_pool
from harness.cluster import (
    BenchEnvironment,
    baseline_checkout,
    bench_environment,
    exit_on_sigterm,
)
from harness.processes import start_operator, stop_process
from harness.runs import create_run_object

METRICS_PORT = 19474
# the environment the Dockerfile, the chart and `make dev` give the operator
DEPLOYED_ENV = ["MALLOC_ARENA_MAX=2"]
FINAL = {"Succeeded", "Failed", "Cancelled"}
REPO_OPERATOR = Path(__file__).resolve().parent.parent / "operator"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cached_runs() -> str:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics").read().decode()
    except OSError:
        return "?"
    for line in text.splitlines():
        if line.startswith("flowforge_cached_runs "):
            return line.split()[1]
    return "n/a"  # the baseline has no such gauge


def definition_figures() -> str:
    """tracemalloc of one 10,000-task definition: parsed models vs compact form."""
    document = generate_spec(tasks=10_000, edges=40_000)
    gc.collect()
    tracemalloc.start()
    spec = parse_definition(document)
    spec.graph.topological_order()
    gc.collect()
    full = tracemalloc.get_traced_memory()[0]
    compact = RunDefinition.of(spec, fingerprint=spec.fingerprint)
    del spec
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert compact.spec.task_count == 10_000
    return (
        f"10,000-task definition: {full / 2**20:.1f} MiB as parsed models, "
        f"{kept / 2**20:.1f} MiB in the compact form the operator keeps "
        f"({full / max(kept, 1):.0f}x smaller)"
    )


class Sampler:
    """Reads the operator's RSS every half second; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.peak = 0.0
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self._pid))
            time.sleep(0.5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def create_runs(custom: k8s.CustomObjectsApi, namespace: str, names: list[str], n: int) -> None:
    def create(chunk: list[str]) -> None:
        for name in chunk:
            index = int(name.rsplit("-", 1)[1])
            create_run_object(custom, namespace, name, workflow=f"mem-{index % n}")

    threads = [threading.Thread(target=create, args=(names[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def wait_finished(custom: k8s.CustomObjectsApi, namespace: str, names: list[str]) -> None:
    wanted, deadline = set(names), time.monotonic() + 900
    while time.monotonic() < deadline:
        listing = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, RUN_PLURAL)
        done = {
            item["metadata"]["name"]
            for item in listing["items"]
            if (item.get("status") or {}).get("phase") in FINAL
        }
        if wanted <= done:
            return
        time.sleep(1)
    raise SystemExit(f"runs not finished in 900 s: {len(wanted - done)} left")


def probe(operator: subprocess.Popen[bytes], directory: Path, number: int) -> None:
    """Ask the probed operator for its object counts (and tracemalloc snapshot)."""
    done = directory / f"probe-{number}.done"
    operator.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 300
    while not done.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"the operator wrote no {done}")
        time.sleep(0.5)


def probe_report(directory: Path, *, first: int, second: int, top: int = 25) -> str:
    """What grew between two probes: object counts by type, and (when traced) the
    allocation sites whose live size grew most."""
    before = json.loads((directory / f"probe-{first}.json").read_text())
    after = json.loads((directory / f"probe-{second}.json").read_text())
    grown = sorted(
        ((after.get(name, 0) - before.get(name, 0), name) for name in set(before) | set(after)),
        reverse=True,
    )
    lines = [f"  objects +{delta:7d}  {name}" for delta, name in grown[:top] if delta > 0]
    traced = directory / f"probe-{first}.snapshot"
    if traced.exists():
        old = tracemalloc.Snapshot.load(str(traced))
        new = tracemalloc.Snapshot.load(str(directory / f"probe-{second}.snapshot"))
        for stat in new.compare_to(old, "lineno")[:top]:
            lines.append(
                f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d}  {stat.traceback}"
            )
    return "\n".join(lines)


def run_batch(custom: k8s.CustomObjectsApi, namespace: str, names: list[str], args: Any) -> None:
    for first in range(0, len(names), args.wave):
        wave = names[first : first + args.wave]
        create_runs(custom, namespace, wave, args.workflows)
        wait_finished(custom, namespace, wave)


async def measure(
    env: BenchEnvironment,
    args: argparse.Namespace,
    *,
    label: str,
    python_path: Path,
    extra_env: dict[str, str],
    round_number: int,
) -> dict[str, Any]:
    namespace = env.bench.new_namespace(prefix=f"mem-{label[:4]}")
    pool = await open_pool(env.dsn, min_size=1, max_size=2)
    for n in range(args.workflows):
        spec = {
            "workflow": f"mem-{n}",
            "version": 1,
            "taskTypes": {"step": {"image": "busybox:1.36"}},
            "tasks": [{"key": "only", "type": "step", "config": {"n": n}}],
        }
        await publish_definition(pool, namespace=namespace, definition=parse_definition(spec))
    await pool.close()
    probes = None if args.probe is None else args.probe / f"{label}-{round_number}"
    command = None
    if probes is not None:
        traced = ("-X", f"tracemalloc={args.trace_frames}") if args.trace_frames else ()
        command = (sys.executable, *traced, str(Path(__file__).with_name("operator_probe.py")))
        command += (str(probes),)
    operator = start_operator(
        dsn=env.dsn,
        kubeconfig=env.kubeconfig,
        namespace=namespace,
        log=env.work / f"operator-mem-{label[:4]}.log",
        identity=f"mem-{label[:4]}",
        metrics_port=METRICS_PORT,
        extra_args=("--job-ttl", str(args.job_ttl)),
        extra_env={"FLOWFORGE_JOB_CREATION_QPS": "200", **extra_env},
        python_path=python_path,
        command=command,
        settle_seconds=0,
    )
    custom = k8s.CustomObjectsApi(env.api)
    try:
        time.sleep(8 + args.quiet)
        idle = rss_mib(operator.pid)
        run_batch(custom, namespace, [f"warm-{i:04d}" for i in range(args.warm)], args)
        time.sleep(args.quiet)
        start = rss_mib(operator.pid)
        if probes is not None:
            probe(operator, probes, 0)
        sampler = Sampler(operator.pid)
        started = time.monotonic()
        run_batch(custom, namespace, [f"run-{i:04d}" for i in range(args.runs)], args)
        elapsed = time.monotonic() - started
        time.sleep(args.quiet)
        sampler.close()
        end = rss_mib(operator.pid)
        figures = {
            "idle": idle,
            "start": start,
            "peak": max(sampler.peak, end),
            "end": end,
            "ratio": end / start,
            "seconds": elapsed,
            "cached": cached_runs(),
        }
        print(
            f"{label:>9} round {round_number}: RSS idle {idle:.1f} MiB, after {args.warm} warm-up "
            f"runs {start:.1f} MiB, peak {figures['peak']:.1f} MiB, after {args.runs} more "
            f"{end:.1f} MiB: end/start {end / start:.3f} (target <= 1.10), end/idle "
            f"{end / idle:.3f}; {args.runs} runs in {elapsed:.0f} s; runs cached at the end: "
            f"{figures['cached']}",
            flush=True,
        )
        if probes is not None:
            probe(operator, probes, 1)
            print(probe_report(probes, first=0, second=1), flush=True)
            operator.send_signal(signal.SIGUSR2)
            time.sleep(2)
            trimmed = json.loads((probes / "trim.json").read_text())
            print(
                f"  RSS {trimmed['before'] / 1024:.1f} MiB, after malloc_trim(0) "
                f"{trimmed['after'] / 1024:.1f} MiB (freed heap not yet given back)",
                flush=True,
            )
        return figures
    finally:
        stop_process(operator)


def environment(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000, help="runs after the warm-up")
    parser.add_argument("--warm", type=int, default=200, help="warm-up runs before 'start'")
    parser.add_argument("--wave", type=int, default=50, help="runs created at once")
    parser.add_argument("--workflows", type=int, default=20, help="definitions the runs use")
    parser.add_argument("--job-ttl", type=float, default=5.0, help="the operator's --job-ttl")
    parser.add_argument("--quiet", type=float, default=20.0, help="idle seconds before a read")
    parser.add_argument("--rounds", type=int, default=3, help="operators per code, alternated")
    parser.add_argument(
        "--env",
        action="append",
        default=None,
        help=f"this code's operator environment (default: {' '.join(DEPLOYED_ENV)})",
    )
    parser.add_argument("--baseline", default="main", help="git ref of the code to compare")
    parser.add_argument(
        "--baseline-env", action="append", default=[], help="the baseline's environment"
    )
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--probe", type=Path, help="write object counts of each operator here")
    parser.add_argument(
        "--trace-frames", type=int, default=0, help="with --probe: tracemalloc frames (slow)"
    )
    parser.add_argument("--cluster-dir", type=Path, help="reuse a running local cluster")
    args = parser.parse_args()
    own_env = environment(DEPLOYED_ENV if args.env is None else args.env)

    print(definition_figures(), flush=True)
    results: dict[str, list[dict[str, Any]]] = {"this code": []}
    async with bench_environment(cluster_dir=args.cluster_dir, controller_manager_qps=100) as env:
        with contextlib.ExitStack() as stack:
            baseline = None
            if not args.no_baseline:
                baseline = stack.enter_context(baseline_checkout(args.baseline))
                results[args.baseline] = []
            for round_number in range(args.rounds):
                results["this code"].append(
                    await measure(
                        env,
                        args,
                        label="this code",
                        python_path=REPO_OPERATOR,
                        extra_env=own_env,
                        round_number=round_number,
                    )
                )
                if baseline is not None:
                    results[args.baseline].append(
                        await measure(
                            env,
                            args,
                            label=args.baseline,
                            python_path=baseline,
                            extra_env=environment(args.baseline_env),
                            round_number=round_number,
                        )
                    )
    print(json.dumps(results))
    print(f"medians of {args.rounds} rounds (end/start: after {args.runs} runs / after warm-up):")
    for label, figures in results.items():
        print(
            f"  {label:>9}: start {median([f['start'] for f in figures]):.1f} MiB, end "
            f"{median([f['end'] for f in figures]):.1f} MiB, end/start "
            f"{median([f['ratio'] for f in figures]):.3f} (target <= 1.10), end/idle "
            f"{median([f['end'] / f['idle'] for f in figures]):.3f}"
        )
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(asyncio.run(main()))
