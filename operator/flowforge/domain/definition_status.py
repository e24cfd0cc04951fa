"""The conditions of a WorkflowDefinition's status, in kstatus' convention
(``sigs.k8s.io/cli-utils/pkg/kstatus``, read by Flux, kpt and Helm's ``--wait``): a published
definition is ``Ready`` (Current); one the operator could not publish is ``Ready=False`` and
``Stalled=True`` with why (Failed). A condition keeps its ``lastTransitionTime`` while its
status stays the same, so re-publishing an unchanged object changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from flowforge.domain.run import Condition, ConditionStatus

PUBLISHED_REASON = "Published"
NOT_PUBLISHED_REASON = "NotPublished"


def definition_conditions(
    *,
    published: bool,
    message: str,
    generation: int | None,
    now: datetime,
    shown: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """``Ready`` (and ``Stalled`` when not published), as the status' wire form; ``shown``:
    the object's conditions now, whose transition times stand while their status does."""
    reason = PUBLISHED_REASON if published else NOT_PUBLISHED_REASON
    wanted = [("Ready", published)] + ([] if published else [("Stalled", True)])
    conditions = []
    for kind, holds in wanted:
        value = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
        before = next((c for c in shown if c.get("type") == kind), None)
        kept = before is not None and before.get("status") == value.value
        since = (before or {}).get("lastTransitionTime") if kept else None
        condition = Condition(
            type=kind,
            status=value,
            reason=reason,
            message=message[:4096],
            last_transition_time=since or now,
            observed_generation=generation,
        )
        conditions.append(condition.model_dump(mode="json", by_alias=True, exclude_none=True))
    return conditions
