"""The standard library's internals the gateway uses: the one place they are touched.

``logging._srcfile``: every log record walks up the stack for the file and line of its caller
unless it is None, which the logging HOWTO ("Optimization") gives as the way to turn that off.
``tests/test_compat.py`` checks that it still gates the walk.

``AsyncExitStack._exit_callbacks``: whether a stack holds anything to unwind (it has no public
way to say so). ``tests/test_compat.py`` checks that a pushed callback shows there.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack


def lean_log_records() -> None:
    """Log records without what no line of ours prints: the caller's file and line (found by
    walking up the stack for every record), and the thread's and process's ids and names.
    The optimisations the logging HOWTO names; an access line cost 10 % of a modern-era
    call's instructions before (``bench/instructions_per_call.py``). For the serving process:
    it holds for every logger in the process."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # pyright: ignore[reportPrivateUsage]  # the HOWTO's own advice


def holds_callbacks(stack: AsyncExitStack) -> bool:
    """Whether closing ``stack`` would run anything."""
    return bool(stack._exit_callbacks)  # pyright: ignore[reportAttributeAccessIssue]  # no public way
