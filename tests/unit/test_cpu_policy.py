"""The worker's threads on a shared core: compute threads under SCHED_BATCH with the
default slice, the event loop's thread with a short slice, nice values untouched."""
import os
import threading

import pytest

from streamnet.runtime.dataplane.cpu_policy import SHORT_SLICE_NS, as_batch, short_slice

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux's scheduler")


def sched(tid: int) -> dict:
    out = {}
    with open(f"/proc/self/task/{tid}/sched") as f:
        for line in f:
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("policy", "se.slice"):
                out[key.strip()] = int(value.strip().split()[0])
    return out


def in_thread(fn):
    """fn() in a new thread; its result, the thread's sched fields and its nice value."""
    box = {}

    def run():
        try:
            box["result"] = fn()
            box["sched"] = sched(threading.get_native_id())
            box["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the thread did not finish within 10 s"
    if "error" in box:
        raise box["error"]
    return box


def test_a_short_slice_then_batch_with_the_default_slice():
    default = sched(threading.get_native_id()).get("se.slice")
    nice = os.getpriority(os.PRIO_PROCESS, 0)

    def loop_then_child():
        if not short_slice():
            return None
        mine = sched(threading.get_native_id())
        return mine, in_thread(as_batch)       # a compute thread started by the loop's thread

    box = in_thread(loop_then_child)
    if box["result"] is None:
        pytest.skip("this kernel has no per-task slice (sched_setattr refused)")
    loop, child = box["result"]
    assert loop == {"policy": 0, "se.slice": SHORT_SLICE_NS}
    assert box["nice"] == nice
    assert child["result"] is True
    assert child["sched"]["policy"] == os.SCHED_BATCH
    assert child["sched"]["se.slice"] == default != SHORT_SLICE_NS     # not the short one it inherited
    assert child["nice"] == nice
    assert sched(threading.get_native_id()).get("policy") == 0          # the caller's own thread is untouched
