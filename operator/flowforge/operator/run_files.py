"""The run's ConfigMap exists, and is the one the run made, before each of its Jobs that
mounts it (a Job whose two files are both ``{}`` mounts none: `flowforge.domain.run_files`).

The first such Job creation of a run (in this process) creates the ConfigMap its Jobs mount
(`flowforge.kube.config_map`) and remembers its uid. AlreadyExists is success when the
ConfigMap found is the run's own, with the same data (a restart, another leader); one that
someone else put under the name is refused, and the attempt fails saying so.

A Pod mounts a ConfigMap by name, not by uid, and anyone who may write ConfigMaps in the
namespace can delete the run's and create another under its name (with the run as owner,
even). So before every later Job the uid under the name is read again (metadata only) and
compared with the one recorded: another uid is a ConfigMap someone else re-created, refused
like a forged Job (``ForgedConfigMap``: the attempt fails, never mounting it); none at all
(deleted) is created again, from the run's own data. Concurrent creations of one run share
one call. What this process knows is keyed by namespace and uid, bounded, and forgotten
when the run finishes.
"""

from __future__ import annotations

import asyncio

from flowforge.domain.execution import config_map_name
from flowforge.kube.config_map import build_config_map, same_config_map
from flowforge.kube.errors import KubernetesRefusal
from flowforge.operator.kubeport import KubePort
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.items import run_items

# runs whose ConfigMap's uid this process knows (beyond it the oldest are judged by content
# again, as after a restart)
_REMEMBERED_RUNS = 50_000

Key = tuple[str, str]


class ForgedConfigMap(KubernetesRefusal):
    """The ConfigMap under the run's name is not the one the run created (another uid)."""

    def __init__(self, *, name: str, recorded: str, found: str) -> None:
        super().__init__(
            f'configmaps "{name}" was deleted and re-created by someone else (uid {found}, '
            f"the run created uid {recorded}); it is never mounted: delete it and the next "
            "attempt creates the run's own again",
            status=409,
            reason="Conflict",
        )
        self.name = name
        self.found = found


class RunFiles:
    def __init__(self, kube: KubePort, pool: Pool) -> None:
        self._kube = kube
        self._pool = pool
        self._made: dict[Key, str | None] = {}  # uid; insertion-ordered, the oldest first
        self._pending: dict[Key, asyncio.Future[None]] = {}

    async def ensure(self, context: RunContext) -> None:
        """Make sure the run's own ConfigMap is there; raises `KubernetesError` when it
        cannot be (`ForgedConfigMap` when someone else's is)."""
        key = (context.namespace, context.uid)
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._ensure(context))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        # one waiter cancelled does not cancel the call the others wait for
        await asyncio.shield(pending)

    async def _ensure(self, context: RunContext) -> None:
        key = (context.namespace, context.uid)
        if key in self._made:
            recorded = self._made[key]
            name = config_map_name(run_name=context.name, run_uid=context.uid)
            found = await self._kube.config_map_uid(namespace=context.namespace, name=name)
            if found is not None and found == recorded:
                return
            if found is not None:
                raise ForgedConfigMap(name=name, recorded=str(recorded), found=found)
            del self._made[key]  # deleted: the run's own is created again
        await self._create(context)

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
        found = await self._kube.create_config_map(manifest)
        if not found.created and not same_config_map(found.body, manifest):
            name = manifest["metadata"]["name"]
            raise KubernetesRefusal(
                f'configmaps "{name}" already exists and is not this run\'s (another owner or '
                "other data); delete it and retry the run",
                status=409,
                reason="AlreadyExists",
            )
        self._made[(context.namespace, context.uid)] = found.uid
        while len(self._made) > _REMEMBERED_RUNS:
            del self._made[next(iter(self._made))]

    def forget(self, context: RunContext) -> None:
        """The run finished."""
        self._made.pop((context.namespace, context.uid), None)

    def __len__(self) -> int:
        return len(self._made)
