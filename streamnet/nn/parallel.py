"""One model step split across threads by batch.

`ParallelStep(model, threads)` is made once per model (it owns one replica of the
network per thread: the layers' saved activations and a gradient row each) and
then called like `model.loss_and_grad`:

    step = ParallelStep(model, threads=2)
    loss, grads = step.loss_and_grad(x, y)   # grads is model.grads, as for one thread

The batch is cut into `threads` contiguous shards (sizes differ by at most one);
replica k computes the mean loss and gradient of shard k into row k of a (T, P)
buffer, reading the model's own parameter vector (shared, not copied). The rows
are then combined as sum_k (n_k / N) * row_k in the fixed order k = 0..T-1, each
thread reducing one slice of the vector, so the result is the same whatever order
the threads finish in, and equals the one-thread gradient up to float32 rounding
of the summation order (tests/unit/test_model_parallel_step.py: 1e-5 relative).

Dropout stays exact: each replica's mask is drawn at its shard's global sample
offset, from the model's step counter, so 1, 2 or 4 threads drop the same units.

Where the time goes (LeNet-5 batch 64, idle 16-core VM, one trial of 40 steps
each, min-median): one thread 3.1 ms; one 32-sample shard alone 1.46 ms (ideal
2.1x); the two shards at once on two threads with no synchronisation at all
1.62-1.80 ms; the whole ParallelStep 1.55-1.77 ms. So the hand-offs and the
reduction cost next to nothing (the reduction did: 109 us per thread per step
until weighted_sum_rows vectorised); what is lost is that each shard's own CPU
time grows ~11 % while the other runs, and at times one shard's by ~50 % (cores
sharing the host's resources): no way of splitting the batch changes that.
"""
from __future__ import annotations

import threading
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np

from .. import kernels as K


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
    during a step. `executor`, if given, runs shards 1..T-1 (shard 0 runs on the
    calling thread); it must have T-1 workers free for the duration of the step,
    so do not pass the pool the caller itself is running on unless it is that
    much larger. Without one, the object owns a pool of T-1 threads; `close()`
    shuts it down (also a context manager).
    """

    def __init__(self, model, threads: int, executor: Executor | None = None):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.model, self.threads = model, int(threads)
        self._rows = np.zeros((self.threads, model.num_params), dtype=np.float32)
        self._replicas = [model.replica(grads=self._rows[k]) for k in range(self.threads)]
        self._own_pool = executor is None and self.threads > 1
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="streamnet-step") \
            if self._own_pool else executor
        self._busy = threading.Lock()
        # slices of the gradient vector reduced by each thread, fixed once
        self._slices = shard_bounds(model.num_params, self.threads)

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Same contract as `Model.loss_and_grad`: returns (mean loss, model.grads)."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("ParallelStep is already running a step; make one per thread of control")
        try:
            return self._step(x, y)
        finally:
            self._busy.release()

    def _step(self, x, y):
        model = self.model
        x = model._check_input(x)
        labels = model._check_labels(y, x.shape[0])
        n = x.shape[0]
        shards = shard_bounds(n, self.threads) if n else [(0, 0)]
        steps = model.random_state()
        weights = np.array([(hi - lo) / max(n, 1) for lo, hi in shards], dtype=np.float64)
        rows = self._rows[:len(shards)]
        # one task per thread: its shard, then (once every shard is done) its slice
        # of the reduction; a second round of tasks cost a thread wake-up each step
        done = threading.Barrier(len(shards))

        def run(k):
            lo, hi = shards[k]
            rep = self._replicas[k]
            rep.set_random_state(steps)
            rep.set_sample_offset(lo)
            try:
                loss = rep.loss_and_grad(x[lo:hi], labels[lo:hi])[0]
            except BaseException:
                done.abort()  # release the others: they raise BrokenBarrierError
                raise
            done.wait()
            for j in range(k, len(self._slices), len(shards)):
                a, b = self._slices[j]
                K.weighted_sum_rows(model.grads, rows, weights, a, b)
            return loss

        losses = self._fan_out(run, len(shards))
        model.set_random_state(self._replicas[0].random_state())
        return float(sum(w * v for w, v in zip(weights, losses))), model.grads

    def _fan_out(self, fn, count: int) -> list:
        """fn(0) here, fn(1..count-1) on the pool; results in index order."""
        futures = [self._pool.submit(fn, k) for k in range(1, count)]
        try:
            first = fn(0)
        except BaseException as exc:
            # never leave a shard running on shared buffers; report the shard that
            # failed, not the others' broken barrier
            errors = [f.exception() for f in futures]
            cause = next((e for e in [exc] + errors if e is not None
                          and not isinstance(e, threading.BrokenBarrierError)), exc)
            raise cause
        return [first] + [f.result() for f in futures]

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
