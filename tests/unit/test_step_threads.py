"""A unit's step on several threads (issue 11): the in-process trainer gives each unit
the threads left over after one per unit, and the result equals the one-thread run to
float32 rounding; the engine hands a task its share of the worker's compute threads."""
from dataclasses import replace

import numpy as np

from streamnet.examples import wordcount
from streamnet.runtime.dataplane.topology_runtime import TopologyRuntime
from streamnet.training import DataConfig, lenet5_mixbp, train_local
from streamnet.training.bp import ComputeUnit, plan_for
from streamnet.nn import ParallelStep, lenet5


def _cfg(threads):
    cfg = lenet5_mixbp(units=1, epochs=1, data=DataConfig(dataset="synthetic", train_limit=512, test_limit=64))
    # batch 64: big enough that the step is split (bp.MIN_SPLIT_WORK)
    return replace(cfg, threads=threads, seed=4, algorithm=replace(cfg.algorithm, batch=64))


def test_in_process_with_two_threads_for_one_unit_equals_one_thread(monkeypatch):
    calls = []
    real = ParallelStep.loss_and_grad
    monkeypatch.setattr(ParallelStep, "loss_and_grad", lambda self, x, y: calls.append(len(y)) or real(self, x, y))
    one = train_local(_cfg(1))
    assert not calls
    two = train_local(_cfg(2))
    assert calls and set(calls) == {64}           # the 2-thread run did split its steps
    np.testing.assert_allclose(two.params, one.params, rtol=1e-4, atol=1e-6)


def test_a_small_step_stays_on_one_thread():
    unit = ComputeUnit(0, lenet5(), plan_for(_cfg(1).algorithm), threads=2)
    try:
        calls = []
        unit._step.loss_and_grad = lambda x, y: calls.append(len(y))
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((8, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 8)
        unit.run_round([(x, y)])
        assert calls == []                           # 8 x 62k parameters: not worth a second thread
    finally:
        unit.close()


def test_compute_unit_changes_its_step_threads_live():
    cfg = _cfg(1)
    unit = ComputeUnit(0, lenet5(), plan_for(cfg.algorithm), threads=2)
    try:
        assert unit.threads == 2
        unit.set_threads(1)
        assert unit.threads == 1
        unit.set_threads(3)
        assert unit.threads == 3
    finally:
        unit.close()
    assert unit.threads == 1


class _Ex:
    def __init__(self, cid):
        self.cid = cid


class _Pool:
    size = 4


class _Worker:
    id = "w0"
    pool = _Pool()


def test_a_task_gets_its_share_of_the_worker_threads():
    rt = TopologyRuntime(_Worker(), "wc", wordcount.topology().to_dict())
    rt.executors = {1: _Ex("compute"), 2: _Ex("compute"), 3: _Ex("sync")}
    assert rt.compute_share("compute") == 2
    assert rt.compute_share("sync") == 4
    rt.executors = {i: _Ex("compute") for i in range(6)}
    assert rt.compute_share("compute") == 1
