"""The definitions the model test draws (``Dag``, ``dags``) and the run each one gives
(``Shape``, ``shape_of``): its rows, what each waits for, its ``forEach`` groups and its
compensators, worked out here from the rules (``docs/foreach.md``, the docstring of
``domain/expansion.py``), never by calling ``expand()``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from flowforge.domain.graph import DependencyGraph
from flowforge.domain.undo import CompensateOn

# the people who create runs and act on them; a gate lists some of them as approvers
PEOPLE = ("alice", "bob", "carol", "dave")
# a gate's timeout is never reached by the clock: a step moves its deadline back instead
GATE_TIMEOUT_SECONDS = 3600
# a forEach's items: short DNS-safe strings, so each is its own item key
REGIONS = ("eu", "us", "ap", "sa")


@dataclasses.dataclass(frozen=True)
class Dag:
    """A drawn definition: its tasks as the document lists them."""

    tasks: tuple[Mapping[str, Any], ...]
    # the run's maxParallelTasks (None: unlimited)
    limit: int | None = None
    # parameter declarations whose defaults are the run's values: a boolean pN decides a
    # ``when: params.pN`` (false: the task is skipped, ConditionFalse, at creation), an array
    # itemsN of strings is a ``forEach``'s list
    parameters: tuple[Mapping[str, Any], ...] = ()
    # who created the run (an approval gate's forbidSelf)
    creator: str | None = None
    # spec.finally, in list order
    finals: tuple[Mapping[str, Any], ...] = ()

    def __repr__(self) -> str:
        parts = []
        for task in self.tasks:
            text = f"{task['key']}(retries={task.get('retries', 0)}"
            if "approval" in task:
                text = f"{task['key']}(gate {dict(task['approval'])}"
            if task.get("dependsOn"):
                text += f", after {'+'.join(task['dependsOn'])}"
            if task.get("compensateFor"):
                text += f", undoes {task['compensateFor']}"
            if task.get("when"):
                text += f", when {task['when']}"
            if task.get("forEach"):
                text += f", forEach {dict(task['forEach'])}"
            if task.get("compensateOn"):
                text += f" on {task['compensateOn']}"
            parts.append(text + ")")
        limit = f", maxParallelTasks={self.limit}" if self.limit else ""
        values = ", ".join(f"{p['name']}={p['default']}" for p in self.parameters)
        creator = f"; created by {self.creator}" if self.creator else ""
        finals = ", ".join(f"{t['key']}(retries={t['retries']})" for t in self.finals)
        return (
            "Dag["
            + "; ".join(parts)
            + limit
            + (f"; {values}" if values else "")
            + creator
            + (f"; finally {finals}" if finals else "")
            + "]"
        )


@st.composite
def approvals(draw: st.DrawFn) -> dict[str, Any]:
    """A gate's ``approval``: listed users (or anyone), 1-2 of them required, maybe forbidding
    the creator, maybe a timeout."""
    approval: dict[str, Any] = {}
    most = len(PEOPLE)
    if draw(st.integers(0, 3), label="lists approvers") > 0:
        users = draw(st.lists(st.sampled_from(PEOPLE), min_size=1, max_size=3, unique=True))
        approval["approvers"] = {"users": users}
        most = len(users)
    approval["required"] = draw(st.integers(1, min(2, most)), label="required")
    if draw(st.booleans(), label="forbidSelf"):
        approval["forbidSelf"] = True
    if draw(st.booleans(), label="has a timeout"):
        approval["timeoutSeconds"] = GATE_TIMEOUT_SECONDS
    return approval


@st.composite
def for_each(draw: st.DrawFn, *, name: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A ``forEach``: 0-4 items, from the array parameter ``name`` (returned, its default the
    list) or a literal list, maybe ``maxParallel`` 1-3, ``tolerateFailures`` 0-2 or 50%."""
    size = draw(st.sampled_from((0, 1, 2, 2, 3, 3, 4, 4)), label="how many items")
    items = list(draw(st.permutations(REGIONS), label="items")[:size])
    declared = draw(st.booleans(), label="items from a parameter")
    spec: dict[str, Any] = {"items": f"params.{name}" if declared else items}
    parallel = draw(st.none() | st.integers(1, 3), label="maxParallel")
    if parallel is not None:
        spec["maxParallel"] = parallel
    spec["tolerateFailures"] = draw(st.sampled_from((0, 1, 2, "50%")), label="tolerateFailures")
    parameter = {"name": name, "type": "array", "items": {"type": "string"}, "default": items}
    return spec, parameter if declared else None


@st.composite
def dags(draw: st.DrawFn) -> Dag:
    """2-8 forward tasks, each depending on some earlier ones, some of them approval gates
    (no type, no retries, no compensator), some with a ``when``; keys and declaration order
    are shuffled so that neither follows the topological order (ties are broken by key); a
    half of the runs have 1-2 ``forEach`` tasks, and a third 1-2 ``finally`` tasks (retries
    0-1)."""
    size = draw(st.integers(min_value=2, max_value=8), label="forward tasks")
    names = draw(st.permutations([f"t{n}" for n in range(size)]), label="keys")
    retries = st.integers(min_value=0, max_value=2)
    tasks: list[dict[str, Any]] = []
    parameters: list[dict[str, Any]] = []
    guarded = st.integers(0, 3).map(lambda n: n == 3)
    gated = st.integers(0, 3).map(lambda n: n == 3)
    plain: list[dict[str, Any]] = []  # the tasks that are no gate
    compensated: set[str] = set()
    for index, key in enumerate(names):
        upstream = draw(st.sets(st.sampled_from(names[:index])) if index else st.just(set()))
        gate = draw(gated, label=f"{key} is a gate")
        task: dict[str, Any] = (
            {"key": key, "approval": draw(approvals())}
            if gate
            else {"key": key, "retries": draw(retries)}
        )
        if upstream:
            task["dependsOn"] = sorted(upstream)
        if draw(guarded, label=f"{key} has a when"):
            value = draw(st.booleans(), label=f"{key}'s condition")
            parameters.append({"name": f"p{index}", "type": "boolean", "default": value})
            task["when"] = f"params.p{index}"
        tasks.append(task)
        if not gate:
            plain.append(task)
        if not gate and draw(st.booleans()):
            compensator = {"key": f"undo-{key}", "compensateFor": key, "retries": draw(retries)}
            if draw(st.booleans(), label="compensateOn: Attempted"):
                compensator["compensateOn"] = CompensateOn.ATTEMPTED.value
            tasks.append(compensator)
            compensated.add(key)
    fanned = draw(st.sampled_from((0, 0, 0, 1, 1, 2)), label="forEach tasks")
    candidates = draw(st.permutations(plain), label="which fan out")
    if draw(st.integers(0, 2), label="compensated ones first") > 0:  # undone item by item
        candidates.sort(key=lambda task: task["key"] not in compensated)
    for task in candidates[:fanned]:
        task["forEach"], parameter = draw(for_each(name=f"items{task['key'][1:]}"))
        if parameter is not None:
            parameters.append(parameter)
    order = draw(st.permutations(range(len(tasks))), label="declaration order")
    limit = draw(st.none() | st.integers(min_value=1, max_value=3), label="maxParallelTasks")
    finals = draw(st.integers(0, 5).map(lambda n: max(0, n - 3)), label="finally tasks")
    return Dag(
        tasks=tuple(tasks[position] for position in order),
        limit=limit,
        parameters=tuple(parameters),
        creator=draw(st.sampled_from((None, *PEOPLE)), label="created by"),
        finals=tuple(
            {"key": f"f{n}", "retries": draw(st.integers(0, 1), label=f"f{n}'s retries")}
            for n in range(finals)
        ),
    )


# -- the run a drawn definition gives ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Group:
    """A ``forEach`` task that runs: its instances and their limits."""

    task: str
    members: tuple[str, ...]  # ``task[item]``, in item order
    max_parallel: int | None
    tolerance: int  # how many items may fail with the task still succeeding


@dataclasses.dataclass(frozen=True)
class Shape:
    """The run of a drawn definition, as the rules say ``create_run`` writes it."""

    graph: DependencyGraph  # the definition's forward tasks
    # the forward rows in the store's order: the definition's topological order (ties by key),
    # a forEach task's instances in item order
    rows: tuple[str, ...]
    # each forward row that runs -> the rows it waits for: a skipped task (its when false, or
    # its forEach without items) stands in as its own upstreams, a forEach task as its items
    dependencies: Mapping[str, frozenset[str]]
    condition_false: frozenset[str]
    no_items: frozenset[str]  # forEach tasks whose list is empty (skipped, NoItems)
    groups: Mapping[str, Group]
    group_of: Mapping[str, str]  # an instance -> its forEach task
    compensators: Mapping[str, str]  # a forward row -> its compensator's row
    # the definition's forward task -> its compensator (a rollback's order is decided on them)
    task_compensators: Mapping[str, str]
    compensate_on: Mapping[str, CompensateOn]  # a forward row -> its compensator's
    max_attempts: Mapping[str, int]  # every row: its task's retries + 1

    def task_of(self, row: str) -> str:
        return self.group_of.get(row, row)


def tolerance(tolerate: int | str, items: int) -> int:
    """``tolerateFailures``: a count, or a percent of the items rounded down."""
    return tolerate if isinstance(tolerate, int) else items * int(tolerate[:-1]) // 100


def shape_of(dag: Dag) -> Shape:
    forward = {str(t["key"]): t for t in dag.tasks if "compensateFor" not in t}
    graph = DependencyGraph({key: task.get("dependsOn", ()) for key, task in forward.items()})
    values = {p["name"]: p["default"] for p in dag.parameters}
    condition_false = frozenset(
        key for key, task in forward.items() if "when" in task and not values[task["when"][7:]]
    )
    items: dict[str, list[str]] = {}
    groups: dict[str, Group] = {}
    for key, task in forward.items():
        spec = task.get("forEach")
        if spec is None or key in condition_false:
            continue
        listed = spec["items"]
        items[key] = list(values[listed[7:]] if isinstance(listed, str) else listed)
        groups[key] = Group(
            task=key,
            members=tuple(f"{key}[{item}]" for item in items[key]),
            max_parallel=spec.get("maxParallel"),
            tolerance=tolerance(spec.get("tolerateFailures", 0), len(items[key])),
        )
    no_items = frozenset(key for key, group in groups.items() if not group.members)
    stands: dict[str, frozenset[str]] = {}  # a task -> the rows that stand for it downstream
    dependencies: dict[str, frozenset[str]] = {}
    rows: list[str] = []
    for key in graph.topological_order():
        waits = frozenset().union(*(stands[upstream] for upstream in graph.dependencies_of(key)))
        members = groups[key].members if key in groups else (key,)
        rows.extend(members or (key,))
        if key in condition_false or key in no_items:
            stands[key] = waits
            continue
        stands[key] = frozenset(members)
        dependencies.update(dict.fromkeys(members, waits))
    # every row's attempts: its task's retries + 1 (an instance's and its compensator's too)
    attempts = {str(t["key"]): int(t.get("retries", 0)) + 1 for t in (*dag.tasks, *dag.finals)}
    compensators: dict[str, str] = {}
    compensate_on: dict[str, CompensateOn] = {}
    for task in dag.tasks:
        if "compensateFor" not in task:
            continue
        undone, key = str(task["compensateFor"]), str(task["key"])
        on = CompensateOn(task.get("compensateOn", CompensateOn.SUCCEEDED.value))
        pairs = (
            [(f"{undone}[{item}]", f"{key}[{item}]") for item in items[undone]]
            if undone in groups
            else [(undone, key)]
        )
        for row, compensator in pairs:
            compensators[row], compensate_on[row] = compensator, on
            attempts[compensator] = attempts[key]
    for group in groups.values():
        attempts.update(dict.fromkeys(group.members, attempts[group.task]))
    return Shape(
        graph=graph,
        rows=tuple(rows),
        dependencies=dependencies,
        condition_false=condition_false,
        no_items=no_items,
        groups=groups,
        group_of={member: key for key, group in groups.items() for member in group.members},
        compensators=compensators,
        task_compensators={
            str(t["compensateFor"]): str(t["key"]) for t in dag.tasks if "compensateFor" in t
        },
        compensate_on=compensate_on,
        max_attempts=attempts,
    )
