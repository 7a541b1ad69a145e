"""A bolt task's inbound queue, with an overflow behind it for what other workers send.

One stream carries everything from one worker to another. When a bolt's queue was
full, the stream that brought its next tuple waited for room, and so every task's
tuples and acks on it waited too: two workers each of whose slow bolts emitted to
the other froze each other until a stream was cut 30 s later (a relay on each of two
workers between a spout and a sink on each, shuffled: tests/integration).

Now the worker tells a sender to hold that task's tuples (delivery.py, HoldMsg) once
the queue is three quarters full (HIGH), and releases it once the queue is down to
half (LOW) with nothing in the overflow, or when the bolt takes a tuple MAX_HOLD_S
after the first hold with nothing in the overflow: the sender's emitters to that task
wait, as a local emitter waits for a full queue, and nobody else does. A tuple from
another worker that finds the queue full - what was already on its way when the hold
arrived: the sender's link queue, the socket buffers, the receiver's frames not yet
dispatched - waits in the task's overflow, in order, and the stream goes on; the
overflow feeds the queue as the bolt takes tuples.

The worker says a hold again every delivery.HOLD_LEASE_S / 2 while it lasts; on the
sender it lapses after HOLD_LEASE_S without that, so a release lost with a stream,
or never sent by an instance that stopped, costs a sender at most that.

A saturated flood of small tuples goes mostly through the overflow (what the socket
buffers hold of them, 32,000 at a time in perf/transport.py's, arrives before the
hold takes effect): up to about 13 % fewer a second than when the stream waited
(docs/perf-history.md).

The overflow is bounded too, per task (OVERFLOW_TUPLES; OVERFLOW_BYTES of arrays,
strings and bytes - an array is a view of its frame, which holds about as much): past
either the stream waits for it, as every stream did before; a bolt that cannot drain
it because it waits on a hold whose release is queued behind on that stream is freed
when the hold lapses.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

import numpy as np

from ..codec import array_bytes

OVERFLOW_TUPLES = 1 << 16
OVERFLOW_BYTES = 256 << 20
#: a bolt's queue this full: its senders are told to hold; this empty (and the
#: overflow empty): released
HIGH, LOW = 0.75, 0.5
#: ... or released this long after the first was told, whatever the queue: local
#: emitters, woken as each tuple is taken, could keep it above LOW for ever; what the
#: released senders send then reaches the overflow, which the queue takes before them
MAX_HOLD_S = 0.25
#: a sender whose tuples still come this long after it was told to hold is told again
#: (the hold may have been lost with a broken stream)
RETELL_S = 0.5


class Inbox(asyncio.Queue):
    """asyncio.Queue(maxsize) of a bolt's tuples, plus `spill()` into an overflow that
    refills the queue, in order, as tuples are taken. `told` holds the senders told to
    hold; `on_release(inbox)` is called when there are some, the overflow is empty and
    the queue is down to LOW. The queue is empty only when the overflow is too."""

    def __init__(self, maxsize: int, on_release: Callable[["Inbox"], None] | None = None):
        super().__init__(maxsize)
        self.overflow: deque = deque()      # (tuple, its array bytes)
        self.overflow_bytes = 0
        self.most_overflow = 0              # the largest the overflow has been, in tuples
        self.told: dict[str, float] = {}    # sender worker -> when it was last told to hold
        self.held_since = 0.0               # when the first of `told` was told
        self.renewal = None                 # the timer that says the holds again (delivery.py)
        self.on_release = on_release
        self.high = max(1, int(maxsize * HIGH)) if maxsize > 0 else None    # None: never held
        self.low = int(maxsize * LOW)
        self._room: asyncio.Future | None = None    # a stream waiting for the overflow to shrink

    def tell(self, sender: str) -> bool:
        """Whether `sender`, whose tuples just filled the queue past HIGH or went into
        the overflow, is to be told to hold now (not if it was within RETELL_S)."""
        now = time.monotonic()
        last = self.told.get(sender)
        if last is not None and now - last < RETELL_S:
            return False
        if not self.told:
            self.held_since = now
        self.told[sender] = now
        return True

    def renew(self) -> list[str]:
        """The senders told to hold, told again now."""
        now = time.monotonic()
        for sender in self.told:
            self.told[sender] = now
        return list(self.told)

    def released(self) -> dict[str, float]:
        """The senders told to hold, now released."""
        told, self.told = self.told, {}
        return told

    def above_high(self) -> bool:
        """Whether the senders should hold (the queue at HIGH or more)."""
        return self.high is not None and len(self._queue) >= self.high

    def has_room(self, n: int) -> bool:
        """Whether n tuples can go into the queue now, behind nothing in the overflow."""
        return not self.overflow and (self.maxsize <= 0 or self.maxsize - self.qsize() >= n)

    def overflow_full(self) -> bool:
        return len(self.overflow) >= OVERFLOW_TUPLES or self.overflow_bytes >= OVERFLOW_BYTES

    def spill(self, tuples: list) -> None:
        """Queue the tuples behind the overflow (into the queue itself while it has room
        and the overflow is empty)."""
        overflow, start = self.overflow, 0
        if not overflow:
            start = len(tuples) if self.maxsize <= 0 else max(0, min(len(tuples), self.maxsize - self.qsize()))
            for tup in tuples[:start]:
                self.put_nowait(tup)
        added = 0
        for k in range(start, len(tuples)):
            tup = tuples[k]
            n = 0
            for v in tup.values:        # codec.array_bytes(), inline: once per tuple of a flood
                if type(v) is np.ndarray:
                    n += v.nbytes
                elif type(v) is str or type(v) is bytes:
                    n += len(v)
                elif type(v) is list or type(v) is dict:
                    n += array_bytes(v)
            overflow.append((tup, n))
            added += n
        self.overflow_bytes += added
        if len(overflow) > self.most_overflow:
            self.most_overflow = len(overflow)

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
        elif self.told and self.on_release is not None and (
                len(self._queue) <= self.low or time.monotonic() - self.held_since >= MAX_HOLD_S):
            self.on_release(self)
        return item
