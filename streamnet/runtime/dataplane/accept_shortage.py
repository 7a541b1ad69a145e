"""What a worker's event loop says when it cannot accept connections.

When the process is out of file descriptors (or socket buffers), asyncio reports
"socket.accept() out of system resource" with a traceback through the loop's
exception handler for every connection waiting in the listening socket's backlog
(100 reports at once in the test), stops accepting there and tries again a second
later - so the default handler logs that flood every second, for every listening
socket, for as long as the shortage lasts. `AcceptShortage` says it once
a minute instead, as one line with the limit, the number of reports since the last
one and what would help; every other report goes to the loop's default handler.
"""
from __future__ import annotations

import logging
import resource
import time

from .log_budget import LogBudget

log = logging.getLogger(__name__)

MESSAGE = "socket.accept() out of system resource"   # asyncio's words (selector_events.py)
REPEAT_S = 60.0
HELP = "Fewer workers in one process, or a higher ulimit -n, would help"


def short_of_files() -> str:
    """What this warning and the sending side's (transport.py) say of a process out of
    descriptors, with its limit."""
    return f"this process is short of its own resources (open files allowed: " \
           f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]})"


class AcceptShortage:
    """An event loop exception handler (loop.set_exception_handler)."""

    def __init__(self, repeat_s: float = REPEAT_S, clock=time.monotonic):
        # a line per repeat_s at most, naming how many reports came since the last
        self.budget = LogBudget(burst=1, window_s=repeat_s, clock=clock,
                                left_out="; {} more such reports since the last")

    def __call__(self, loop, context: dict) -> None:
        if context.get("message") != MESSAGE:
            loop.default_exception_handler(context)
            return
        more = self.budget.allow()
        if more is None:
            return
        log.warning("cannot accept connections: %s - %s; asyncio tries again every second%s. %s",
                    context.get("exception"), short_of_files(), more, HELP)


def install(loop) -> None:
    """Make `loop` report accept shortages with AcceptShortage, unless it has a handler already."""
    if loop.get_exception_handler() is None:
        loop.set_exception_handler(AcceptShortage())
