"""Lists across namespaces: ``GET /runs`` without a namespace, and ``GET /namespaces``.

The caller's access is judged lazily: a namespace is judged (a SubjectAccessReview, cached
per user, namespace and verb) only when a row of it would be shown next, in the order the
page fills (with the next few namespaces of the rows read, ``JUDGED_AT_ONCE`` at a time),
and none once the page is full. Once ``MAX_DENIED_PER_PAGE`` namespaces were judged that
the caller may not read, the page ends there, short, with a ``continue`` cursor where the
judging stopped (a page may hold fewer items than ``limit``, even none, and still go on).
So one page asks at most ``limit + JUDGED_AT_ONCE + MAX_DENIED_PER_PAGE`` reviews.

Which namespaces hold rows, and in which order, is read before judging them, in a
transaction scoped to every namespace of the cluster that returns names and ids only; the
rows shown are read in a transaction scoped to the namespaces the caller was allowed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from typing import Final

from flowforge.kube.access_review import Permission
from flowforge.server.access import Authorizer, Caller
from flowforge.server.state import ServerState
from flowforge.store import browse
from flowforge.store.browse import RunFilter, RunRow

MAX_DENIED_PER_PAGE: Final = 100
JUDGED_AT_ONCE: Final = 16
# namespaces probed for rows in one scoped transaction (the scope is one setting per row)
NAMESPACES_PER_PROBE: Final = 500


class Judge:
    """The namespaces judged for one page: those allowed, and those denied (at most
    ``denials``)."""

    def __init__(
        self,
        authorizer: Authorizer,
        caller: Caller,
        *,
        permission: Permission,
        denials: int,
    ) -> None:
        self._authorizer = authorizer
        self._caller = caller
        self._permission = permission
        self._denials = denials
        self.allowed: set[str] = set()
        self.denied: set[str] = set()

    async def allows(self, namespace: str, *, upcoming: Iterable[str]) -> bool | None:
        """Whether the caller holds the permission in ``namespace``; None once the page
        may judge no more. A namespace not judged yet is judged together with the next
        few of ``upcoming`` (the namespaces of the rows after it), concurrently, never more
        at once than denials are left."""
        if namespace not in self.allowed and namespace not in self.denied:
            left = self._denials - len(self.denied)
            if left <= 0:
                return None
            batch = [namespace]
            for name in upcoming:
                if len(batch) >= min(JUDGED_AT_ONCE, left):
                    break
                if name not in self.allowed and name not in self.denied and name not in batch:
                    batch.append(name)
            answers = await asyncio.gather(
                *(
                    self._authorizer.allowed(self._caller, namespace=n, permission=self._permission)
                    for n in batch
                )
            )
            for name, ok in zip(batch, answers, strict=True):
                (self.allowed if ok else self.denied).add(name)
        return namespace in self.allowed


async def runs(
    state: ServerState, caller: Caller, *, listed: RunFilter, permission: Permission
) -> tuple[list[RunRow], int | None]:
    """One page of runs of every namespace where the caller holds ``permission``
    (``listed.namespaces`` is ignored), and the id the next page continues before."""
    uids = await state.namespace_uids()  # every namespace: one paged LIST
    judge = Judge(state.authorizer, caller, permission=permission, denials=MAX_DENIED_PER_PAGE)
    shown: list[tuple[str, int]] = []
    last_seen: int | None = None
    cut = False
    async with state.reader(sorted(uids), namespace_uids=uids) as connection:
        while not cut and len(shown) <= listed.limit:
            wanted = listed.limit + 1 - len(shown)
            candidates = [name for name in uids if name not in judge.denied]
            places = await browse.run_places(
                connection,
                dataclasses.replace(
                    listed,
                    namespaces=candidates,
                    before=listed.before if last_seen is None else last_seen,
                    limit=wanted,
                ),
            )
            for index, (namespace, run_id) in enumerate(places):
                upcoming = (name for name, _ in places[index + 1 :])
                allowed = await judge.allows(namespace, upcoming=upcoming)
                if allowed is None:
                    cut = True
                    break
                last_seen = run_id
                if allowed:
                    shown.append((namespace, run_id))
                    if len(shown) > listed.limit:
                        break
            if len(places) < wanted:
                break
    more = len(shown) > listed.limit
    shown = shown[: listed.limit]
    after = shown[-1][1] if more else (last_seen if cut else None)
    if not shown:
        return [], after
    shown_in = sorted({namespace for namespace, _ in shown})
    async with state.reader(shown_in, namespace_uids=uids) as connection:
        rows = await browse.runs_by_id(
            connection, ids=[run_id for _, run_id in shown], namespaces=shown_in
        )
    return rows, after


async def namespaces(
    state: ServerState, caller: Caller, *, after: str | None, limit: int, permission: Permission
) -> tuple[list[str], str | None]:
    """One page of the namespaces holding a run or a definition where the caller holds
    ``permission``, by name after ``after``, and the name the next page continues after."""
    uids = await state.namespace_uids()  # every namespace: one paged LIST
    candidates = sorted(name for name in uids if after is None or name > after)
    judge = Judge(state.authorizer, caller, permission=permission, denials=MAX_DENIED_PER_PAGE)
    shown: list[str] = []
    last_seen: str | None = None
    for start in range(0, len(candidates), NAMESPACES_PER_PROBE):
        chunk = candidates[start : start + NAMESPACES_PER_PROBE]
        async with state.reader(chunk, namespace_uids=uids) as connection:
            with_data = await browse.namespaces_with_data(connection, chunk)
        for index, name in enumerate(with_data):
            allowed = await judge.allows(name, upcoming=with_data[index + 1 :])
            if allowed is None:
                return shown, last_seen
            last_seen = name
            if allowed:
                shown.append(name)
                if len(shown) > limit:
                    return shown[:limit], shown[limit - 1]
    return shown, None
