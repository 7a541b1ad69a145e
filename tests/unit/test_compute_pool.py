import os
import threading

import pytest

from streamnet.runtime.dataplane.compute import ComputePool
from streamnet.runtime import wait_for


def test_pool_runs_jobs_and_resizes():
    pool = ComputePool(2, name="t-pool")
    try:
        assert pool.submit(lambda a, b: a + b, 2, 3).result(5) == 5
        gate = threading.Event()
        running = []

        def job():
            running.append(threading.current_thread().name)
            gate.wait(5)
        pool.resize(4)
        futs = [pool.submit(job) for _ in range(4)]
        wait_for(lambda: len(running) == 4, 5, "four jobs running at once")
        gate.set()
        [f.result(5) for f in futs]
        pool.resize(1)
        wait_for(lambda: sum(t.name.startswith("t-pool") for t in threading.enumerate()) == 1, 5,
                 "the pool to shrink to one thread")
        assert pool.busy_fraction() > 0
    finally:
        pool.shutdown()
    assert not any(t.name.startswith("t-pool") and t.is_alive() for t in threading.enumerate())


def test_exceptions_reach_the_caller():
    pool = ComputePool(1)
    try:
        fut = pool.submit(lambda: 1 / 0)
        try:
            fut.result(5)
            raise AssertionError("expected ZeroDivisionError")
        except ZeroDivisionError:
            pass
    finally:
        pool.shutdown()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_compute_threads_do_not_preempt_the_event_loop():
    """Compute threads run under SCHED_BATCH (a woken one waits for the running event
    loop to sleep), the calling thread keeps its policy, and nice values are untouched."""
    pool = ComputePool(2, name="t-batch")
    try:
        tid, policy, nice = pool.submit(lambda: (threading.get_native_id(), os.sched_getscheduler(0),
                                                 os.getpriority(os.PRIO_PROCESS, 0))).result(5)
        assert tid != threading.get_native_id()
        assert policy == os.SCHED_BATCH
        assert nice == os.getpriority(os.PRIO_PROCESS, 0)
        assert os.sched_getscheduler(0) != os.SCHED_BATCH
    finally:
        pool.shutdown()
