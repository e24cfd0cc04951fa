"""Job creations served round-robin per namespace: the lines (``domain/turns.py``) and the
paced, fair gate the launcher takes before each creation (``operator/creation_turns.py``)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain.turns import Turns
from flowforge.operator.creation_turns import CreationTurns
from tests.engine.fake_clock import FakeClock

# an operation: add an item of namespace 0-3, or take one (None)
OPERATIONS = st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=3)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_each_item_is_served_once_in_its_namespaces_order_and_namespaces_take_turns(
    operations: list[int | None],
) -> None:
    turns: Turns[int, int] = Turns()
    added: list[tuple[int, int]] = []
    served: list[tuple[int, int]] = []
    # for each namespace: the namespaces that had an item waiting when it was last served
    owed: dict[int, set[int]] = {}
    waiting: dict[int, int] = {}

    def take() -> None:
        taken = turns.take()
        if taken is None:
            assert not any(waiting.values())
            return
        owner, _ = taken
        # every namespace waiting when ``owner`` was last served has been served since
        assert not owed.get(owner), f"{owner} served again before {owed[owner]}"
        served.append(taken)
        waiting[owner] -= 1
        for others in owed.values():
            others.discard(owner)
        owed[owner] = {other for other, count in waiting.items() if count and other != owner}

    for number, operation in enumerate(operations):
        if operation is None:
            take()
        else:
            turns.add(operation, number)
            added.append((operation, number))
            waiting[operation] = waiting.get(operation, 0) + 1
        assert len(turns) == sum(waiting.values())
    while turns:
        take()
    assert turns.take() is None
    assert sorted(served) == sorted(added)  # each exactly once
    for owner in {owner for owner, _ in added}:  # first come first served within a namespace
        mine = [item for who, item in served if who == owner]
        assert mine == sorted(mine)


def test_a_fan_out_delays_another_namespace_by_one_turn() -> None:
    turns: Turns[str, int] = Turns()
    for number in range(10_000):
        turns.add("team-a", number)
    turns.add("team-b", 0)
    assert [turns.take() for _ in range(2)] == [("team-a", 0), ("team-b", 0)]
    assert len(turns) == 9_999


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_gate_paces_creations_and_serves_a_newcomer_namespace_next() -> None:
    clock = FakeClock()
    gate = CreationTurns(rate=2.0, burst=2, clock=clock)
    order: list[str] = []

    async def create(namespace: str, number: int) -> None:
        await gate.take(namespace)
        order.append(f"{namespace}-{number}")

    fan_out = [asyncio.create_task(create("team-a", n)) for n in range(6)]
    await settle()
    assert order == ["team-a-0", "team-a-1"]  # the burst, then one every half second
    late = asyncio.create_task(create("team-b", 0))
    await settle()
    assert clock.pending() == [0.5]  # one timer, however many wait
    clock.advance(0.5)
    await settle()
    clock.advance(0.5)
    await settle()
    assert order[2:] == ["team-a-2", "team-b-0"]
    clock.advance(0.4)
    await settle()
    assert len(order) == 4  # no token yet
    clock.advance(0.6)  # 1 s since the last: two tokens
    await settle()
    assert order[4:] == ["team-a-3", "team-a-4"]
    clock.advance(0.5)
    await settle()
    assert order[6:] == ["team-a-5"]
    await asyncio.gather(*fan_out, late)
    assert clock.pending() == []


async def test_a_cancelled_waiter_gives_its_turn_to_the_next() -> None:
    clock = FakeClock()
    gate = CreationTurns(rate=1.0, burst=1, clock=clock)
    await gate.take("team-a")  # the burst
    gone = asyncio.create_task(gate.take("team-a"))
    kept = asyncio.create_task(gate.take("team-b"))
    await settle()
    gone.cancel()
    await settle()
    clock.advance(1.0)
    await settle()
    assert kept.done() and clock.pending() == []


async def test_a_rate_of_zero_never_waits() -> None:
    gate = CreationTurns(rate=0.0, burst=1, clock=FakeClock())
    await asyncio.wait_for(asyncio.gather(*(gate.take("team-a") for _ in range(1000))), 1)
