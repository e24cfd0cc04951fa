"""Similar Events of a run fold into one series Event after the first few, as the
Kubernetes event recorder aggregates them; warnings never fold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flowforge.domain.event_series import COMBINED_PREFIX, EventCorrelator


def test_the_first_similar_events_post_alone_and_the_rest_fold_into_one_series() -> None:
    correlator = EventCorrelator(similar_before_series=3, window_seconds=600)
    alone = [
        correlator.observe(
            run_uid="r", reason="TaskStarted", warning=False, message=f"task t{n}", now=float(n)
        )
        for n in range(7)
    ]
    assert alone == [True, True, True, False, False, False, False]

    update = correlator.pending(run_uid="r", reason="TaskStarted")
    assert update is not None
    assert (update.count, update.message, update.exists) == (4, COMBINED_PREFIX + "task t6", False)
    correlator.written(run_uid="r", update=update)
    assert correlator.pending(run_uid="r", reason="TaskStarted") is None  # nothing new

    correlator.observe(run_uid="r", reason="TaskStarted", warning=False, message="t7", now=8.0)
    later = correlator.pending(run_uid="r", reason="TaskStarted")
    assert later is not None and (later.count, later.exists) == (5, True)
    assert later.name_suffix == update.name_suffix == "taskstarted.0"


def test_reasons_runs_and_warnings_are_counted_apart() -> None:
    correlator = EventCorrelator(similar_before_series=1, window_seconds=600)
    assert correlator.observe(run_uid="r", reason="A", warning=False, message="", now=0)
    assert correlator.observe(run_uid="r", reason="B", warning=False, message="", now=0)
    assert correlator.observe(run_uid="s", reason="A", warning=False, message="", now=0)
    assert not correlator.observe(run_uid="r", reason="A", warning=False, message="", now=0)
    assert all(
        correlator.observe(run_uid="r", reason="Failed", warning=True, message="", now=0)
        for _ in range(5)
    )
    assert correlator.pending(run_uid="r", reason="Failed") is None


def test_a_new_window_starts_a_new_series() -> None:
    correlator = EventCorrelator(similar_before_series=1, window_seconds=10)
    correlator.observe(run_uid="r", reason="A", warning=False, message="", now=0)
    assert not correlator.observe(run_uid="r", reason="A", warning=False, message="", now=5)
    assert correlator.observe(run_uid="r", reason="A", warning=False, message="", now=11)
    assert not correlator.observe(run_uid="r", reason="A", warning=False, message="", now=12)
    update = correlator.pending(run_uid="r", reason="A")
    assert update is not None and (update.name_suffix, update.count) == ("a.1", 1)


@given(
    threshold=st.integers(min_value=0, max_value=20),
    events=st.integers(min_value=0, max_value=200),
)
def test_every_event_is_posted_or_counted_exactly_once(threshold: int, events: int) -> None:
    correlator = EventCorrelator(similar_before_series=threshold, window_seconds=600)
    posted = sum(
        correlator.observe(run_uid="r", reason="A", warning=False, message=str(n), now=0.0)
        for n in range(events)
    )
    update = correlator.pending(run_uid="r", reason="A")
    folded = 0 if update is None else update.count
    assert posted == min(threshold, events)
    assert posted + folded == events


def test_a_finished_run_keeps_no_window_once_its_series_are_written() -> None:
    correlator = EventCorrelator(similar_before_series=1, window_seconds=600)
    for reason in ("A", "B", "A"):
        correlator.observe(run_uid="r", reason=reason, warning=False, message="m", now=0)
    correlator.observe(run_uid="s", reason="A", warning=False, message="m", now=0)
    assert len(correlator) == 3

    correlator.forget_run("r")  # A has a folded Event not written yet: it stays for the flush
    assert len(correlator) == 2
    update = correlator.pending(run_uid="r", reason="A")
    assert update is not None and update.count == 1
    correlator.written(run_uid="r", update=update)
    assert len(correlator) == 1  # only the run that goes on
    assert correlator.pending(run_uid="r", reason="A") is None

    correlator.forget_run("s")
    assert len(correlator) == 0


def test_the_oldest_runs_are_forgotten_beyond_the_bound() -> None:
    correlator = EventCorrelator(similar_before_series=1, window_seconds=600, remembered_runs=3)
    for n in range(10):
        correlator.observe(run_uid=f"r{n}", reason="A", warning=False, message="", now=0)
        correlator.observe(run_uid="busy", reason="A", warning=False, message="", now=0)
    assert len(correlator) == 3
    # the run that kept posting is kept; it folded every Event after its first
    update = correlator.pending(run_uid="busy", reason="A")
    assert update is not None and update.count == 9
