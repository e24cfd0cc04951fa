"""Command handlers named as ``module:function`` and imported when their command runs, so
that building the parser (and ``flowforge --help``) imports only argparse."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flowforge.cli.output import exit_code_for, report_failure


class LazyFunction:
    """A function named ``module:function``, imported when first called."""

    def __init__(self, target: str) -> None:
        self.module, _, self.function = target.partition(":")

    def __call__(self, *args: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.function)(*args)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one command.

    A command is short and what it allocates (modules, a parsed 10,000-task file, its models)
    lives until it ends and forms no garbage cycles worth collecting; the collections that
    allocation triggers walk the growing heap again and again for nothing (a sixth of
    ``flowforge plan`` on a large file, measured by bench/bench_definition.py).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class LazyHandler(LazyFunction):
    """A command's handler: the errors FlowForge raises on purpose become one line on stderr
    and their exit code."""

    def __call__(self, *args: Any) -> int:
        (namespace,) = args
        try:
            with _collector_paused():
                return int(super().__call__(namespace))
        except Exception as error:
            if exit_code_for(error) is None:
                raise
            return report_failure(
                namespace.command_name, error, verbose=getattr(namespace, "verbose", False)
            )
