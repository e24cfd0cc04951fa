"""DependencyGraph: order, levels, readiness, reach, compensation order and cycles."""

from __future__ import annotations

import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain.errors import CyclicDependencyError, UnknownDependencyError
from flowforge.domain.graph import DependencyGraph

DIAMOND = {"extract": [], "clean": ["extract"], "enrich": ["extract"], "load": ["clean", "enrich"]}


def test_topological_order_breaks_ties_by_ascending_key() -> None:
    graph = DependencyGraph({"c": [], "a": [], "b": ["c"], "d": ["a"]})
    assert graph.topological_order() == ("a", "c", "b", "d")
    assert graph.levels() == (("a", "c"), ("b", "d"))


def test_levels_of_a_diamond() -> None:
    graph = DependencyGraph(DIAMOND)
    assert graph.levels() == (("extract",), ("clean", "enrich"), ("load",))
    assert graph.topological_order() == ("extract", "clean", "enrich", "load")


def test_a_level_is_the_longest_path_from_a_root() -> None:
    graph = DependencyGraph({"a": [], "b": ["a"], "c": ["b"], "d": ["a", "c"]})
    assert graph.levels() == (("a",), ("b",), ("c",), ("d",))


def test_ready_tasks() -> None:
    graph = DependencyGraph(DIAMOND)
    assert graph.ready_tasks([]) == ("extract",)
    assert graph.ready_tasks({"extract"}) == ("clean", "enrich")
    assert graph.ready_tasks({"extract", "clean"}) == ("enrich",)
    assert graph.ready_tasks(["extract", "clean", "enrich"]) == ("load",)
    assert graph.ready_tasks(set(DIAMOND)) == ()


def test_direct_and_transitive_neighbours() -> None:
    graph = DependencyGraph(DIAMOND)
    assert graph.dependencies_of("load") == {"clean", "enrich"}
    assert graph.downstream_of({"extract"}) == {"clean", "enrich", "load"}
    assert graph.downstream_of({"clean", "enrich"}) == {"load"}
    assert graph.downstream_of({"load"}) == frozenset()
    assert graph.downstream_of(()) == frozenset()
    with pytest.raises(KeyError):
        graph.dependencies_of("ghost")


def test_compensation_order_undoes_a_dependent_before_its_dependency() -> None:
    graph = DependencyGraph(DIAMOND)
    compensators = {"extract": "undo-extract", "clean": "undo-clean", "enrich": "undo-enrich"}
    order = graph.compensation_order({"extract", "clean", "enrich"}, compensators)
    assert order == ("undo-enrich", "undo-clean", "undo-extract")


def test_compensation_order_skips_tasks_that_did_not_succeed_or_have_no_compensator() -> None:
    graph = DependencyGraph(DIAMOND)
    order = graph.compensation_order(["extract", "clean"], {"extract": "u1", "load": "u2"})
    assert order == ("u1",)
    assert graph.compensation_order([], {"extract": "u1"}) == ()


def test_an_unknown_dependency_is_refused_at_construction() -> None:
    with pytest.raises(UnknownDependencyError, match="ghost"):
        DependencyGraph({"a": ["ghost"]})


def test_a_two_task_cycle_is_named_in_order() -> None:
    graph = DependencyGraph({"a": ["b"], "b": ["a"]})
    assert graph.find_cycle() == ("a", "b", "a")
    with pytest.raises(CyclicDependencyError) as raised:
        graph.topological_order()
    assert raised.value.message == "dependency cycle detected: a -> b -> a"
    assert raised.value.path == "spec.tasks"
    assert raised.value.kind == "cycle"


def test_a_self_dependency_is_a_cycle() -> None:
    assert DependencyGraph({"a": ["a"]}).find_cycle() == ("a", "a")


def test_the_cycle_is_named_not_the_tasks_downstream_of_it() -> None:
    graph = DependencyGraph({"a": [], "b": ["a", "d"], "c": ["b"], "d": ["c"], "e": ["d"]})
    assert graph.find_cycle() == ("b", "d", "c", "b")


def test_a_cycle_at_the_end_of_a_deep_chain_is_found() -> None:
    # A recursive walk dies near 1,000 frames; the back-edge sits at the far end of 3,000.
    length = 3000
    assert length > sys.getrecursionlimit()
    keys = [f"t{index:04d}" for index in range(length)]
    dependencies = {
        key: [keys[index - 1]] if index else [keys[-1]] for index, key in enumerate(keys)
    }
    graph = DependencyGraph(dependencies)
    cycle = graph.find_cycle()
    assert cycle is not None
    assert cycle[0] == cycle[-1] == "t0000"
    assert cycle[1] == "t2999" and len(cycle) == length + 1


def test_a_deep_acyclic_chain_orders_without_recursion() -> None:
    keys = [f"t{index:05d}" for index in range(20_000)]
    graph = DependencyGraph({key: keys[index - 1 : index] for index, key in enumerate(keys)})
    assert graph.topological_order() == tuple(keys)
    assert len(graph.levels()) == 20_000


@st.composite
def dags(draw: st.DrawFn) -> dict[str, list[str]]:
    size = draw(st.integers(1, 25))
    keys = draw(
        st.lists(
            st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True),
            min_size=size,
            max_size=size,
            unique=True,
        )
    )
    dependencies: dict[str, list[str]] = {}
    for index, key in enumerate(keys):
        earlier = keys[:index]
        dependencies[key] = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
    return dependencies


@settings(max_examples=200, deadline=None)
@given(dags(), st.randoms())
def test_topological_order_respects_every_edge_and_ignores_declaration_order(
    dependencies: dict[str, list[str]], rng: random.Random
) -> None:
    graph = DependencyGraph(dependencies)
    order = graph.topological_order()
    position = {key: index for index, key in enumerate(order)}
    assert sorted(order) == sorted(dependencies)
    for key, depends_on in dependencies.items():
        for dependency in depends_on:
            assert position[dependency] < position[key]
    shuffled_keys = list(dependencies)
    rng.shuffle(shuffled_keys)
    shuffled = {key: rng.sample(dependencies[key], len(dependencies[key])) for key in shuffled_keys}
    assert DependencyGraph(shuffled).topological_order() == order
    assert DependencyGraph(shuffled).levels() == graph.levels()


@settings(max_examples=200, deadline=None)
@given(dags(), st.data())
def test_ready_tasks_never_returns_a_task_with_an_unfinished_dependency(
    dependencies: dict[str, list[str]], data: st.DataObject
) -> None:
    graph = DependencyGraph(dependencies)
    completed = set(data.draw(st.lists(st.sampled_from(sorted(dependencies)), unique=True)))
    ready = graph.ready_tasks(completed)
    for key in ready:
        assert key not in completed
        assert set(dependencies[key]) <= completed
    for key in set(dependencies) - completed - set(ready):
        assert not set(dependencies[key]) <= completed


@settings(max_examples=100, deadline=None)
@given(dags())
def test_compensation_order_is_a_reverse_topological_order(
    dependencies: dict[str, list[str]],
) -> None:
    graph = DependencyGraph(dependencies)
    compensators = {key: f"undo-{key}" for key in dependencies}
    order = [
        name.removeprefix("undo-")
        for name in graph.compensation_order(set(dependencies), compensators)
    ]
    position = {key: index for index, key in enumerate(order)}
    for key, depends_on in dependencies.items():
        for dependency in depends_on:
            assert position[key] < position[dependency]
