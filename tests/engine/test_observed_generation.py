"""``status.observedGeneration`` follows the object's ``metadata.generation`` (kstatus reads
a status made for an older generation as still in progress): a cancel is observed, and so
is an edit of a finished run's spec."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.engine.conftest import Harness
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store


async def test_the_status_observes_each_generation_of_the_run(harness: Harness) -> None:
    body = await harness.unstarted("gen", [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}])
    body["metadata"]["generation"] = 1
    await harness.engine.start_run(copy.deepcopy(body))

    def shown() -> dict[str, Any]:
        status: dict[str, Any] = harness.kube.runs[("team-a", "gen")].get("status", {})
        return status

    await wait_until(lambda: shown().get("observedGeneration") == 1, what="generation 1")
    conditions = {c["type"]: c for c in shown()["conditions"]}
    assert conditions["Reconciling"]["reason"] == "TasksRunning"

    seen = harness.kube.runs[("team-a", "gen")]
    seen["spec"]["cancel"] = True
    seen["metadata"]["generation"] = 2  # the apiserver counts a spec change
    await harness.engine.start_run(copy.deepcopy(seen))
    await wait_until(
        lambda: (shown().get("observedGeneration"), shown().get("phase")) == (2, "Cancelled"),
        what="the cancel observed",
    )
    conditions = {c["type"]: c for c in shown()["conditions"]}
    assert conditions["Stalled"]["reason"] == "Cancelled"
    assert conditions["Completed"]["status"] == "True"
    assert "Reconciling" not in conditions

    seen["spec"]["parameters"] = {"late": "edit"}
    seen["metadata"]["generation"] = 3  # an edit of a finished run's spec
    await harness.engine.start_run(copy.deepcopy(seen))
    await wait_until(lambda: shown().get("observedGeneration") == 3, what="generation 3")
    patches = len(harness.kube.status_patches)
    await harness.engine.start_run(copy.deepcopy(harness.kube.runs[("team-a", "gen")]))
    await harness.settle_background()
    assert len(harness.kube.status_patches) == patches  # observed: nothing more to write
