"""Kubernetes LISTs in pages (``limit`` / ``continue``), each read within a byte budget.

The apiserver bounds a page by its number of objects only, and one tenant decides how big
its objects are: 100 Jobs of 1 MiB in one page were 100 MiB to read, and three times that
to parse. So a page is read only up to ``PAGE_BYTES`` (``read_page``: the connection is
dropped there); ``pages`` then asks for the same page again with a smaller ``limit`` (from
the page's ``Content-Length`` when the apiserver sent one, else an eighth), down to one
object, which may take four budgets (an object is at most 1.5 MiB in etcd; a Job's JSON a
few times that). After a page that used under a quarter of the budget, the limit doubles
back towards the caller's. The caller keeps what it needs of each page and drops it before
asking for the next: at most one page is held, whatever the objects weigh.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

# a page's budget: 500 of FlowForge's Jobs (about 5 KiB each) fit; parsed, dense JSON takes
# several times its bytes
PAGE_BYTES = 4 << 20
READ_CHUNK_BYTES = 1 << 16
# what one object may take to be read alone, in budgets
SINGLE_OBJECT_BUDGETS = 4
SHRINK_WITHOUT_LENGTH = 8


class PageTooLarge(Exception):
    """The page was longer than its budget (``length``: its ``Content-Length``, if sent)."""

    def __init__(self, *, max_bytes: int, length: int | None) -> None:
        super().__init__(f"a LIST page over {max_bytes} bytes ({length or 'unknown'})")
        self.length = length


@dataclasses.dataclass(frozen=True)
class ListPage:
    items: list[dict[str, Any]]
    continue_token: str | None  # None: this was the last page
    size: int = 0  # the bytes read

    @classmethod
    def of(cls, listing: dict[str, Any], *, size: int = 0) -> ListPage:
        """The page a LIST answered (its ``metadata.continue``, empty on the last page)."""
        token = (listing.get("metadata") or {}).get("continue") or None
        return cls(items=listing.get("items") or [], continue_token=token, size=size)


class StreamedResponse(Protocol):
    """What ``read_page`` uses of a urllib3 response read with ``_preload_content=False``."""

    @property
    def headers(self) -> Any: ...

    def stream(self, amt: int) -> Any: ...

    def close(self) -> None: ...


def read_page(response: StreamedResponse, *, max_bytes: int) -> ListPage:
    """The page in ``response``, read up to ``max_bytes`` (else :class:`PageTooLarge`, and
    the response is closed: its connection is not reused with the rest unread)."""
    declared = response.headers.get("Content-Length")
    length = int(declared) if declared and declared.isdigit() else None
    body = bytearray()
    if length is None or length <= max_bytes:
        for chunk in response.stream(READ_CHUNK_BYTES):
            body += chunk
            if len(body) > max_bytes:
                break
        else:
            return ListPage.of(json.loads(body), size=len(body))
    response.close()
    raise PageTooLarge(max_bytes=max_bytes, length=length)


FetchPage = Callable[..., Awaitable[ListPage]]  # (limit=, continue_token=, max_bytes=)


async def pages(
    fetch: FetchPage, *, limit: int, max_bytes: int = PAGE_BYTES
) -> AsyncIterator[list[dict[str, Any]]]:
    """The items of every page of a LIST, following its continue tokens, each page read
    within ``max_bytes`` (``SINGLE_OBJECT_BUDGETS`` of them for a page of one object)."""
    size, token = limit, None
    while True:
        budget = max_bytes if size > 1 else max_bytes * SINGLE_OBJECT_BUDGETS
        try:
            page = await fetch(limit=size, continue_token=token, max_bytes=budget)
        except PageTooLarge as error:
            if size == 1:
                raise
            size = _smaller(size, length=error.length, max_bytes=budget)
            continue
        yield page.items
        if page.continue_token is None:
            return
        token = page.continue_token
        if page.size < max_bytes // 4:
            size = min(limit, size * 2)


def _smaller(size: int, *, length: int | None, max_bytes: int) -> int:
    if length is None:
        return max(1, size // SHRINK_WITHOUT_LENGTH)
    return max(1, min(size // 2, size * max_bytes // length))
