"""The AdmissionReview body guard on its own: linear-time refusals of hostile bodies, the
too-deep field named, and the review's namespace the only one downstream can read."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from flowforge.admission.guard import MAX_REVIEW_DEPTH, BadReviewError, read_review


def review(obj: Any, *, namespace: str = "team-a") -> bytes:
    request = {"uid": "u-1", "namespace": namespace, "operation": "CREATE", "object": obj}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "request": request}).encode()


def deep(levels: int) -> bytes:
    return b'{"n":[' * (levels // 2) + b"1" + b"]}" * (levels // 2)


@pytest.mark.parametrize("levels", [MAX_REVIEW_DEPTH, 2_000, 200_000])
def test_too_deep_configs_are_denied_naming_the_field(levels: int) -> None:
    body = review({"spec": {"tasks": [{"key": "a", "config": "DEEP"}]}})
    read = read_review(body.replace(b'"DEEP"', deep(levels)))
    assert read.denial is not None and read.review is None
    response = read.denial["response"]
    assert response["uid"] == "u-1"
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("spec.tasks[0].config.n[0]")
    assert "levels deep" in response["status"]["message"]


def test_a_document_within_the_limit_is_handed_on() -> None:
    read = read_review(review({"spec": {"config": json.loads(deep(MAX_REVIEW_DEPTH - 10))}}))
    assert read.denial is None and read.review is not None


@pytest.mark.parametrize(
    "body",
    [
        b'{"a":"' + b'\\"' * (32 * 1024),
        b'{"a":"' + b'\\"' * (4 * 1024 * 1024),
        os.urandom(1 << 20),
        b"[" * (8 << 20),
        b"",
        b"[]",
    ],
    ids=["64KiB-escapes", "8MiB-escapes", "random", "8MiB-brackets", "empty", "not-a-review"],
)
def test_hostile_bodies_are_refused(body: bytes) -> None:
    try:
        read = read_review(body)
    except BadReviewError as error:
        assert str(error)
    else:
        assert read.denial is not None
        assert read.denial["response"]["allowed"] is False


def test_an_object_naming_another_namespace_is_denied() -> None:
    read = read_review(review({"metadata": {"namespace": "victim"}}, namespace="team-a"))
    assert read.denial is not None
    assert (
        "'victim' is not the namespace of the request"
        in read.denial["response"]["status"]["message"]
    )


def test_an_object_naming_no_namespace_gets_the_reviews() -> None:
    read = read_review(review({"metadata": {"name": "x"}}, namespace="team-a"))
    assert read.review is not None
    assert read.review["request"]["object"]["metadata"]["namespace"] == "team-a"
