"""Watchers that time Jobs, Pods and runs; the raw ceilings of a plain client; percentiles."""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s

CONCURRENT_CREATIONS = 16


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def figures(latencies: list[float]) -> str:
    return (
        f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms, "
        f"mean {statistics.fmean(latencies) * 1000:.0f} ms"
    )


def in_groups(action: Callable[[Any], object], items: Iterable[Any]) -> None:
    """``action`` on every item, CONCURRENT_CREATIONS threads at a time."""
    threads = [threading.Thread(target=action, args=(item,)) for item in items]
    for index in range(0, len(threads), CONCURRENT_CREATIONS):
        group = threads[index : index + CONCURRENT_CREATIONS]
        for thread in group:
            thread.start()
        for thread in group:
            thread.join()


def condition(kind: str) -> Callable[[dict[str, Any]], bool]:
    """Whether an object's ``status.conditions`` has ``kind`` true."""

    def holds(item: dict[str, Any]) -> bool:
        conditions = (item.get("status") or {}).get("conditions") or []
        return any(c["type"] == kind and c["status"] == "True" for c in conditions)

    return holds


job_complete = condition("Complete")


def pod_finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class Watcher:
    """Times when each object (Jobs, Pods or runs of one namespace) was first seen created and
    first seen finished, and its latest ``status.phase``.

    Reads the watch stream as raw JSON lines (no model classes): the instrument must not
    compete for the CPU it measures.
    """

    def __init__(
        self,
        lister: Callable[..., Any],
        namespace: str,
        *,
        finished: Callable[[dict[str, Any]], bool],
    ) -> None:
        self.created: dict[str, float] = {}
        self.completed: dict[str, float] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.annotations: dict[str, dict[str, str]] = {}
        self.phases: dict[str, str] = {}
        self._lister = lister
        self._namespace = namespace
        self._finished = finished
        self._stop = threading.Event()
        listing = json.loads(lister(namespace, _preload_content=False).data)
        self._version = listing["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            response = self._lister(
                self._namespace,
                watch=True,
                resource_version=self._version,
                timeout_seconds=5,
                allow_watch_bookmarks=True,
                _preload_content=False,
            )
            for line in response:
                now = time.monotonic()
                event = json.loads(line)
                item = event["object"]
                self._version = item["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                name = item["metadata"]["name"]
                self.created.setdefault(name, now)
                self.labels[name] = item["metadata"].get("labels") or {}
                self.annotations[name] = item["metadata"].get("annotations") or {}
                self.phases[name] = (item.get("status") or {}).get("phase", "")
                if self._finished(item):
                    self.completed.setdefault(name, now)
            response.release_conn()

    def by_task(self) -> dict[tuple[str, str], str]:
        """FlowForge's objects by (run, task), from their labels."""
        return {
            (labels.get("flowforge.io/run", ""), labels.get("flowforge.io/task", "")): name
            for name, labels in self.labels.items()
        }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def job_watcher(batch: k8s.BatchV1Api, namespace: str) -> Watcher:
    return Watcher(batch.list_namespaced_job, namespace, finished=job_complete)


def pod_watcher(core: k8s.CoreV1Api, namespace: str) -> Watcher:
    return Watcher(core.list_namespaced_pod, namespace, finished=pod_finished)


def run_watcher(
    custom: k8s.CustomObjectsApi,
    namespace: str,
    resource: tuple[str, str, str],
    *,
    final: Sequence[str],
) -> Watcher:
    """The phases of an engine's runs, from one watch: polling with a LIST of every run would
    cost the apiserver more than some engines do (and more for bigger run objects)."""
    group, version, plural = resource

    def lister(namespace: str, **options: Any) -> Any:
        return custom.list_namespaced_custom_object(group, version, namespace, plural, **options)

    return Watcher(
        lister,
        namespace,
        finished=lambda run: (run.get("status") or {}).get("phase") in final,
    )


def _plain_pod_spec() -> dict[str, Any]:
    return {"restartPolicy": "Never", "containers": [{"name": "task", "image": "busybox:1.36"}]}


def raw_ceiling(batch: k8s.BatchV1Api, namespace: str, count: int) -> float:
    """Jobs per minute a plain client gets created and completed by kwok."""
    return _raw_rate(
        job_watcher(batch, namespace),
        count,
        lambda name: batch.create_namespaced_job(
            namespace,
            {
                "metadata": {"name": name, "labels": {"bench": "raw"}},
                "spec": {"backoffLimit": 0, "template": {"spec": _plain_pod_spec()}},
            },
        ),
    )


def raw_pod_ceiling(
    core: k8s.CoreV1Api, namespace: str, count: int, *, owner: dict[str, Any]
) -> float:
    """Pods per minute a plain client gets created and completed by kwok. ``owner``: the
    ownerReference of a kind kwok completes (a Pod of no owner keeps running)."""
    return _raw_rate(
        pod_watcher(core, namespace),
        count,
        lambda name: core.create_namespaced_pod(
            namespace,
            {"metadata": {"name": name, "ownerReferences": [owner]}, "spec": _plain_pod_spec()},
        ),
    )


def _raw_rate(watcher: Watcher, count: int, create: Callable[[str], object]) -> float:
    prefix = f"raw-{uuid.uuid4().hex[:5]}"
    started = time.monotonic()
    in_groups(lambda index: create(f"{prefix}-{index}"), range(count))
    while sum(1 for name in watcher.completed if name.startswith(prefix)) < count:
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    watcher.close()
    return count / elapsed * 60


def raw_chain_handoffs(
    batch: k8s.BatchV1Api, core: k8s.CoreV1Api, namespace: str, *, chains: int, length: int
) -> list[float]:
    """The chains' burst driven by a plain client, the bound of a hand-off on this cluster:
    ``chains`` chains of ``length`` Jobs started at once, each next Job created by a pool of
    CONCURRENT_CREATIONS threads (as many as the operator's API client has) the moment a Pod
    watch sees its step's Pod succeed; no store, no checks. Timed as FlowForge's are: the
    Pod seen finished -> the next Job seen created, by the same two watchers."""
    prefix = f"rawchain-{uuid.uuid4().hex[:5]}"
    jobs, pods = job_watcher(batch, namespace), pod_watcher(core, namespace)

    def create(chain: int, step: int) -> None:
        labels = {
            "bench": prefix,
            "flowforge.io/run": f"{prefix}-{chain}",
            "flowforge.io/task": f"t{step}",
        }
        template = {"metadata": {"labels": labels}, "spec": _plain_pod_spec()}
        batch.create_namespaced_job(
            namespace,
            {
                "metadata": {"name": f"{prefix}-{chain}-t{step}", "labels": labels},
                "spec": {"backoffLimit": 0, "template": template},
            },
        )

    with ThreadPoolExecutor(CONCURRENT_CREATIONS) as creations:
        driver = threading.Thread(
            target=_hand_on,
            kwargs={
                "core": core,
                "namespace": namespace,
                "selector": f"bench={prefix}",
                "next_job": lambda chain, step: creations.submit(create, chain, step),
                "length": length,
                "handoffs": chains * (length - 1),
            },
            daemon=True,
        )
        driver.start()
        in_groups(lambda chain: create(chain, 0), range(chains))
        driver.join(timeout=600)
    time.sleep(1)
    jobs.close()
    pods.close()
    pods_of, jobs_of = pods.by_task(), jobs.by_task()
    latencies = []
    for chain in range(chains):
        for step in range(1, length):
            upstream = pods_of.get((f"{prefix}-{chain}", f"t{step - 1}"))
            dependent = jobs_of.get((f"{prefix}-{chain}", f"t{step}"))
            if upstream in pods.completed and dependent in jobs.created:
                latencies.append(jobs.created[dependent] - pods.completed[upstream])
    return latencies


def _hand_on(
    *,
    core: k8s.CoreV1Api,
    namespace: str,
    selector: str,
    next_job: Callable[[int, int], object],
    length: int,
    handoffs: int,
) -> None:
    """The plain client's hand-off: a chain's step's Pod seen succeeded -> its next Job."""
    handed: set[tuple[str, int]] = set()
    response = core.list_namespaced_pod(
        namespace, label_selector=selector, watch=True, timeout_seconds=600, _preload_content=False
    )
    for line in response:
        pod = json.loads(line)["object"]
        if (pod.get("status") or {}).get("phase") != "Succeeded":
            continue
        labels = pod["metadata"]["labels"]
        run, step = labels["flowforge.io/run"], int(labels["flowforge.io/task"][1:]) + 1
        if step < length and (run, step) not in handed:
            handed.add((run, step))
            next_job(int(run.rsplit("-", 1)[1]), step)
        if len(handed) == handoffs:
            break
    response.release_conn()
