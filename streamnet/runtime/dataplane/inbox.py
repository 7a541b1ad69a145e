"""A bolt task's inbound queue, with an overflow behind it for what other workers send.

One stream carries everything from one worker to another. When a bolt's queue was
full, the stream that brought its next tuple waited for room, and so every task's
tuples and acks on it waited too: two workers each of whose slow bolts emitted to
the other froze each other until a stream was cut 30 s later (a relay on each of two
workers between a spout and a sink on each, shuffled: tests/integration).

Now a tuple from another worker that finds the queue full waits in the task's
overflow instead, in order, and the stream goes on. The worker tells the sender to
hold that task's tuples (delivery.py, HoldMsg): the sender's emitters to that task
wait, as a local emitter waits for a full queue, and nobody else does. The overflow
holds what was already on its way when the hold arrived - the sender's link queue and
the socket buffers, about what the stream held before - and feeds the queue as the
bolt takes tuples; once it is empty the senders are released.

The overflow is bounded too (OVERFLOW_TUPLES, OVERFLOW_BYTES of arrays: a sender
that does not hold, or a flood already in flight): past that the stream waits for it,
as before.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

import numpy as np

OVERFLOW_TUPLES = 1 << 16
OVERFLOW_BYTES = 256 << 20


def array_bytes(values: list) -> int:
    n = 0
    for v in values:
        if isinstance(v, np.ndarray):
            n += v.nbytes
    return n


class Inbox(asyncio.Queue):
    """asyncio.Queue(maxsize) of a bolt's tuples, plus `spill()` into an overflow that
    refills the queue, in order, as tuples are taken; `on_drained(inbox)` is called
    when the overflow has emptied. The queue is empty only when the overflow is too."""

    def __init__(self, maxsize: int, on_drained: Callable[["Inbox"], None] | None = None):
        super().__init__(maxsize)
        self.overflow: deque = deque()      # (tuple, its array bytes)
        self.overflow_bytes = 0
        self.most_overflow = 0              # the largest the overflow has been, in tuples
        self.told: dict[str, float] = {}    # sender worker -> when it was last told to hold
        self.on_drained = on_drained
        self._room: asyncio.Future | None = None    # a stream waiting for the overflow to shrink

    def has_room(self, n: int) -> bool:
        """Whether n tuples can go into the queue now, behind nothing in the overflow."""
        return not self.overflow and (self.maxsize <= 0 or self.maxsize - self.qsize() >= n)

    def overflow_full(self) -> bool:
        return len(self.overflow) >= OVERFLOW_TUPLES or self.overflow_bytes >= OVERFLOW_BYTES

    def spill(self, tuples: list) -> None:
        """Queue the tuples behind the overflow (into the queue itself while it has room
        and the overflow is empty)."""
        for tup in tuples:
            if not self.overflow and not self.full():
                self.put_nowait(tup)
                continue
            size = array_bytes(tup.values)
            self.overflow.append((tup, size))
            self.overflow_bytes += size
        self.most_overflow = max(self.most_overflow, len(self.overflow))

    async def overflow_room(self) -> None:
        """Wait until the overflow is below its bounds."""
        while self.overflow_full():
            if self._room is None or self._room.done():
                self._room = asyncio.get_running_loop().create_future()
            await self._room

    def _get(self):
        item = super()._get()
        if self.overflow:
            tup, size = self.overflow.popleft()
            self.overflow_bytes -= size
            super()._put(tup)
            self._unfinished_tasks += 1     # as put_nowait() counts it
            if self._room is not None and not self._room.done() and not self.overflow_full():
                self._room.set_result(None)
            if not self.overflow and self.on_drained is not None:
                self.on_drained(self)
        return item
