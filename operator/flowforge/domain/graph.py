"""The dependency graph of a definition's forward tasks.

Every walk here is iterative (no recursion), so a generated chain of thousands of tasks
cannot hit the interpreter's recursion limit. Orders are deterministic: ties are broken by
ascending task key, whatever order the tasks were declared in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from flowforge.domain.errors import CyclicDependencyError, UnknownDependencyError


class DependencyGraph:
    """Forward tasks and the ``dependsOn`` edges between them; immutable once built."""

    __slots__ = ("_dependencies", "_dependents", "_levels", "_order")

    def __init__(self, dependencies: Mapping[str, Iterable[str]]) -> None:
        """Build from ``key -> keys it depends on``; every dependency must be a key."""
        self._dependencies: dict[str, frozenset[str]] = {
            key: frozenset(depends_on) for key, depends_on in dependencies.items()
        }
        dependents: dict[str, list[str]] = {key: [] for key in self._dependencies}
        # lists, not sets: the sort walks them 40,000 times on a large graph
        for key, depends_on in self._dependencies.items():
            for dependency in depends_on:
                if dependency not in dependents:
                    raise UnknownDependencyError(
                        f"task {key!r} depends on unknown task {dependency!r}", path="spec.tasks"
                    )
                dependents[dependency].append(key)
        self._dependents = dependents
        self._order: tuple[str, ...] | None = None
        self._levels: tuple[tuple[str, ...], ...] | None = None

    def __len__(self) -> int:
        return len(self._dependencies)

    def __contains__(self, key: object) -> bool:
        return key in self._dependencies

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self._dependencies)

    def dependencies_of(self, key: str) -> frozenset[str]:
        """The tasks ``key`` depends on directly."""
        return self._dependencies[key]

    def find_cycle(self) -> tuple[str, ...] | None:
        """A cycle as ``(a, b, ..., a)`` where each key depends on the next, or None.

        Deterministic: the cycle reached first when walking, from the smallest key left
        unordered by a topological sort, along the smallest unordered dependency.
        """
        if self._order is not None:
            return None
        ordered, levels = self._sort()
        if len(ordered) == len(self._dependencies):
            self._order, self._levels = tuple(ordered), levels
            return None
        done = set(ordered)
        # Every task left over still waits on another left-over task, so walking along
        # left-over dependencies must revisit a task: that closes a cycle.
        current = min(key for key in self._dependencies if key not in done)
        walk: list[str] = []
        position: dict[str, int] = {}
        while current not in position:
            position[current] = len(walk)
            walk.append(current)
            current = min(key for key in self._dependencies[current] if key not in done)
        cycle = walk[position[current] :]
        start = cycle.index(min(cycle))
        rotated = cycle[start:] + cycle[:start]
        return (*rotated, rotated[0])

    def topological_order(self) -> tuple[str, ...]:
        """Every key after all of its dependencies: the levels in turn, each by ascending key."""
        cycle = self.find_cycle()
        if cycle is not None:
            raise CyclicDependencyError(cycle)
        assert self._order is not None
        return self._order

    def levels(self) -> tuple[tuple[str, ...], ...]:
        """Keys grouped by depth: level 0 has no dependencies, level n depends on level n-1."""
        self.topological_order()
        assert self._levels is not None
        return self._levels

    def _sort(self) -> tuple[list[str], tuple[tuple[str, ...], ...]]:
        """Kahn's algorithm, one level at a time; each level sorted by key."""
        waiting = {key: len(depends_on) for key, depends_on in self._dependencies.items()}
        current = sorted(key for key, count in waiting.items() if count == 0)
        ordered: list[str] = []
        levels: list[tuple[str, ...]] = []
        dependents = self._dependents
        while current:
            levels.append(tuple(current))
            ordered.extend(current)
            unblocked: list[str] = []
            for key in current:
                for dependent in dependents[key]:
                    remaining = waiting[dependent] - 1
                    waiting[dependent] = remaining
                    if remaining == 0:
                        unblocked.append(dependent)
            current = sorted(unblocked)
        return ordered, tuple(levels)

    def ready_tasks(self, completed: Collection[str]) -> tuple[str, ...]:
        """Keys not in ``completed`` whose dependencies are all in it, ascending."""
        done = completed if isinstance(completed, set | frozenset) else set(completed)
        return tuple(
            sorted(
                key
                for key, depends_on in self._dependencies.items()
                if key not in done and depends_on.issubset(done)
            )
        )

    def downstream_of(self, keys: Collection[str]) -> frozenset[str]:
        """Everything that waits, directly or not, on any of ``keys`` (not ``keys``)."""
        seen: set[str] = set()
        stack = [dependent for key in keys for dependent in self._dependents[key]]
        while stack:
            key = stack.pop()
            if key not in seen:
                seen.add(key)
                stack.extend(self._dependents[key])
        return frozenset(seen)

    def compensation_order(
        self, succeeded: Collection[str], compensators: Mapping[str, str]
    ) -> tuple[str, ...]:
        """The compensators of the succeeded tasks, a dependent's before its dependency's.

        The order is the reverse of the topological order, so it is deterministic too.
        """
        done = succeeded if isinstance(succeeded, set | frozenset) else set(succeeded)
        return tuple(
            compensators[key]
            for key in reversed(self.topological_order())
            if key in done and key in compensators
        )
