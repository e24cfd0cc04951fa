"""What every ``flowforge`` command shares: exit codes, error lines and output forms.

Exit codes, as scripts rely on them:

* ``0`` the command did what was asked (a definition is valid, a check passed);
* ``1`` the input is wrong or the request was refused: an invalid definition or manifest, an
  unknown run, a doctor finding, the apiserver's 4xx (forbidden, not found, conflict);
* ``2`` the command line is wrong: argparse's own code, and what argparse cannot check (a file
  or module named on the command line that cannot be opened, a missing ``--dsn``, a choice
  ``--name`` must make);
* ``3`` a system FlowForge depends on failed: the database or the Kubernetes API is unreachable
  or answered 429/5xx. The same command may succeed later;
* ``130`` interrupted (Ctrl-C).

Output: the default is the human table; ``-o json`` and ``-o yaml`` print the same data for
programs, ``-o wide`` the table with more columns, ``-o name`` one ``kind/name`` per line, as
kubectl does. Errors are one line on stderr, ``flowforge COMMAND: message`` (``--verbose``
adds the traceback).

This module is imported by ``flowforge --help``: it imports nothing heavy at the top.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130

OUTPUT_FORMS: tuple[str, ...] = ("json", "yaml", "wide", "name")
_FORM_HELP = {
    "json": "JSON",
    "yaml": "YAML",
    "wide": "the table with more columns",
    "name": "one kind/name per line",
}


class CommandError(Exception):
    """One line for the user, and the exit code it calls for."""

    def __init__(self, message: str, *, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_code_for(error: BaseException) -> int | None:
    """The exit code of an error FlowForge raised on purpose; None for a bug."""
    if isinstance(error, CommandError):
        return error.exit_code
    # only errors of modules already imported can have been raised: importing nothing here
    # keeps ``--help`` light
    domain_errors = sys.modules.get("flowforge.domain.errors")
    if domain_errors is not None:
        if isinstance(error, domain_errors.InfrastructureError):
            return EXIT_UNAVAILABLE
        if isinstance(error, domain_errors.FlowForgeError):
            return EXIT_FAILED
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(error, psycopg.Error):
        return EXIT_UNAVAILABLE
    return None


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def report_failure(command: str, error: BaseException, *, verbose: bool) -> int:
    """Print ``error`` as one line (with its traceback when verbose); its exit code."""
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    print(f"flowforge {command}: {first_line(error)}", file=sys.stderr)
    return exit_code_for(error) or EXIT_FAILED


def add_output_option(
    parser: argparse.ArgumentParser, *, forms: Sequence[str] = OUTPUT_FORMS, detail: str = ""
) -> None:
    described = ", ".join(f"{form} ({_FORM_HELP.get(form, form)})" for form in forms)
    parser.add_argument(
        "-o",
        "--output",
        choices=forms,
        default=None,
        metavar="FORMAT",
        help=f"one of: {described}; default: the human table. {detail}".strip(),
    )


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def to_yaml(data: Any) -> str:
    from flowforge.sdk.manifest_yaml import yaml_document

    return yaml_document(data)


def emit(
    form: str | None,
    *,
    data: Callable[[], Any],
    table: Callable[[bool], str],
    names: Callable[[], Iterable[str]] | None = None,
) -> None:
    """Print in the chosen form: ``data()`` as JSON or YAML, ``table(wide)``, or ``names()``."""
    if form == "json":
        text = to_json(data())
    elif form == "yaml":
        text = to_yaml(data())
    elif form == "name" and names is not None:
        text = "".join(f"{name}\n" for name in names())
    else:
        text = table(form == "wide")
    sys.stdout.write(text)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns padded to their widest cell, kubectl's way: two spaces apart, no borders."""
    lines = [list(map(str, headers)), *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(headers))]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in lines
    )
