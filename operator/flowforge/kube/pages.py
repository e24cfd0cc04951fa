"""One page of a Kubernetes LIST (``limit`` / ``continue``)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ListPage:
    items: list[dict[str, Any]]
    continue_token: str | None  # None: this was the last page

    @classmethod
    def of(cls, listing: dict[str, Any]) -> ListPage:
        """The page a LIST answered (its ``metadata.continue``, empty on the last page)."""
        token = (listing.get("metadata") or {}).get("continue") or None
        return cls(items=listing.get("items") or [], continue_token=token)
