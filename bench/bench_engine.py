"""Run-engine benchmark on the local control plane (kwok) and a local PostgreSQL.

Prints, in one run on the same cluster:
1. the ceiling: the rate at which a plain client creates Jobs that kwok completes;
2. completed single-task runs per minute through the operator, and its share of the ceiling;
3. hand-off latency with 50 concurrent chain runs (t0 -> t1 -> ... -> t4, four hand-offs
   each, 200 in all): FlowForge's part, from the moment a watcher sees a task's Pod finished
   (the operator reads the task's success from its Pod) to the moment a watcher sees its
   dependent's Job created, p50 / p99 / max; and beside it the whole step, Pod finished ->
   the dependent's Pod created (one Pod watcher, so its lag cancels out; the Job
   controller's part included), as ``bench_peer.py`` reports it;
4. the same chains' hand-offs driven by a plain client (a Pod watch and a pool of threads
   creating each next Job, no store, no checks), timed the same way: the bound the cluster
   itself puts on a hand-off when 50 chains move at once, and FlowForge's p99 against it.

Targets (issue 23): single-task throughput >= 95% of the ceiling; FlowForge's hand-off
p99 < 100 ms. The operator runs as the benches run it (``harness.processes``: Jobs kept,
no webhooks). Usage:

    .venv/bin/python bench/bench_engine.py [--cluster-dir DIR] [--jobs 200] [--runs 200]

With ``--tracing-rounds N`` it compares tracing off and on instead (issue 25: within 5%):
2N rounds interleaved off, on, on, off, ... each with a fresh operator (on: sending every
finished run's trace over OTLP/HTTP to a sink on 127.0.0.1 that accepts and drops them), each
round's single-task throughput and chain hand-off p99 measured as above; it prints the medians
per mode and the ratios on/off, and how many traces each "on" round dropped
(``flowforge_traces_dropped_total``: the exporter fell behind).
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

from harness.cluster import BenchEnvironment, bench_environment, exit_on_sigterm
from harness.runs import STEP, chain_definition
from harness.watch import (
    Watcher,
    figures,
    job_watcher,
    percentile,
    pod_watcher,
    raw_ceiling,
    raw_chain_handoffs,
)

METRICS_PORT = 19464
SINGLE = {
    "workflow": "single",
    "version": 1,
    "taskTypes": {"step": STEP},
    "tasks": [{"key": "only", "type": "step"}],
}


def operator_handoff() -> str:
    """The operator's own view: event received -> dependent Job created (histogram)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics").read().decode()
    buckets = [
        line
        for line in text.splitlines()
        if line.startswith("flowforge_handoff_latency_seconds_bucket")
    ]
    counts = [
        (line.split('le="')[1].split('"')[0], float(line.rsplit(" ", 1)[1])) for line in buckets
    ]
    total = counts[-1][1] if counts else 0
    shares = ", ".join(
        f"<= {le}s: {count / total:.0%}"
        for le, count in counts
        if total and le in ("0.05", "0.1", "0.25", "0.5", "1.0")
    )
    return f"operator-internal hand-off ({total:.0f} hand-offs): {shares}"


def single_task_throughput(env: BenchEnvironment, prefix: str, runs: int) -> float:
    """Single-task runs per minute, from their creation to the last one seen final."""
    started = time.monotonic()
    names = env.create_runs(prefix, "single", runs)
    phases = env.wait_finished(names, 600)
    assert set(phases.values()) == {"Succeeded"}, phases
    return len(names) / (time.monotonic() - started) * 60


def chain_handoffs(
    env: BenchEnvironment, prefix: str, *, chains: int, length: int
) -> dict[str, list[tuple[float, str]]]:
    """Each t(n-1) -> t(n) of ``chains`` concurrent chain runs, timed by a Job and a Pod
    watcher: ``flowforge`` (Pod finished -> next Job created) and ``step`` (Pod finished ->
    next Pod created)."""
    jobs = job_watcher(env.bench.batch, env.namespace)
    pods = pod_watcher(env.bench.core, env.namespace)
    names = env.create_runs(prefix, "chain", chains)
    env.wait_finished(names, 600, poll=2)
    time.sleep(1)
    jobs.close()
    pods.close()
    return {
        "flowforge": _handoffs(pods, jobs, names, length=length),
        "step": _handoffs(pods, pods, names, length=length),
    }


def _handoffs(
    finished: Watcher, created: Watcher, names: list[str], *, length: int
) -> list[tuple[float, str]]:
    """Upstream's Pod seen finished (``finished``) -> the dependent's object seen created
    (``created``)."""
    pods_of, next_of = finished.by_task(), created.by_task()
    handoffs: list[tuple[float, str]] = []
    for name in names:
        for n in range(1, length):
            upstream, dependent = pods_of.get((name, f"t{n - 1}")), next_of.get((name, f"t{n}"))
            if upstream in finished.completed and dependent in created.created:
                handoffs.append(
                    (
                        created.created[dependent] - finished.completed[upstream],
                        f"{name} t{n - 1}->t{n}",
                    )
                )
    return handoffs


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster-dir", type=Path, help="reuse a running local cluster")
    parser.add_argument("--jobs", type=int, default=200, help="Jobs for the raw ceiling")
    parser.add_argument("--runs", type=int, default=200, help="single-task runs")
    parser.add_argument("--chains", type=int, default=50, help="concurrent chain runs")
    parser.add_argument("--chain-length", type=int, default=5, help="tasks per chain run")
    parser.add_argument(
        "--controller-manager-qps",
        type=int,
        help="lift kube-controller-manager's client limit (default 20/s, which "
        "caps the cluster near 200 Jobs/min) on the bench's own cluster",
    )
    parser.add_argument(
        "--tracing-rounds",
        type=int,
        default=0,
        help="compare tracing off and on: this many rounds of each, interleaved",
    )
    args = parser.parse_args()
    if args.tracing_rounds:
        return await tracing_comparison(args)
    async with bench_environment(
        cluster_dir=args.cluster_dir, controller_manager_qps=args.controller_manager_qps
    ) as env:
        ceiling = raw_ceiling(env.bench.batch, env.namespace, args.jobs)
        print(
            f"raw ceiling: {ceiling:.0f} Jobs/min created and completed "
            f"({args.jobs} Jobs, plain client, 16 concurrent creations)"
        )
        await env.publish(SINGLE, chain_definition(args.chain_length))
        env.start_operator(metrics_port=METRICS_PORT)
        env.wait_finished(env.create_runs("warm", "chain", 1), 120)  # every path once

        throughput = single_task_throughput(env, "single", args.runs)
        print(
            f"single-task runs: {throughput:.0f} runs/min completed ({args.runs} runs) = "
            f"{throughput / ceiling:.0%} of the raw ceiling (target >= 95%)"
        )
        handoffs = chain_handoffs(env, "chain", chains=args.chains, length=args.chain_length)
        expected = args.chains * (args.chain_length - 1)
        for kind, label in (
            ("flowforge", "FlowForge's hand-off (Pod finished -> next Job created)"),
            ("step", "whole step (Pod finished -> next Pod created)"),
        ):
            latencies = [latency for latency, _ in handoffs[kind]]
            print(
                f"{label}, {len(latencies)} of {expected} in {args.chains} concurrent runs: "
                f"{figures(latencies)}"
            )
        print("(target: FlowForge's hand-off p99 < 100 ms)")
        print(operator_handoff())
        ours = [latency for latency, _ in handoffs["flowforge"]]
        plain = raw_chain_handoffs(
            env.bench.batch,
            env.bench.core,
            env.namespace,
            chains=args.chains,
            length=args.chain_length,
        )
        print(
            f"a plain client's hand-off, the same chains (Pod finished -> next Job created, no "
            f"store): {figures(plain)}; FlowForge's p99 / the plain client's: "
            f"{percentile(ours, 0.99) / percentile(plain, 0.99):.2f}"
        )
        print(
            "slowest: "
            + ", ".join(
                f"{where} {latency * 1000:.0f} ms"
                for latency, where in sorted(handoffs["flowforge"])[-3:]
            )
        )
        return 0


class _OtlpSink(http.server.BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP exports and drops them (an empty ExportTraceServiceResponse)."""

    spans_bytes = 0

    def do_POST(self) -> None:
        _OtlpSink.spans_bytes += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def _traces_dropped() -> float:
    """Traces the operator dropped (its exporter's queue full): 0 unless it fell behind."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics").read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("flowforge_traces_dropped_total ")
    )


async def tracing_comparison(args: argparse.Namespace) -> int:
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    tracing_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.server_address[1]}",
        "OTEL_SERVICE_NAME": "flowforge-bench",
    }
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    async with bench_environment(
        cluster_dir=args.cluster_dir, controller_manager_qps=args.controller_manager_qps
    ) as env:
        await env.publish(SINGLE, chain_definition(args.chain_length))
        order = [False, True, True, False] * ((args.tracing_rounds + 1) // 2)
        for index, traced in enumerate(order[: 2 * args.tracing_rounds]):
            env.start_operator(metrics_port=METRICS_PORT, extra_env=tracing_env if traced else None)
            env.wait_finished(env.create_runs(f"warm{index}", "chain", 1), 120)
            throughput = single_task_throughput(env, f"single{index}", args.runs)
            handoffs = chain_handoffs(
                env, f"chain{index}", chains=args.chains, length=args.chain_length
            )
            p99 = percentile([latency for latency, _ in handoffs["flowforge"]], 0.99)
            results[traced].append((throughput, p99))
            dropped = _traces_dropped()
            env.stop_operator()
            print(
                f"round {index + 1} tracing {'on ' if traced else 'off'}: "
                f"{throughput:.0f} runs/min, FlowForge's hand-off p99 {p99 * 1000:.0f} ms"
                + (f", {dropped:.0f} traces dropped" if traced else ""),
                flush=True,
            )
    sink.shutdown()
    off_rate = statistics.median(rate for rate, _ in results[False])
    on_rate = statistics.median(rate for rate, _ in results[True])
    off_p99 = statistics.median(p99 for _, p99 in results[False])
    on_p99 = statistics.median(p99 for _, p99 in results[True])
    print(
        f"medians of {args.tracing_rounds} rounds each: throughput off {off_rate:.0f}, "
        f"on {on_rate:.0f} runs/min (on/off {on_rate / off_rate:.3f}); hand-off p99 off "
        f"{off_p99 * 1000:.0f}, on {on_p99 * 1000:.0f} ms (on/off {on_p99 / off_p99:.3f}); "
        f"{_OtlpSink.spans_bytes} bytes of OTLP received (target: within 5%)"
    )
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(asyncio.run(main()))
