"""The web UI in a real browser against the real stack (see conftest): a user watches the
diamond example run live, sees the saga's rollback, cancels a run, sees nothing of a
namespace they have no rights in, opens a 10,000-task run drawn by level (the time from
navigation to the drawn graph is printed, with the server's share), skips a halted
compensator, approves a gate, pauses a run, reads a run's finally tasks, and sees a forEach
task as one node counting its items (a click lists them) and a condition-skipped task drawn
apart from one an upstream failure skipped.

Screenshots of the run page go to the test's temporary folder; with
FLOWFORGE_UPDATE_SCREENSHOTS=1 (`make screenshots`) also to docs/images/ for the README.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from playwright.async_api import Page

from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import kubectl
from tests.ui.conftest import BIG_LEVELS, BIG_RUN, BIG_WIDTH, IMAGES, UiStack

pytestmark = pytest.mark.cluster

EXAMPLES = repo_root() / "examples"
RUN_TIMEOUT_MS = 90_000

# Every [data-task] node's states as the page shows them, in order: installed before the
# run page loads, it keeps recording across client-side re-renders (never a reload, which
# would also drop window.__seen).
RECORD_STATES = """() => {
  window.__seen = {};
  const scan = () => {
    for (const node of document.querySelectorAll('g[data-task]')) {
      const task = node.dataset.task, state = node.dataset.state;
      const seen = (window.__seen[task] ||= []);
      if (seen[seen.length - 1] !== state) seen.push(state);
    }
  };
  new MutationObserver(scan).observe(document.body, {
    subtree: true, childList: true, attributes: true, attributeFilter: ['data-state'],
  });
  scan();
}"""


async def _screenshot(page: Page, name: str, tmp_path: Path) -> None:
    await page.screenshot(path=str(tmp_path / name))
    if os.environ.get("FLOWFORGE_UPDATE_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(IMAGES / name))


async def _apply(
    stack: UiStack, namespace: str, *, path: Path | None = None, text: str = ""
) -> None:
    args = ["apply", "-n", namespace, "-f", str(path) if path else "-"]
    await asyncio.to_thread(kubectl, stack.cluster, *args, stdin=text or None)


async def _open_run(page: Page, stack: UiStack, namespace: str, name: str) -> None:
    """Open the run page in the app without a reload, then record what its nodes show."""
    await page.goto(f"{stack.url}/runs?namespace={namespace}")
    await page.evaluate(RECORD_STATES)
    await page.evaluate(
        "(to) => { history.pushState(null, '', to); dispatchEvent(new PopStateEvent('popstate')) }",
        f"/runs/{namespace}/{name}",
    )


async def _applied_until(page: Page, stack: UiStack, text: str, *, run: str, phase: str) -> None:
    """Apply ``text``, open the page of its ``run`` and wait for the run's ``phase``."""
    await _apply(stack, stack.home, text=text)
    await _open_run(page, stack, stack.home, run)
    await _wait_phase(page, stack, phase)


async def _wait_phase(page: Page, stack: UiStack, phase: str) -> None:
    try:
        await page.locator(f'[data-testid="run"][data-phase="{phase}"]').wait_for(
            timeout=RUN_TIMEOUT_MS
        )
    except Exception as error:
        raise AssertionError(f"the run page never showed {phase}\n{stack.logs()}") from error


async def test_diamond_nodes_go_from_waiting_to_succeeded_live(
    page: Page, ui_stack: UiStack, tmp_path: Path
) -> None:
    await _apply(ui_stack, ui_stack.home, path=EXAMPLES / "etl-diamond.yaml")
    await _open_run(page, ui_stack, ui_stack.home, "etl-2026-11-30")
    await page.locator('g[data-task="load"]').wait_for()
    await _wait_phase(page, ui_stack, "Succeeded")
    await page.wait_for_function(
        "() => document.querySelectorAll('g[data-task][data-state=succeeded]').length === 4"
    )

    seen: dict[str, list[str]] = await page.evaluate("window.__seen")
    assert set(seen) == {"extract", "transform-users", "transform-orders", "load"}, seen
    for task in ("transform-users", "transform-orders", "load"):
        assert seen[task][0] == "waiting" and seen[task][-1] == "succeeded", seen
        assert "running" in seen[task], seen
    assert seen["extract"][0] in {"waiting", "ready", "running"}, seen
    assert seen["extract"][-1] == "succeeded", seen
    assert await page.get_by_test_id("stream").get_attribute("data-stream") in {"live", "ended"}
    await _screenshot(page, "ui-diamond.png", tmp_path)


async def test_saga_shows_the_compensators_in_the_order_they_ran_and_the_trigger(
    page: Page, ui_stack: UiStack, tmp_path: Path
) -> None:
    await _apply(ui_stack, ui_stack.home, path=EXAMPLES / "saga-order.yaml")
    await _open_run(page, ui_stack, ui_stack.home, "order-1001")
    await _wait_phase(page, ui_stack, "Failed")

    rollback = page.get_by_test_id("rollback")
    await rollback.and_(page.locator('[data-state="Completed"]')).wait_for()
    steps = await rollback.locator("li[data-step]").evaluate_all(
        "(items) => items.map((li) => "
        "[li.dataset.step, li.dataset.compensator, li.dataset.task, li.dataset.state])"
    )
    assert steps == [
        ["1", "refund", "charge", "succeeded"],
        ["2", "release", "reserve", "succeeded"],
    ]
    assert (await page.get_by_test_id("triggered-by").inner_text()) == "ship"
    ship = page.locator('g[data-task="ship"]')
    assert await ship.get_attribute("data-state") == "failed"
    assert "trigger" in (await ship.get_attribute("class") or "")

    await ship.click()
    panel = page.get_by_test_id("task-panel")
    attempt = panel.locator("tr[data-attempt='1']")
    await attempt.wait_for()
    cells = await attempt.locator("td").all_inner_texts()
    assert cells[1] == "failed" and cells[2] == "3", cells
    await _screenshot(page, "ui-saga.png", tmp_path)

    # its definition: the version, the task types and the graph with the rollback order
    await page.get_by_role("link", name="order", exact=True).click()
    definition = page.get_by_test_id("definition")
    await definition.locator('g[data-task="ship"]').wait_for()
    assert await definition.locator("tr[data-version='1']").count() == 1
    types = await definition.get_by_test_id("task-types").inner_text()
    assert "failing-step" in types and "busybox:1.36" in types, types
    assert "Rollback order: refund → release" in await definition.inner_text()


SLOW_RUN = """
apiVersion: flowforge.io/v1alpha1
kind: WorkflowDefinition
metadata: {name: ui-slow-v1}
spec:
  workflow: ui-slow
  version: 1
  taskTypes:
    long:
      image: busybox:1.36
      annotations: {flowforge.io/simulate-duration: 120s}
  tasks:
    - {key: wait, type: long}
    - {key: after, type: long, dependsOn: [wait]}
---
apiVersion: flowforge.io/v1alpha1
kind: WorkflowRun
metadata: {name: slow-1}
spec: {workflow: ui-slow}
"""


async def test_cancel_a_running_run_from_the_ui(page: Page, ui_stack: UiStack) -> None:
    await _apply(ui_stack, ui_stack.home, text=SLOW_RUN)
    await _open_run(page, ui_stack, ui_stack.home, "slow-1")
    await page.locator('g[data-task="wait"][data-state="running"]').wait_for(timeout=RUN_TIMEOUT_MS)
    await page.get_by_role("button", name="Cancel run").click()
    await page.get_by_role("button", name="Yes, cancel slow-1").click()
    await _wait_phase(page, ui_stack, "Cancelled")
    await page.locator('g[data-task="wait"][data-state="cancelled"]').wait_for()
    assert await page.locator('g[data-task="after"]').get_attribute("data-state") in {
        "cancelled",
        "skipped",
    }
    assert await page.get_by_role("button", name="Retry").is_visible()


async def test_a_user_without_rights_in_a_namespace_sees_none_of_its_runs(
    page: Page, ui_stack: UiStack
) -> None:
    await _apply(ui_stack, ui_stack.other, path=EXAMPLES / "etl-diamond.yaml")
    await _apply(ui_stack, ui_stack.home, path=EXAMPLES / "etl-diamond.yaml")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the other namespace's run is in the store
        shown = await asyncio.to_thread(
            kubectl, ui_stack.cluster, "get", "wfr", "-n", ui_stack.other,
            "etl-2026-11-30", "-o", "jsonpath={.status.phase}",
        )  # fmt: skip
        if shown.stdout in {"Running", "Succeeded"}:
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError(f"the run in {ui_stack.other} never started\n{ui_stack.logs()}")

    await page.goto(f"{ui_stack.url}/runs")
    rows = page.locator("table[data-testid=runs] tbody tr[data-run]")
    await rows.first.wait_for()
    await asyncio.sleep(2.5)  # one more poll of the list
    listed = await rows.evaluate_all("(rows) => rows.map((r) => r.dataset.run)")
    assert listed and all(run.split("/")[0] in {ui_stack.home, ui_stack.big} for run in listed)
    assert f"{ui_stack.home}/etl-2026-11-30" in listed
    options = await page.locator("select[name=namespace] option").all_inner_texts()
    assert ui_stack.other not in options and ui_stack.home in options, options

    await page.goto(f"{ui_stack.url}/runs?namespace={ui_stack.other}")
    await page.get_by_role("alert").wait_for()
    assert await rows.count() == 0
    await page.goto(f"{ui_stack.url}/runs/{ui_stack.other}/etl-2026-11-30")
    alert = page.get_by_role("alert")
    await alert.wait_for()
    assert await page.locator("g[data-task]").count() == 0
    assert "etl" not in (await page.locator("main").inner_text()).split("\n", 1)[1]


async def test_a_10000_task_run_page_draws_its_levels_and_opens_a_task(
    page: Page, ui_stack: UiStack, tmp_path: Path
) -> None:
    await page.goto(f"{ui_stack.url}/runs/{ui_stack.big}/{BIG_RUN}")
    drawn = page.locator('[data-testid=dag][data-mode=levels] g[data-level="0"]')
    await drawn.wait_for()
    elapsed_ms: float = await page.evaluate("performance.now()")
    graph_answered_ms: float = await page.evaluate(
        "performance.getEntriesByType('resource')"
        ".find((e) => e.name.endsWith('/graph')).responseEnd"
    )
    print(
        f"\n10,000-task run page: graph drawn {elapsed_ms:.0f} ms after navigation, "
        f"{elapsed_ms - graph_answered_ms:.0f} ms after the server's /graph answer "
        f"(which took until {graph_answered_ms:.0f} ms)"
    )
    assert await page.locator("g[data-level]").count() == BIG_LEVELS
    label = await drawn.get_attribute("aria-label") or ""
    assert label.startswith(f"Level 0, {BIG_WIDTH} tasks: ") and "cancelled" in label, label
    # The time is a figure, not an assert (timings here are noisy): the target is
    # 3 s from navigation; the line above tells the server's share from the page's.

    await drawn.click()
    level = page.get_by_test_id("level-panel")
    await level.get_by_role("button", name="t0-0", exact=True).click()
    # cancelled before it was ever dispatched: no attempt, the state says why
    await page.get_by_test_id("task-panel").locator('dd [data-state="cancelled"]').wait_for()
    await _screenshot(page, "ui-10000.png", tmp_path)


SCHEDULED = """
apiVersion: flowforge.io/v1alpha1
kind: WorkflowDefinition
metadata: {name: ui-tick-v1}
spec:
  workflow: ui-tick
  version: 1
  taskTypes:
    step:
      image: busybox:1.36
      annotations: {flowforge.io/simulate-duration: 1s}
  tasks:
    - {key: only, type: step}
---
apiVersion: flowforge.io/v1alpha1
kind: WorkflowSchedule
metadata: {name: ui-nightly}
spec:
  workflow: ui-tick
  schedule: "0 3 * * *"
  timeZone: Europe/Berlin
  backfills:
    - {id: past, from: "2026-01-01T00:00:00Z", to: "2026-01-02T23:59:59Z"}
---
apiVersion: flowforge.io/v1alpha1
kind: WorkflowSchedule
metadata: {name: ui-off}
spec: {workflow: ui-tick, schedule: "0 3 * * *", suspend: true}
"""


async def test_schedules_page_shows_next_fires_and_the_runs_a_schedule_made(
    page: Page, ui_stack: UiStack
) -> None:
    await _apply(ui_stack, ui_stack.home, text=SCHEDULED)
    await page.goto(f"{ui_stack.url}/schedules?namespace={ui_stack.home}")
    nightly = page.locator('tr[data-schedule="ui-nightly"]')
    # its backfill fired: the last fire is the newer night's run
    await nightly.get_by_role("link", name="ui-nightly-202601020300").wait_for(
        timeout=RUN_TIMEOUT_MS
    )
    assert await nightly.get_attribute("data-suspended") == "false"
    # the next times are the object's status, written by the operator's pass after the fire
    next_fire = nightly.get_by_test_id("next-fire").filter(has_text=" in ")
    await next_fire.wait_for()
    assert (await next_fire.inner_text()).startswith("20")
    off = page.locator('tr[data-schedule="ui-off"]')
    assert await off.get_attribute("data-suspended") == "true"
    assert (await off.get_by_test_id("next-fire").inner_text()) == "—"

    await nightly.get_by_role("link", name="ui-nightly", exact=True).click()
    runs = page.get_by_test_id("schedule-runs").locator("tbody tr[data-run]")
    await page.locator('tr[data-run="ui-nightly-202601010300"]').wait_for()
    assert await runs.evaluate_all("(rows) => rows.map((r) => r.dataset.run)") == [
        "ui-nightly-202601020300",
        "ui-nightly-202601010300",
    ]
    assert "Europe/Berlin" in await page.get_by_test_id("schedule").inner_text()
    # (the schedule's facts may link it too, while it is active)
    await runs.get_by_role("link", name="ui-nightly-202601010300").click()
    await page.locator('[data-testid="run"] g[data-task="only"]').wait_for()
    assert page.url.endswith(f"/runs/{ui_stack.home}/ui-nightly-202601010300")


def _workflow_and_run(workflow: str, run: str, tasks: str, *, types: str = "") -> str:
    """A definition of ``workflow`` (version 1) with ``tasks`` (its YAML, indented as in
    spec: parameters may come first) and the task types ``ok`` and ``bad`` (exit code 3),
    each 1 s, and ``types`` (YAML, indented as ``ok``); and ``run`` of it."""
    return f"""
apiVersion: flowforge.io/v1alpha1
kind: WorkflowDefinition
metadata: {{name: {workflow}-v1}}
spec:
  workflow: {workflow}
  version: 1
  taskTypes:
    ok:
      image: busybox:1.36
      annotations: {{flowforge.io/simulate-duration: 1s}}
    bad:
      image: busybox:1.36
      annotations: {{flowforge.io/simulate-duration: 1s, flowforge.io/simulate-exit-code: "3"}}
{types}{tasks}
---
apiVersion: flowforge.io/v1alpha1
kind: WorkflowRun
metadata: {{name: {run}}}
spec: {{workflow: {workflow}}}
"""


HALTING_RUN = _workflow_and_run(
    "ui-halt",
    "halt-1",
    """
  tasks:
    - {key: prep, type: ok}
    - {key: boom, type: bad, dependsOn: [prep]}
    - {key: unprep, type: bad, compensateFor: prep}""",
)


async def _act(page: Page, button: str, reason: str = "") -> None:
    """Press an action's button, give the reason, send it."""
    await page.get_by_role("button", name=button, exact=True).click()
    send = page.get_by_role("button", name=f"Send: {button}")
    if reason:
        await page.get_by_label("Reason").fill(reason)
    await send.click()
    await page.get_by_role("status").filter(has_text=f"{button}: sent as").wait_for()


async def test_a_halted_rollback_skipped_from_the_ui(page: Page, ui_stack: UiStack) -> None:
    await _apply(ui_stack, ui_stack.home, text=HALTING_RUN)
    await _open_run(page, ui_stack, ui_stack.home, "halt-1")
    await (
        page.get_by_test_id("rollback")
        .and_(page.locator('[data-state="Halted"]'))
        .wait_for(timeout=RUN_TIMEOUT_MS)
    )
    await page.get_by_role("button", name="Skip compensator unprep").click()
    send = page.get_by_role("button", name="Send: Skip compensator unprep")
    assert await send.is_disabled()  # a skip needs a reason
    await page.get_by_role("button", name="Back", exact=True).click()
    await _act(page, "Skip compensator unprep", "undone by hand, OPS-7")
    skipped = page.locator('tr[data-kind="SkipCompensator"][data-result="Accepted"]')
    await skipped.wait_for()
    cells = await skipped.locator("td").all_inner_texts()
    assert cells[2] == "unprep" and cells[3] == f"system:serviceaccount:{ui_stack.home}:reader"
    assert cells[5] == "undone by hand, OPS-7", cells
    await page.locator('[data-testid="rollback"]:not([data-state="Halted"])').wait_for()
    assert await page.get_by_role("button", name="Skip compensator unprep").count() == 0


# a gate only the UI's user may pass (its name is filled in: the tenancy's namespace A)
GATED_RUN = _workflow_and_run(
    "ui-gate",
    "gate-1",
    """
  tasks:
    - {key: stage, type: ok}
    - key: approve-prod
      dependsOn: [stage]
      approval: {approvers: {users: ["system:serviceaccount:NAMESPACE:reader"]}}
    - {key: deploy, type: ok, dependsOn: [approve-prod]}""",
)


async def test_a_gate_awaiting_approval_is_drawn_as_one_and_approved_from_the_ui(
    page: Page, ui_stack: UiStack
) -> None:
    await _apply(ui_stack, ui_stack.home, text=GATED_RUN.replace("NAMESPACE", ui_stack.home))
    await _open_run(page, ui_stack, ui_stack.home, "gate-1")
    gate = page.locator('g[data-task="approve-prod"]')
    await gate.and_(page.locator('[data-state="awaiting"]')).wait_for(timeout=RUN_TIMEOUT_MS)
    assert "gate" in (await gate.get_attribute("class") or "").split()
    assert await gate.get_attribute("aria-label") == "approve-prod, approval gate, awaiting"
    assert "gate" not in (await page.locator('g[data-task="stage"]').get_attribute("class") or "")
    assert await page.locator('g[data-task="deploy"]').get_attribute("data-state") == "waiting"
    assert await page.locator('[data-testid="run"]').get_attribute("data-phase") == "Running"

    await _act(page, "Approve approve-prod", "staging looked fine")
    approved = page.locator('tr[data-kind="Approve"][data-result="Accepted"]')
    await approved.wait_for()
    cells = await approved.locator("td").all_inner_texts()
    assert cells[2:4] == ["approve-prod", f"system:serviceaccount:{ui_stack.home}:reader"], cells
    await _wait_phase(page, ui_stack, "Succeeded")
    await gate.and_(page.locator('[data-state="succeeded"]')).wait_for()
    await page.locator('g[data-task="deploy"][data-state="succeeded"]').wait_for()
    seen: dict[str, list[str]] = await page.evaluate("window.__seen")
    assert seen["approve-prod"][-2:] == ["awaiting", "succeeded"], seen
    assert await page.get_by_role("button", name="Approve approve-prod").count() == 0


FINAL_RUN = _workflow_and_run(
    "ui-final",
    "final-1",
    """
  tasks:
    - {key: build, type: ok}
    - {key: deploy, type: bad, dependsOn: [build]}
    - {key: unbuild, type: ok, compensateFor: build}
  finally:
    - {key: notify, type: bad}
    - {key: release-lock, type: ok}""",
)


async def test_the_finally_section_shows_each_step_and_the_outcome_it_was_told(
    page: Page, ui_stack: UiStack
) -> None:
    await _applied_until(page, ui_stack, FINAL_RUN, run="final-1", phase="Failed")
    section = page.locator('[data-testid="finally"][data-finalizing="false"]')
    await section.and_(page.locator('[data-outcome="Failed"]')).wait_for()
    assert await section.get_attribute("data-rollback") == "Completed"
    assert "Told the outcome Failed (the rollback completed)." in await section.inner_text()
    steps = await section.locator("tr[data-step]").evaluate_all(
        "(rows) => rows.map((r) => [r.dataset.step, r.dataset.state])"
    )
    assert steps == [["notify", "failed"], ["release-lock", "succeeded"]]
    # not tasks of the graph
    assert await page.locator('g[data-task="notify"]').count() == 0

    await section.get_by_role("button", name="notify", exact=True).click()
    attempt = section.locator("tr[data-attempt='1']")
    await attempt.wait_for()
    cells = await attempt.locator("td").all_inner_texts()
    assert cells[1] == "failed" and cells[2] == "3", cells


# another run of the cancel test's workflow (its definition applied again is unchanged)
HELD_RUN = SLOW_RUN.replace("{name: slow-1}", "{name: hold-1}")


async def test_pause_and_resume_a_run_from_the_ui(page: Page, ui_stack: UiStack) -> None:
    await _apply(ui_stack, ui_stack.home, text=HELD_RUN)
    await _open_run(page, ui_stack, ui_stack.home, "hold-1")
    await page.locator('g[data-task="wait"][data-state="running"]').wait_for(timeout=RUN_TIMEOUT_MS)
    await _act(page, "Pause")
    await page.locator('tr[data-kind="Pause"][data-result="Accepted"]').wait_for()
    await page.get_by_test_id("paused").wait_for()
    await _act(page, "Resume", "carry on")
    await page.locator('tr[data-kind="Resume"][data-result="Accepted"]').wait_for()
    await page.get_by_test_id("paused").wait_for(state="detached")
    await page.get_by_role("button", name="Pause", exact=True).wait_for()
    await page.get_by_role("button", name="Cancel run").click()
    await page.get_by_role("button", name="Yes, cancel hold-1").click()
    await _wait_phase(page, ui_stack, "Cancelled")


# deploy runs once per region, one at a time; its item us fails (exit code 4), so the items
# after it are cancelled, verify is skipped because of it, and migrate by its condition
FANNED_RUN = _workflow_and_run(
    "ui-fan",
    "fan-1",
    """
  parameters:
    - {name: mode, type: string, enum: [full, incremental], default: incremental}
    - {name: regions, type: array, items: {type: string}, default: [eu, us, ap, sa]}
  tasks:
    - {key: prep, type: ok}
    - {key: migrate, type: ok, dependsOn: [prep], when: "params.mode == 'full'"}
    - key: deploy
      type: deployer
      dependsOn: [migrate]
      forEach: {items: params.regions, maxParallel: 1}
    - {key: verify, type: ok, dependsOn: [deploy]}
    - {key: undo-deploy, type: ok, compensateFor: deploy}""",
    types="""    deployer:
      image: busybox:1.36
      annotations:
        flowforge.io/simulate-duration: 1s
        flowforge.io/simulate-exit-code: "4"
        flowforge.io/simulate-fail-items: us
""",
)


async def test_a_for_each_is_one_node_counting_its_items_and_a_false_condition_is_drawn_apart(
    page: Page, ui_stack: UiStack, tmp_path: Path
) -> None:
    await _applied_until(page, ui_stack, FANNED_RUN, run="fan-1", phase="Failed")
    deploy = page.locator('g[data-task="deploy"]')
    await deploy.and_(page.locator('[data-counts="succeeded=1 failed=1 cancelled=2"]')).wait_for()

    # one node for the four items, with the graph's edges to and from it
    nodes = await page.locator("g[data-task]").evaluate_all("(gs) => gs.map((g) => g.dataset.task)")
    assert sorted(nodes) == ["deploy", "migrate", "prep", "verify"], nodes
    edges = await page.locator("path.edge").evaluate_all("(ps) => ps.map((p) => p.dataset.edge)")
    assert sorted(edges) == ["deploy>verify", "migrate>deploy", "prep>migrate"], edges
    assert (
        await deploy.get_attribute("data-for-each"),
        await deploy.get_attribute("data-items"),
    ) == (
        "true",
        "4",
    )
    assert await deploy.get_attribute("data-state") == "failed"
    sub = await deploy.locator("text.sub").text_content()
    assert sub == "⚑ 1 succeeded · 1 failed · 2 cancelled", sub  # its item us began the rollback
    assert "trigger" in (await deploy.get_attribute("class") or "").split()
    seen: dict[str, list[str]] = await page.evaluate("window.__seen")
    assert "running" in seen["deploy"], seen  # while its items ran, one at a time

    # skipped by its condition, drawn apart from verify, which deploy's failure skipped
    migrate, verify = page.locator('g[data-task="migrate"]'), page.locator('g[data-task="verify"]')
    assert await migrate.get_attribute("data-state") == "skipped"
    assert await verify.get_attribute("data-state") == "skipped"
    assert await migrate.get_attribute("data-skip") == "condition"
    assert await verify.get_attribute("data-skip") == "upstream"
    assert "skip-condition" in (await migrate.get_attribute("class") or "").split()
    assert "skip-condition" not in (await verify.get_attribute("class") or "").split()
    assert "condition false" in (await migrate.locator("title").text_content() or "")
    assert await migrate.locator("text.sub").text_content() == "skipped · condition false"
    # the task list says it alike
    listed = page.get_by_test_id("tasks")
    migrate_row = listed.locator('tr[data-task="migrate"]')
    badge = migrate_row.locator("[data-skip]")
    assert await badge.get_attribute("data-skip") == "condition"
    assert await badge.inner_text() == "skipped · condition false"
    assert "ConditionFalse" in await migrate_row.inner_text()
    upstream = listed.locator('tr[data-task="verify"] [data-skip]')
    assert await upstream.get_attribute("data-skip") == "upstream"

    # a click lists the items: key, state, attempts, each opening its attempts
    await deploy.click()
    panel = page.get_by_test_id("items-panel")
    await panel.locator("tr[data-item]").nth(3).wait_for()
    rows = await panel.locator("tr[data-item]").evaluate_all(
        "(rs) => rs.map((r) => [r.dataset.item, r.dataset.state, r.cells[2].innerText])"
    )
    assert rows == [
        ["eu", "succeeded", "1"],
        ["us", "failed", "1"],
        ["ap", "cancelled", "0"],
        ["sa", "cancelled", "0"],
    ], rows
    assert await panel.get_by_test_id("item-counts").inner_text() == (
        "1 succeeded · 1 failed · 2 cancelled"
    )
    await _screenshot(page, "ui-foreach.png", tmp_path)
    await panel.get_by_role("button", name="us", exact=True).click()
    task = page.locator('[data-testid="task-panel"][data-task="deploy[us]"]')
    attempt = task.locator("tr[data-attempt='1']")
    await attempt.wait_for()
    cells = await attempt.locator("td").all_inner_texts()
    assert cells[1] == "failed" and cells[2] == "4", cells
    await task.get_by_role("button", name="← every item of deploy").click()
    await panel.wait_for()
