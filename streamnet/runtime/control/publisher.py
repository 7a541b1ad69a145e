"""Task results (ctx.publish) go to the coordinator off the worker's event loop.

A training run publishes its progress every round; written on the event loop, one
slow or unreachable ZooKeeper held every task of the worker (and /status) for as
long as the write waited. Here publish() encodes the value at once (the caller may
change it afterwards) and a background task writes the newest value of each key,
in order, riding out a lost connection. flush() waits until everything published so
far is written - before a worker reports a topology stopped, since clients read the
results right after.
"""
from __future__ import annotations

import asyncio
import logging

from .. import codec
from .coordinator import CoordinatorError

log = logging.getLogger(__name__)


class ResultPublisher:
    def __init__(self, state):
        self.state = state
        self._pending: dict[tuple[str, str], bytes] = {}    # newest value per (topology, key)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="result-publisher")

    def publish(self, topology: str, key: str, value) -> None:
        self._pending[(topology, key)] = codec.encode_bytes(value)
        self._idle.clear()
        self._wake.set()

    async def flush(self, timeout: float = 60.0) -> bool:
        """True once everything published so far is written (False after timeout s)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            log.error("results not written to the coordinator within %.0f s: %s", timeout,
                      ", ".join(f"{t}/{k}" for t, k in self._pending) or "one in flight")
            return False

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                (topology, key), data = next(iter(self._pending.items()))
                del self._pending[(topology, key)]
                try:
                    await asyncio.to_thread(self.state.put_result, topology, key, data)
                except CoordinatorError as e:   # gone for longer than the resend window
                    log.error("could not publish %s of %s: %s", key, topology, e)
            if not self._pending:
                self._idle.set()

    async def close(self, timeout: float = 10.0) -> None:
        await self.flush(timeout)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
