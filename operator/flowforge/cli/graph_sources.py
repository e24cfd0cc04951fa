"""Where ``flowforge graph`` reads from: a definition file, else a stored run.

Its own module so that drawing a file never imports the run commands (and the store and
the Kubernetes client with them), and so that the authoring commands need not import them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flowforge.cli.authoring import GraphSource, load_definition_file


def load_graph_source(args: argparse.Namespace) -> GraphSource:
    """``graph``'s loader: a file, else a run (whose module, and the store's, is imported only
    then)."""
    text, path = args.source, Path(args.source)
    if text == "-" or "/" in text or path.suffix in (".yaml", ".yml", ".json") or path.exists():
        return load_definition_file(args)
    from flowforge.cli.runs import load_run_graph

    return load_run_graph(args)
