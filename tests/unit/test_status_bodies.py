"""The recorded status bodies (tests/data/status/) are the operator's own projection, and
kstatus itself (the library Flux, kpt and Helm's --wait use, built from the Go module
proxy) reads each as EXPECTED says."""

from __future__ import annotations

from tests.tools.go_tools import kstatus
from tests.tools.status_bodies import EXPECTED, bodies, encode, recorded


def test_the_recorded_bodies_are_what_the_projection_makes_now() -> None:
    made = bodies()
    assert set(made) == set(EXPECTED)
    stale = [stem for stem, obj in recorded().items() if encode(obj) != encode(made[stem])]
    missing = sorted(set(made) - set(recorded()))
    assert (stale, missing) == ([], []), "run: .venv/bin/python -m tests.tools.status_bodies"


def test_kstatus_reads_every_recorded_body_as_expected() -> None:
    objects = recorded()
    verdicts = kstatus(objects.values())
    seen = {stem: v["status"] for stem, v in zip(objects, verdicts, strict=True)}
    assert seen == {stem: verdict.kstatus for stem, verdict in EXPECTED.items()}
    messages = {stem: v["message"] for stem, v in zip(objects, verdicts, strict=True)}
    # a pipeline's log shows why: the run's own message
    assert messages["run-failed"] == "task ship failed: exit code 3"
    assert messages["run-queued"].startswith("queued: the namespace runs at most 1 run")
    assert messages["run-cancel-unobserved"] == (
        "WorkflowRun generation is 2, but latest observed generation is 1"
    )
    assert messages["definition-refused"].startswith("not published: version 1")
