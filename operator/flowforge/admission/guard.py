"""An AdmissionReview body read safely, before kopf sees it.

kopf copies reviewed objects recursively, so a document nested a few hundred levels deep would
end in a RecursionError and an HTTP 500 (and every admission failing with `failurePolicy:
Fail`). Everything here is linear in the body: ``json.loads`` (C, with its own recursion
guard), an iterative depth walk that stops at the limit, and for a body too deep for
``json.loads`` itself a token scan that stops at the limit too. A too-deep document is denied
naming the field where the limit was crossed.

The review's namespace is the one decisions use: an object naming another namespace is
denied, and one naming none is given the review's (the apiserver always sets it; a forged
review might not), so nothing downstream can read a different one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from flowforge.domain.errors import UserError

# Nothing legitimate comes close: a task config may nest 32 levels (domain/caps.py) and
# starts 7 levels below the review's root.
MAX_REVIEW_DEPTH = 100
# The token scan behind a json.loads RecursionError stops after this many tokens.
MAX_SCANNED_TOKENS = 200_000
_SHOWN_PATH_PARTS = 8

_REQUEST_UID = re.compile(r'"uid"\s{0,64}:\s{0,64}"([^"\\]{0,128})"')
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*+"(?:\s*+(:))?|[\[\]{},]', re.DOTALL)

Path = list[str | int]


class BadReviewError(UserError):
    """The body is not an AdmissionReview we can answer (HTTP 400)."""


@dataclass(frozen=True)
class ReadReview:
    """Either the review to hand to kopf, or the complete response that denies it."""

    review: dict[str, Any] | None = None
    denial: dict[str, Any] | None = None


def read_review(body: bytes) -> ReadReview:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadReviewError(f"the body is not UTF-8: {error}") from None
    try:
        review = json.loads(text)
    except RecursionError:
        return ReadReview(denial=_deny(_uid_in(text), _too_deep(_scan_for_depth(text))))
    except ValueError as error:
        raise BadReviewError(f"the body is not JSON: {error}") from None
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        raise BadReviewError("the body is not an AdmissionReview with a request")
    request: dict[str, Any] = review["request"]
    uid = str(request.get("uid") or "")
    deep = _walk_for_depth(review)
    if deep is not None:
        return ReadReview(denial=_deny(uid, _too_deep(deep)))
    mismatch = _bind_namespace(request)
    if mismatch is not None:
        return ReadReview(denial=_deny(uid, mismatch, code=400))
    return ReadReview(review=review)


def _bind_namespace(request: dict[str, Any]) -> str | None:
    namespace = request.get("namespace")
    namespace = namespace if isinstance(namespace, str) else ""
    for key in ("object", "oldObject"):
        obj = request.get(key)
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(metadata, dict):
            continue
        claimed = metadata.get("namespace")
        if claimed not in (None, "", namespace):
            return (
                f"metadata.namespace: {claimed!r} is not the namespace of the request "
                f"({namespace!r})"
            )
        if namespace:
            metadata["namespace"] = namespace
    return None


def _deny(uid: str, message: str, *, code: int = 422) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {"code": code, "message": message},
        },
    }


def _uid_in(text: str) -> str:
    # The request's uid is the first "uid" of an AdmissionReview as the apiserver writes it.
    found = _REQUEST_UID.search(text)
    return found.group(1) if found else ""


def _too_deep(path: Path | None) -> str:
    where = _render(path) if path else "the document"
    return (
        f"{where}: nests more than {MAX_REVIEW_DEPTH} levels deep (counted from the "
        f"AdmissionReview); FlowForge accepts at most {MAX_REVIEW_DEPTH}"
    )


def _render(path: Path) -> str:
    in_object = path[:2] == ["request", "object"]
    parts = path[2:] if in_object else path
    shown = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts[:_SHOWN_PATH_PARTS]
    )
    suffix = "..." if len(parts) > _SHOWN_PATH_PARTS else ""
    return (shown.lstrip(".") if in_object else f"review{shown}") + suffix


def _walk_for_depth(document: Any) -> Path | None:
    """The path of the first container deeper than the limit, or None; iterative.

    The common case (nothing too deep) keeps no paths; only a document over the limit is
    walked again to name where.
    """
    # two stacks, not one of (value, depth) tuples: a tuple per container of a large review
    # is an allocation burst that sets off full collections of the cyclic garbage collector
    # over everything json.loads just made (small ints are never allocated)
    values: list[Any] = [document]
    depths: list[int] = [1]
    pop_value, pop_depth, push_value, push_depth = (
        values.pop,
        depths.pop,
        values.append,
        depths.append,
    )
    while values:
        value, depth = pop_value(), pop_depth()
        if depth > MAX_REVIEW_DEPTH:
            return _path_too_deep(document)
        depth += 1
        for child in value.values() if type(value) is dict else value:
            kind = type(child)
            if kind is dict or kind is list:  # exact types: json.loads makes no subclasses
                push_value(child)
                push_depth(depth)
    return None


def _path_too_deep(document: Any) -> Path:
    parents: list[tuple[int, str | int]] = []  # per container: (its parent's entry, its key)
    stack: list[tuple[Any, int, int]] = [(document, 1, -1)]
    while stack:
        value, depth, entry = stack.pop()
        if depth > MAX_REVIEW_DEPTH:
            return _path_of(parents, entry)
        children = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in children:
            if isinstance(child, dict | list):
                parents.append((entry, key))
                stack.append((child, depth + 1, len(parents) - 1))
    return []


def _path_of(parents: list[tuple[int, str | int]], entry: int) -> Path:
    path: Path = []
    while entry >= 0:
        entry, key = parents[entry]
        path.append(key)
    return path[::-1]


def _scan_for_depth(text: str) -> Path | None:
    """For a body json.loads could not even nest into: where the limit is crossed.

    Reads tokens only until then (json.loads parsed the text up to a deeper point, so no
    string there is unterminated), and at most MAX_SCANNED_TOKENS of them.
    """
    frames: list[list[Any]] = []  # per open container: [is_object, current key or index]
    for count, token in enumerate(_TOKEN.finditer(text)):
        if count > MAX_SCANNED_TOKENS:
            return None
        char = token.group()[0]
        if char in "[{":
            frames.append([char == "{", 0 if char == "[" else None])
            if len(frames) > MAX_REVIEW_DEPTH:
                return [frame[1] for frame in frames[:-1]]
        elif char in "]}":
            if frames:
                frames.pop()
        elif char == ",":
            if frames and not frames[-1][0]:
                frames[-1][1] += 1
        elif token.group(1) and frames:
            frames[-1][1] = json.loads(token.group()[: token.start(1) - token.start()].rstrip())
    return None
