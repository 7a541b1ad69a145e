"""The worker's compute threads: a pool whose size changes while it runs.

The load balancer moves threads between workers, so the pool grows by starting
threads and shrinks by letting surplus threads exit after their current job.
Busy time is accounted per job so /status can report the busy fraction.

Compute threads run under SCHED_BATCH (cpu_policy.py): a woken one does not
preempt the event loop on its core.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from .cpu_policy import as_batch


class ComputePool:
    def __init__(self, threads: int, name: str = "compute"):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._name = name
        self._target = 0
        self._alive = 0
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self._busy_s = 0.0
        self._since = time.monotonic()
        self._closed = False
        self.resize(threads)

    @property
    def size(self) -> int:
        return self._target

    def resize(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"compute threads must be >= 1; got {threads}")
        with self._lock:
            self._target = threads
            while self._alive < threads:
                self._alive += 1
                self._seq += 1
                t = threading.Thread(target=self._run, name=f"{self._name}-{self._seq}", daemon=True)
                self._threads.append(t)
                t.start()
            for _ in range(self._alive - threads):
                self._q.put(None)  # one surplus thread exits per marker

    def submit(self, fn, *args) -> Future:
        if self._closed:
            raise RuntimeError("compute pool is shut down")
        fut: Future = Future()
        self._q.put((fut, fn, args))
        return fut

    def _run(self) -> None:
        as_batch()
        while True:
            item = self._q.get()
            if item is None:
                with self._lock:
                    if self._alive > self._target or self._closed:
                        self._alive -= 1
                        return
                continue  # a marker that resize() no longer needs
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            t0 = time.monotonic()
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
                fut.set_exception(e)
            finally:
                with self._lock:
                    self._busy_s += time.monotonic() - t0

    def busy_fraction(self) -> float:
        """Busy thread-seconds over available thread-seconds since the last call."""
        with self._lock:
            now = time.monotonic()
            span = max(now - self._since, 1e-9) * max(self._target, 1)
            frac, self._busy_s, self._since = min(self._busy_s / span, 1.0), 0.0, now
            return frac

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._closed = True
            self._target = 0
            n = self._alive
        for _ in range(n):
            self._q.put(None)
        for t in self._threads:
            t.join(timeout)

