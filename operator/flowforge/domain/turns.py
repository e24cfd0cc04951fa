"""Whose turn it is: one first-come-first-served line per owner (a namespace), the owners
served round-robin.

With one line for everyone, a tenant that queues 10,000 Job creations at once makes every
other tenant's next creation wait behind all of them. With a line per namespace, taken in
turn, it waits for at most one creation of each namespace that has one waiting: between two
items of an owner, every other owner that had one waiting when the first was taken gets one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

Owner = TypeVar("Owner", bound=Hashable)
Item = TypeVar("Item")


class Turns(Generic[Owner, Item]):
    """Items waiting, in one FIFO per owner; ``take`` serves the owners in turn."""

    def __init__(self) -> None:
        self._lines: dict[Owner, deque[Item]] = {}
        self._ring: deque[Owner] = deque()  # the owners with an item waiting, next first
        self._waiting = 0

    def add(self, owner: Owner, item: Item) -> None:
        """``item`` waits at the end of its owner's line; a new owner's turn comes after
        every owner already waiting."""
        line = self._lines.get(owner)
        if line is None:
            line = self._lines[owner] = deque()
            self._ring.append(owner)
        line.append(item)
        self._waiting += 1

    def take(self) -> tuple[Owner, Item] | None:
        """The first item of the owner whose turn it is (that owner's next turn comes after
        every other owner waiting); None when nothing waits."""
        if not self._ring:
            return None
        owner = self._ring.popleft()
        line = self._lines[owner]
        item = line.popleft()
        self._waiting -= 1
        if line:
            self._ring.append(owner)
        else:
            del self._lines[owner]
        return owner, item

    def __len__(self) -> int:
        return self._waiting
