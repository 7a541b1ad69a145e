"""A budget of log lines for what strangers can cause.

Anyone who reaches a worker's port can have a stream refused (no secret, a bad MAC, a
garbled frame), and each refusal is worth a line - until a client sends thousands a
second and the lines fill the disk or the journal. `LogBudget` lets `burst` lines
through per `window_s` and counts the rest; the next line that goes through says how
many were left out. The refusals are all counted elsewhere (`/status`) regardless.
With `burst` 1 it is "once per window": the accept-shortage handler (accept_shortage.py).
"""
from __future__ import annotations

import logging
import time


class LogBudget:
    def __init__(self, burst: int = 20, window_s: float = 60.0, clock=time.monotonic,
                 left_out: str = " ({} more like it not logged before this)"):
        """`left_out`: the suffix, formatted with their count, of a line said after lines
        were left out."""
        self.burst, self.window_s, self.clock, self.left_out = burst, window_s, clock, left_out
        self._window_start = -float("inf")
        self._said = 0
        self.unsaid = 0          # lines left out since the last one said

    def allow(self) -> str | None:
        """None if this line is left out (counted), else a suffix for it ("" or the count
        of the lines left out before it)."""
        now = self.clock()
        if now - self._window_start >= self.window_s:
            self._window_start, self._said = now, 0
        if self._said >= self.burst:
            self.unsaid += 1
            return None
        self._said += 1
        suffix = self.left_out.format(self.unsaid) if self.unsaid else ""
        self.unsaid = 0
        return suffix


class BudgetFilter(logging.Filter):
    """A logging filter that lets a logger's records through within a LogBudget: for a
    library's logger that anyone who reaches the port can make write (aiohttp's server
    logs each malformed request with its traceback: 11 lines each, 11,000 lines in half a
    second from a stranger's loop). The next record let through says how many were left
    out."""

    def __init__(self, budget: LogBudget | None = None):
        super().__init__()
        self.budget = budget or LogBudget()

    def filter(self, record: logging.LogRecord) -> bool:
        said = self.budget.allow()
        if said is None:
            return False
        if said:
            record.msg = f"{record.msg}{said}"      # (the suffix holds no % for the record's args)
        return True


def budget_logger(name: str) -> None:
    """Give the logger `name` a BudgetFilter, once per process."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, BudgetFilter) for f in logger.filters):
        logger.addFilter(BudgetFilter())
