"""The one exception policy of the operator: what went wrong, and what follows from it.

Every watch handler, every piece of background and deferred work, and each repair of a
reconciler pass runs through ``Failures.guard``, so the answer to "this raised: retry, step
down, or log?" is written once (kopf's ``execute_handler_once`` is the model; as in
controller-runtime, *what* went wrong is kept apart from *whether to go on*):

- ``NotLeaderError``: this replica does not lead; nothing is done, nothing is logged.
- ``StaleEpochError``: another operator took the lease while this one acted. The write was
  refused by the store, so nothing is lost; this operator steps down at once, and a
  reconciler pass stops (``Verdict.stops``).
- ``UserError``: the input is wrong (a run whose definition no longer validates, a Job the
  apiserver refused); it is reported where the user looks (a status, an Event) by the code
  that raised it; here it is counted, and retrying would not help.
- ``InfrastructureError`` or a PostgreSQL error: the database or the apiserver did not
  answer. Counted and logged; the reconciler's next pass is the retry (event handlers get
  no retry of their own: a replayed event could be older than what the pass sees).
- Anything else is a bug: logged with its traceback, counted, left to the reconciler.

``asyncio.CancelledError`` always propagates (shutdown).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable

import psycopg
import psycopg_pool

from flowforge.domain.errors import InfrastructureError, UserError
from flowforge.operator import metrics
from flowforge.store.errors import StaleEpochError

logger = logging.getLogger("flowforge.operator")


class NotLeaderError(InfrastructureError):
    """This operator does not hold the lease: it must not act."""


class Verdict(enum.Enum):
    DONE = "done"
    NOT_LEADER = "not-leader"
    DEPOSED = "deposed"
    REFUSED = "refused"
    INFRASTRUCTURE = "infrastructure"
    BUG = "bug"

    @property
    def stops(self) -> bool:
        """Whether a loop over more work (a reconciler pass) must stop: this operator does
        not lead (any more)."""
        return self in (Verdict.NOT_LEADER, Verdict.DEPOSED)


class Failures:
    def __init__(self, *, on_deposed: Callable[[], Awaitable[None]]) -> None:
        self._on_deposed = on_deposed

    async def guard(self, action: Awaitable[object], *, what: str) -> Verdict:
        """Await ``action`` under the policy above; the verdict says what happened."""
        try:
            await action
        except asyncio.CancelledError:
            raise
        except NotLeaderError:
            return Verdict.NOT_LEADER
        except StaleEpochError as error:
            metrics.FAILURES.labels(Verdict.DEPOSED.value).inc()
            logger.error("%s refused, this operator was deposed: %s", what, error)
            await self._on_deposed()
            return Verdict.DEPOSED
        except UserError as error:
            metrics.FAILURES.labels(Verdict.REFUSED.value).inc()
            logger.info("%s refused: %s", what, error)
            return Verdict.REFUSED
        except (InfrastructureError, psycopg.Error, psycopg_pool.PoolTimeout) as error:
            metrics.FAILURES.labels(Verdict.INFRASTRUCTURE.value).inc()
            metrics.RECONCILE_ERRORS.inc()
            logger.warning("%s failed, left to the reconciler: %s", what, error)
            return Verdict.INFRASTRUCTURE
        except Exception:
            metrics.FAILURES.labels(Verdict.BUG.value).inc()
            metrics.RECONCILE_ERRORS.inc()
            logger.exception("%s failed, left to the reconciler", what)
            return Verdict.BUG
        return Verdict.DONE
