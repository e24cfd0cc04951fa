"""Entry point of the ``flowforge`` command.

Each command group lives in its own module exposing ``register(subparsers)``; the
module adds its sub-commands and sets ``handler`` (a callable taking the parsed
arguments and returning the exit code) on each of them. Exit codes: 0 success,
1 a verdict of "invalid"/"failed", 2 usage errors and unreadable input.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "flowforge.cli.definitions",
    "flowforge.cli.db",
    "flowforge.cli.authoring",
    "flowforge.cli.runs",  # after authoring: it adds run sources to `graph`
    "flowforge.cli.doctor",
)

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowforge",
        description="FlowForge: Kubernetes-native DAG workflows with ordered rollback.",
    )
    parser.add_argument("--verbose", action="store_true", help="show details of errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
