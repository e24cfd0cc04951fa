"""The run's ConfigMap exists before its first Job: created once per run, remembered here.

The first Job creation of a run (in this process) creates the ConfigMap its Jobs mount
(`flowforge.kube.config_map`); concurrent creations of the same run wait for that one call.
AlreadyExists is success when the ConfigMap found is the run's own, with the same data (a
restart, another leader); one that someone else put under the name is refused, and the
attempt fails saying so. What this process knows is keyed by namespace and uid, bounded, and
forgotten when the run finishes.
"""

from __future__ import annotations

import asyncio

from flowforge.kube.config_map import build_config_map, same_config_map
from flowforge.kube.errors import KubernetesRefusal
from flowforge.operator.kubeport import KubePort
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.items import run_items

# runs whose ConfigMap this process knows exists (beyond it the oldest are asked again)
_REMEMBERED_RUNS = 50_000

Key = tuple[str, str]


class RunFiles:
    def __init__(self, kube: KubePort, pool: Pool) -> None:
        self._kube = kube
        self._pool = pool
        self._made: dict[Key, None] = {}  # insertion-ordered, the oldest forgotten first
        self._pending: dict[Key, asyncio.Future[None]] = {}

    async def ensure(self, context: RunContext) -> None:
        """Make sure the run's ConfigMap exists; raises `KubernetesError` when it cannot."""
        key = (context.namespace, context.uid)
        if key in self._made:
            return
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._create(context))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        # one waiter cancelled does not cancel the creation the others wait for
        await asyncio.shield(pending)

    async def _create(self, context: RunContext) -> None:
        manifest = build_config_map(
            namespace=context.namespace,
            run_name=context.name,
            run_uid=context.uid,
            parameters=context.parameters,
            configs=((task.key, task.config) for task in context.definition.spec.tasks()),
            items=(
                await run_items(self._pool, context.run_id)
                if context.definition.spec.has_items
                else None
            ),
        )
        existing = await self._kube.create_config_map(manifest)
        if existing is not None and not same_config_map(existing, manifest):
            name = manifest["metadata"]["name"]
            raise KubernetesRefusal(
                f'configmaps "{name}" already exists and is not this run\'s (another owner or '
                "other data); delete it and retry the run",
                status=409,
                reason="AlreadyExists",
            )
        self._made[(context.namespace, context.uid)] = None
        while len(self._made) > _REMEMBERED_RUNS:
            del self._made[next(iter(self._made))]

    def forget(self, context: RunContext) -> None:
        """The run finished."""
        self._made.pop((context.namespace, context.uid), None)

    def __len__(self) -> int:
        return len(self._made)
