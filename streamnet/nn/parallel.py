"""One model step split across threads by batch.

`ParallelStep(model, threads)` is made once per model (it owns one replica of the
network per chunk of the batch: the layers' saved activations and a gradient row
each) and then called like `model.loss_and_grad`:

    step = ParallelStep(model, threads=2)
    loss, grads = step.loss_and_grad(x, y)   # grads is model.grads, as for one thread

The batch is cut into contiguous chunks (sizes differ by at most one): one per
thread for big models, up to CHUNKS_PER_THREAD per thread of at least MIN_CHUNK
samples for small ones (or `chunks_per_thread`). Threads take the next chunk from a
shared counter until none is left, so a thread that starts late or is preempted (a
shared machine) runs fewer chunks instead of holding the others at the join, and one
that has not started when the chunks are done takes none: nobody waits for it.
Threads 1..T-1 are not woken for each step: each stays, polling without the GIL,
for up to SPIN_CHECKS sched_yield calls (about 1 ms) after a step for the next one,
and goes back to its pool only when none comes (between the rounds of a trainer);
the calling thread polls the same way for the last chunk and for the others to
leave the step before it sleeps. A wake-up across cores costs 100-300 us on a host
like fc-v1045, two of them a step: LeNet-5 batch 64 on 2 threads went from 1.41x
and 1.31x to 1.51x and 1.48x one thread that way (perf/kernels.py, 15 pairs each,
old and new alternating), AlexNet-64 batch 64 1.90x before, 1.73x and 1.83x after
(5 pairs each: within its spread). Replica c
computes the mean loss and gradient of chunk c into row c of a (C, P) buffer,
reading the model's own parameter vector (shared, not copied), whichever thread
runs it. Once every chunk is done, the rows are combined as sum_c (n_c / N) * row_c
in the fixed order c = 0..C-1, the threads taking slices of the vector from a second
counter (for a small model one slice, the whole vector, summed by the calling thread,
which waits for the join anyway -- LeNet-5 batch 64 1.77x -> 1.81x, 12 paired
blocks; one slice per thread for a big model), so the
result is the same whatever order the threads finish in or whichever ran what, and
equals the one-thread gradient up to float32 rounding of the summation order
(tests/unit/test_model_parallel_step.py: 1e-5 relative).

Dropout stays exact: each replica's mask is drawn at its chunk's global sample
offset, from the model's step counter, so 1, 2 or 4 threads drop the same units.

Where the time goes (LeNet-5 batch 64, 2 chunks of 32, idle 2-vCPU VM, a step's
timeline, medians of 300 steps): the caller starts its chunk 0.021 ms into the
step, the pool thread 0.038 ms (its wake-up); both chunks end near 1.19 ms, and
the sum and the join take the last 0.06 ms of a 1.26 ms step. Each chunk runs
~5-10 % slower than alone, most likely from sharing the process, the GIL: the same
32-sample step free-running in a second *thread* slowed the first by 7.6 %, in a
second *process* by 0.2 % (3 alternating rounds of 200 steps; two later runs, with
the fused steps below, 1.3 % against 2.3 % and 4.9 % against 2.6 %: the host's
noise is as large). Not the cores: a vectorised FMA loop, an L2 or a 32 MB stream,
or small sgemms on the other core cost 0.6-5.7 %. Every kernel is nogil, but each
call re-takes the GIL on return, and a thread that finds the other one holding it
(between its kernels) sleeps until woken: a median 30 us on this VM (a
threading.Event hand-off), and a thread making tiny numba calls in a loop slowed a
step by 11 % at one moment and 61 % at another. Hence the fused layer steps
(nn/model.py, compute_order): 11 kernel calls per LeNet-5 chunk instead of 25. A
spin-wait (nogil, bounded) for the other chunk instead of sleeping on the event
did not help there (1.002x, 14 paired blocks), where a wake-up took 30 us; on a
host where it takes 100-300 us it does (below). So a step of ~2.2 ms
ends near 1.7x on two threads, and AlexNet-64's ~1 s step at 1.9x. On a shared
machine a step that waits for a fixed half lost all of it whenever another job
took a core (0.7x of one thread, the free-running pair 1.1-1.3x): hence the chunks
and the cancelled late task. What the chunks cost: CPU time per step (all threads,
getrusage, load ~8) 1 thread 3.55-3.60 ms, 2 halves 3.88-4.00, 4 chunks 4.06-4.12
- the two extra chunks' layer calls and the 4-row sum; see MIN_CHUNK for why
LeNet-5's batch 64 now runs in 2. Big models keep one chunk per thread: AlexNet-64
batch 64 in 4 chunks ran 1.84x against 1.90x for 2 (a quiet moment).

On a host whose cross-core wake-up is slow (fc-v1045: a threading.Event round trip
of 100-330 us; perf/kernels.py prints it) LeNet-5 batch 64 stays near 1.3x, and
fewer GIL re-takes are not the cure there: a whole LeNet-5 chunk as one nogil numba
function (the same kernels, composed in nopython mode) ran 1.44x against 1.37x for
the 11 calls (12 alternating blocks), took 8-68 s to compile, and two such chunks
free-running in two threads of one process ran only 3-5 % slower than in two
processes. What was left was the start and the join of every step, a wake-up
each: hence the polling below.
"""
from __future__ import annotations

import ctypes
import threading
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np
from numba import njit

from .. import kernels as K


#: models with fewer parameters than this are "small": their batch is cut into up to
#: CHUNKS_PER_THREAD chunks per thread by default (a row per chunk is cheap to keep
#: and to sum; a big model's dense weights would be read once more per chunk), and
#: one thread sums all rows (LeNet-5, 62k parameters, 4 rows in ~50 us)
SMALL_MODEL = 1 << 20
CHUNKS_PER_THREAD = 2
#: samples: a LeNet-5 chunk of 16 costs ~5 % more per sample than one of 32 (0.589 ms
#: against 1.116 ms), and batch 64 as 4 chunks of 16 on 2 threads ran 1.59x one thread
#: against 1.73x as 2 chunks of 32 (10 paired blocks, idle, load 0.4): so batch 64
#: runs one chunk per thread, and 128 two
MIN_CHUNK = 32


#: sched_yield calls a waiting thread makes before it sleeps instead (about 1 ms on
#: fc-v1045): between the steps of a round, and at a step's join, the other thread is
#: back well within it, and a wake-up from sleep costs 100-300 us on such a host
SPIN_CHECKS = 2000
#: sched_yield calls (~0.5 us each) a thread waits between seeing a step start and
#: asking for the GIL, which the calling thread holds until its first kernel: LeNet-5
#: b64, the second thread's start 55 -> 45 us mean and a step 1575 -> 1541 us mean
#: (a timeline of 1,800 steps each, alternating; 0 and 20 against 1.71x and 1.74x
#: one thread, within the noise)
GRACE_CHECKS = 20

_sched_yield = ctypes.CDLL(None).sched_yield
_sched_yield.argtypes = []
_sched_yield.restype = ctypes.c_int


@njit(nogil=True)   # not cached: numba cannot cache a function that calls through ctypes
def _spin_until(flags, k, value, checks):
    """Wait, with the GIL released, until flags[k] >= value: True, or False after
    `checks` sched_yield calls. The call is opaque to the compiler, so flags[k] is read
    again each time; a thread that needs the core meanwhile gets it."""
    for _ in range(checks):
        if flags[k] >= value:
            return True
        _sched_yield()
    return flags[k] >= value


@njit(nogil=True)
def _publish_then_spin(published, k, value, flag, wanted, checks, grace):
    """published[k] = value, then _spin_until(flag, 0, wanted, checks), and once the
    flag is seen `grace` more sched_yield calls before returning.

    The write happens with the GIL released: a thread polling `published` (without the
    GIL) that sees it takes the GIL uncontended, where one set from Python would wake
    the poller while the setter still held the GIL for the rest of its bookkeeping, so
    that the poller slept on the GIL until woken (a cross-core wake-up, 50-150 us on
    such hosts). The grace is for the same reason: whoever set `flag` holds the GIL
    for a few more microseconds (until its first kernel), and a thread that asks for
    it meanwhile sleeps until woken."""
    published[k] = value
    if not _spin_until(flag, 0, wanted, checks):
        return False
    for _ in range(grace):
        _sched_yield()
    return True


class _Signal:
    """A one-shot event that its waiter first polls for up to SPIN_CHECKS without the
    GIL and only then sleeps on: on a host whose cross-core wake-up is slow, a wait of
    tens of microseconds should not cost a wake-up."""

    def __init__(self):
        self._flag = np.zeros(1, dtype=np.int64)
        self._event = threading.Event()

    def set(self) -> None:
        self._flag[0] = 1
        self._event.set()

    def wait(self) -> None:
        if not _spin_until(self._flag, 0, 1, SPIN_CHECKS):
            self._event.wait()


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) ranges of n items in at most `parts` non-empty shards."""
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    out, lo = [], 0
    for k in range(parts):
        hi = lo + base + (1 if k < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


class ParallelStep:
    """Loss and gradient of one batch on `threads` threads.

    Workspaces (replicas, gradient rows) live on this object: make one per model
    and keep it. Not re-entrant: one step at a time per object (a second
    concurrent call raises RuntimeError); the model's parameters must not change
    during a step. `executor`, if given, runs threads 1..T-1 of the step (thread 0
    is the calling one), each of which keeps its pool thread for about a
    millisecond after a step (waiting for the next); it must have T-1 workers free
    for the duration of the steps, so do not pass the pool the caller itself is
    running on unless it is that much larger. Without one, the object owns a pool
    of T-1 threads; `close()` sends the waiting threads away and shuts it down
    (also a context manager).
    """

    def __init__(self, model, threads: int, executor: Executor | None = None,
                 chunks_per_thread: int | None = None):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.model, self.threads = model, int(threads)
        self.small = model.num_params < SMALL_MODEL
        if chunks_per_thread is None:
            chunks_per_thread = CHUNKS_PER_THREAD if self.small else 1
        if chunks_per_thread < 1:
            raise ValueError(f"chunks_per_thread must be >= 1, got {chunks_per_thread}")
        most = self._most_chunks = self.threads * int(chunks_per_thread)
        self._rows = np.zeros((most, model.num_params), dtype=np.float32)
        self._replicas = [model.replica(grads=self._rows[c]) for c in range(most)]
        self._own_pool = executor is None and self.threads > 1
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="streamnet-step") \
            if self._own_pool else executor
        self._busy = threading.Lock()
        self._lock = threading.Lock()  # guards the chunk counters of the step in progress
        # slices of the gradient vector to sum the rows over, fixed once: for a small
        # model one, the whole vector, summed by the calling thread once the others have
        # left; for a big one a slice per thread, taken by the threads
        self._slices = shard_bounds(model.num_params, 1 if self.small else self.threads)
        self._plans: dict[int, tuple] = {}
        # threads 1..T-1 stay between steps (_partner): a step bumps _go and sets _job
        self._go = np.zeros(1, dtype=np.int64)
        self._left = np.zeros(self.threads, dtype=np.int64)  # [k]: the last step thread k left
        self._job = None
        self._alive = [False] * self.threads
        self._closing = False

    def chunks(self, n: int) -> list[tuple[int, int]]:
        """The chunks a batch of n is cut into (the rows it fills, in order)."""
        return self._plan(n)[0]

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Same contract as `Model.loss_and_grad`: returns (mean loss, model.grads)."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("ParallelStep is already running a step; make one per thread of control")
        try:
            return self._step(x, y)
        finally:
            self._busy.release()

    def _plan(self, n: int):
        """(chunks, weights, threads used) for a batch of n, made once per size."""
        plan = self._plans.get(n)
        if plan is None:
            parts = min(self.threads, n)
            parts = max(parts, min(self._most_chunks, n // MIN_CHUNK))
            chunks = shard_bounds(n, parts) if n else [(0, 0)]
            weights = np.array([(hi - lo) / max(n, 1) for lo, hi in chunks], dtype=np.float64)
            plan = self._plans[n] = (chunks, weights, min(self.threads, len(chunks)))
        return plan

    def _step(self, x, y):
        model = self.model
        x = model._check_input(x)
        labels = model._check_labels(y, x.shape[0])
        chunks, weights, used = self._plan(x.shape[0])
        steps = model.random_state()
        rows = self._rows[:len(chunks)]
        slices = self._slices
        # threads take chunks, then (once every chunk is done) slices of the sum, from
        # shared counters: a thread that gets no core in time takes nothing, so nobody
        # waits for it; the step ends when the calling thread has run out of chunks and
        # slices and no other thread is inside it (it never leaves one running on
        # shared buffers)
        state = {"chunk": 0, "left": len(chunks), "slice": 0, "failed": False,
                 "active": set(), "caller_done": False, "losses": {}, "errors": []}
        all_done, quiet = _Signal(), _Signal()
        lock = self._lock

        def take(counter: str, limit: int) -> int:
            with lock:
                i = state[counter]
                state[counter] = i + 1
                return i if i < limit and not state["failed"] else -1

        def fail(e: BaseException) -> None:
            with lock:
                state["failed"] = True  # nobody takes more chunks or slices
                state["errors"].append(e)
            all_done.set()  # release the others

        started = []   # the step's number, once the calling thread started the others

        def run(k):
            c = take("chunk", len(chunks))
            while c >= 0:
                lo, hi = chunks[c]
                rep = self._replicas[c]
                rep.set_random_state(steps)
                rep.set_sample_offset(lo)
                if not started:
                    # as late as possible, so the GIL is free soon after they see it
                    started.append(self._start_partners(partner, used))
                try:
                    loss = rep._loss_and_grad(x[lo:hi], labels[lo:hi])[0]
                except BaseException as e:
                    fail(e)
                    return
                with lock:
                    state["losses"][c] = loss
                    state["left"] -= 1
                    if state["left"] == 0:
                        all_done.set()
                c = take("chunk", len(chunks))
            if self.small or k >= len(slices):
                return  # a small model's sum is the calling thread's, once the others left
            all_done.wait()  # the chunks other threads are still running
            j = take("slice", len(slices))
            while j >= 0:
                a, b = slices[j]
                try:
                    K.weighted_sum_rows(model.grads, rows, weights, a, b)
                except BaseException as e:
                    fail(e)
                    return
                j = take("slice", len(slices))

        def partner(k):
            with lock:
                state["active"].add(k)
            try:
                run(k)
            finally:
                with lock:
                    state["active"].discard(k)
                    if not state["active"] and state["caller_done"]:
                        quiet.set()
            # back in _partner, the thread publishes _left[k] = this step without the GIL

        try:
            run(0)
        except BaseException as e:      # not from a chunk (run catches those): still wait below
            fail(e)
        step = started[0] if started else self._start_partners(partner, used)
        with lock:
            state["caller_done"] = True
            others = sorted(state["active"])
        for k in others:
            # poll for the flag partner k publishes once it has left (see
            # _publish_then_spin); if it takes too long, sleep until the last one leaves
            if not _spin_until(self._left, k, step, SPIN_CHECKS):
                quiet.wait()
                break
        if state["errors"]:
            raise state["errors"][0]
        if self.small:
            K.weighted_sum_rows(model.grads, rows, weights, *slices[0])   # the whole vector
        losses = state["losses"]
        model.set_random_state(self._replicas[0].random_state())
        return float(sum(weights[c] * losses[c] for c in range(len(chunks)))), model.grads

    def _start_partners(self, job, count: int) -> int:
        """Hand this step's job to threads 1..count-1: those still waiting from the last
        step take it at once, a task is submitted for each of the others. Returns the
        step's number."""
        with self._lock:
            self._job = job
            self._go[0] += 1
            step = int(self._go[0])
            for k in range(1, count):
                if not self._alive[k]:
                    self._alive[k] = True
                    self._pool.submit(self._partner, k, step - 1)
        return step

    def _partner(self, k: int, seen: int) -> None:
        """Thread k of the steps: run each new step's job, waiting between steps (a
        spin, then leave: the thread goes back to its pool, and the next step submits
        a task again)."""
        try:
            while True:
                # says, without the GIL, that the step `seen` is left (see _step)
                waited = _publish_then_spin(self._left, k, seen, self._go, seen + 1, SPIN_CHECKS,
                                            GRACE_CHECKS)
                with self._lock:
                    # decided under the lock that _start_partners takes: a step that
                    # finds this thread alive is sure to be run by it
                    if self._closing or (not waited and self._go[0] <= seen):
                        self._alive[k] = False
                        return
                    seen, job = int(self._go[0]), self._job
                job(k)
        except BaseException:
            with self._lock:
                self._alive[k] = False
            raise

    def close(self) -> None:
        with self._lock:
            self._closing = True     # waiting threads leave at their next check
        if self._own_pool and self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
