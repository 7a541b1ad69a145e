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
import math
import resource
import time

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
        self.repeat_s, self.clock = repeat_s, clock
        self.said_at = -math.inf
        self.unsaid = 0            # reports since the last line

    def __call__(self, loop, context: dict) -> None:
        if context.get("message") != MESSAGE:
            loop.default_exception_handler(context)
            return
        now = self.clock()
        if now - self.said_at < self.repeat_s:
            self.unsaid += 1
            return
        more = f"; {self.unsaid} more such reports since the last" if self.unsaid else ""
        log.warning("cannot accept connections: %s - %s; asyncio tries again every second%s. %s",
                    context.get("exception"), short_of_files(), more, HELP)
        self.said_at, self.unsaid = now, 0


def install(loop) -> None:
    """Make `loop` report accept shortages with AcceptShortage, unless it has a handler already."""
    if loop.get_exception_handler() is None:
        loop.set_exception_handler(AcceptShortage())
