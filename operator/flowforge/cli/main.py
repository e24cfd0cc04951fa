"""Entry point of the ``flowforge`` command (also ``kubectl flowforge``).

The commands and their arguments are in :mod:`flowforge.cli.commands`; exit codes, error lines
and output forms in :mod:`flowforge.cli.output`. Parsing imports neither: what a command needs
is imported when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flowforge.cli.commands import register_all
from flowforge.cli.output import EXIT_INTERRUPTED, EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowforge",
        description="FlowForge: Kubernetes-native DAG workflows with ordered rollback.",
        epilog="Exit codes: 0 ok; 1 invalid input or a refusal; 2 usage; 3 the database or "
        "the Kubernetes API failed (retry later). Output: -o json|yaml|wide|name where a "
        "command prints objects, as kubectl.",
    )
    parser.add_argument("--verbose", action="store_true", help="show details of errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_all(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "command_name", None) != "server":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.options = extra
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
