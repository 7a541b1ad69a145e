"""A progress line for long work: redrawn in place on a terminal, a line per step
of progress otherwise (logs and CI stay readable)."""
from __future__ import annotations

import sys
import time


class ProgressLine:
    def __init__(self, stream=None, min_interval: float = 0.2, log_interval: float = 10.0):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.min_interval = min_interval if self.tty else log_interval
        self._last = 0.0
        self._open = False

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def line(self, text: str) -> None:
        """A permanent line (an epoch's result)."""
        if self._open:
            self.stream.write("\r\033[K")
            self._open = False
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last = time.monotonic()


def bar(fraction: float, width: int = 24) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "[" + "#" * filled + "." * (width - filled) + "]"
