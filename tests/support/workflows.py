"""Workflow shapes several test modules run: task lists as a definition's ``tasks`` holds
them, without a type (the harness that publishes them adds its own)."""

from __future__ import annotations

from typing import Any

# reserve -> charge -> ship, each forward step undone by its compensator on a rollback
SAGA: list[dict[str, Any]] = [
    {"key": "reserve"},
    {"key": "charge", "dependsOn": ["reserve"]},
    {"key": "ship", "dependsOn": ["charge"]},
    {"key": "release", "compensateFor": "reserve"},
    {"key": "refund", "compensateFor": "charge"},
]
