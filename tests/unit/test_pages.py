"""LIST pages read within a byte budget (``kube/pages.py``): a page over it is dropped and
asked for again with a smaller limit, so however large one tenant makes its objects, no more
than a budget is read (and parsed) at once, and every object is still listed once, in order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from flowforge.kube.pages import (
    SINGLE_OBJECT_BUDGETS,
    ListPage,
    PageTooLarge,
    pages,
    read_page,
)

BUDGET = 100_000


class Response:
    """A urllib3 response streamed in chunks, as ``read_page`` reads it."""

    def __init__(self, body: bytes, *, length: bool = False) -> None:
        self.body = body
        self.headers = {"Content-Length": str(len(body))} if length else {}
        self.read = 0
        self.closed = False

    def stream(self, amt: int) -> Iterator[bytes]:
        for start in range(0, len(self.body), amt):
            self.read = start + amt
            yield self.body[start : start + amt]

    def close(self) -> None:
        self.closed = True


def listing(items: list[dict[str, Any]], token: str = "") -> bytes:
    return json.dumps({"metadata": {"continue": token}, "items": items}).encode()


def test_a_page_within_its_budget_is_read_and_parsed() -> None:
    body = listing([{"metadata": {"name": "a"}}], token="next")
    page = read_page(Response(body), max_bytes=len(body))
    assert page == ListPage(
        items=[{"metadata": {"name": "a"}}], continue_token="next", size=len(body)
    )


@pytest.mark.parametrize("length", [False, True], ids=["streamed", "content-length"])
def test_a_page_over_its_budget_is_not_read_past_it(length: bool) -> None:
    response = Response(listing([{"pad": "x" * 1_000_000}]), length=length)
    with pytest.raises(PageTooLarge) as raised:
        read_page(response, max_bytes=BUDGET)
    assert response.closed  # its connection is not reused with the rest unread
    assert response.read <= BUDGET + (1 << 16)  # one chunk past the budget at most
    assert raised.value.length == (len(response.body) if length else None)
    if length:
        assert response.read == 0


class Apiserver:
    """Pages a list of objects as the apiserver does, and reads them as the client does."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.asked: list[int] = []
        self.largest_read = 0

    async def fetch(self, *, limit: int, continue_token: str | None, max_bytes: int) -> ListPage:
        start = int(continue_token or 0)
        self.asked.append(limit)
        chosen = self.items[start : start + limit]
        size = len(json.dumps(chosen))
        if size > max_bytes:
            raise PageTooLarge(max_bytes=max_bytes, length=None)
        self.largest_read = max(self.largest_read, size)
        end = start + len(chosen)
        token = str(end) if end < len(self.items) else None
        return ListPage(items=chosen, continue_token=token, size=size)


def objects(sizes: list[int]) -> list[dict[str, Any]]:
    return [{"name": f"o{index:04d}", "pad": "x" * size} for index, size in enumerate(sizes)]


async def listed(apiserver: Apiserver, *, limit: int) -> list[str]:
    found: list[str] = []
    async for page in pages(apiserver.fetch, limit=limit, max_bytes=BUDGET):
        found += [item["name"] for item in page]
    return found


async def test_fat_objects_are_read_a_few_at_a_time_and_the_limit_comes_back() -> None:
    small, fat = 50, 30_000
    apiserver = Apiserver(objects([small] * 300 + [fat] * 40 + [small] * 2_000))
    assert await listed(apiserver, limit=500) == [item["name"] for item in apiserver.items]
    assert apiserver.largest_read <= BUDGET
    assert min(apiserver.asked) < 4  # three fat ones fit a budget
    assert apiserver.asked[-1] == 500  # after them, pages grew back to the caller's limit


async def test_one_object_may_take_a_few_budgets_and_no_more() -> None:
    apiserver = Apiserver(objects([100, 2 * BUDGET, 100]))
    assert await listed(apiserver, limit=500) == ["o0000", "o0001", "o0002"]
    too_large = Apiserver(objects([100, SINGLE_OBJECT_BUDGETS * BUDGET]))
    with pytest.raises(PageTooLarge):
        await listed(too_large, limit=500)
