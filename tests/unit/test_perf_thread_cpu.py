"""perf/common.py's ThreadCpu account: the engine's own CPU per compute second, read off
per-thread CPU samples (here made up, as /proc would give them)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "perf"))
from common import ThreadCpu  # noqa: E402

MS = 1_000_000      # nanoseconds


def meter(samples, others=None, every=0.2) -> ThreadCpu:
    """A meter given (per thread, per other process) samples taken every `every` s, or
    (time, per thread, per other process) ones."""
    m = ThreadCpu.__new__(ThreadCpu)       # no sampling thread: the samples are given
    m.pid, m.every, m.others = 100, 0.2, dict(others or {})
    m.samples = [s if len(s) == 3 else (i * every, *s) for i, s in enumerate(samples)]
    return m


def test_only_intervals_where_the_compute_thread_runs_count():
    # thread 100 is the event loop, 101 the compute thread, 102 the coordinator's client
    rows = [({100: 0, 101: 0, 102: 0}, {}),
            ({100: 5 * MS, 101: 10 * MS, 102: 0}, {}),          # start-up: compute at 5 % of the interval
            ({100: 25 * MS, 101: 190 * MS, 102: 5 * MS}, {}),   # training: 180 ms of 200
            ({100: 45 * MS, 101: 370 * MS, 102: 10 * MS}, {}),  # training
            ({100: 50 * MS, 101: 371 * MS, 102: 10 * MS}, {})]  # the end: idle
    acc = meter(rows).account()
    assert acc["compute_s"] == 0.36 and acc["loop_s"] == 0.04 and acc["other_threads_s"] == 0.01
    assert acc["window_s"] == 0.4
    assert acc["loop_per_compute"] == round(0.04 / 0.36, 4)
    assert acc["other_per_compute"] == round(0.01 / 0.36, 4)


def test_other_processes_are_read_in_the_same_intervals():
    rows = [({100: 0, 101: 0}, {"zookeeper": 0}),
            ({100: 1 * MS, 101: 150 * MS}, {"zookeeper": 30 * MS}),
            ({100: 2 * MS, 101: 151 * MS}, {"zookeeper": 90 * MS})]   # compute idle: not counted
    acc = meter(rows, {"zookeeper": 7}).account()
    assert acc["compute_s"] == 0.15 and acc["zookeeper_per_compute"] == 0.2


def test_a_worker_that_never_computed_has_no_account():
    rows = [({100: 0, 101: 0}, {}), ({100: 150 * MS, 101: 1 * MS}, {})]   # only the loop busy
    assert meter(rows).account() is None


def test_a_thread_that_appears_later_counts_from_its_first_sample():
    rows = [({100: 0, 101: 0}, {}), ({100: 10 * MS, 101: 180 * MS, 103: 50 * MS}, {}),
            ({100: 20 * MS, 101: 360 * MS, 103: 55 * MS}, {})]
    acc = meter(rows).account()
    assert acc["other_threads_s"] == 0.005      # thread 103's 5 ms after it was first seen


def test_intervals_count_for_as_long_as_they_were():
    """The sampler wakes late: 180 ms of compute in an interval of 250 ms is 72 % of a core,
    not 90 % of the nominal 200."""
    rows = [(0.0, {100: 0, 101: 0}, {}), (0.25, {100: 10 * MS, 101: 180 * MS}, {}),
            (0.5, {100: 20 * MS, 101: 360 * MS}, {})]
    acc = meter(rows).account()
    assert acc["window_s"] == 0.5 and acc["compute_s"] == 0.36            # 72 % of the window
    late = [(0.0, {100: 0, 101: 0}, {}), (1.0, {100: 10 * MS, 101: 180 * MS}, {})]
    assert meter(late).account() is None           # 18 % of its 1 s: not an interval of steady compute


def test_another_process_whose_thread_exits_counts_nothing_below_zero():
    rows = [({100: 0, 101: 0}, {"zookeeper": 50 * MS}),
            ({100: 1 * MS, 101: 150 * MS}, {"zookeeper": 20 * MS})]   # a thread of 40 ms exited
    assert meter(rows, {"zookeeper": 7}).account()["zookeeper_per_compute"] == 0.0
