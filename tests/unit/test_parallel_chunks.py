"""ParallelStep's chunks: which thread runs a chunk never changes the result, and a
pool thread that gets no core in time does not hold the step."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from streamnet import nn
from streamnet.nn.parallel import MIN_CHUNK, ParallelStep


def _batch(model, n, seed=0):
    rng = np.random.default_rng(seed)
    size = model.input_shape[1]
    return rng.standard_normal((n, 1, size, size)).astype(np.float32), rng.integers(0, 10, n)


def _in_a_thread(fn, timeout: float):
    """fn() on a thread of its own (not the pool's), joined within `timeout`: its result,
    or what it raised, raised here."""
    result, error = [], []

    def run():
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            error.append(e)
    runner = threading.Thread(target=run)
    runner.start()
    runner.join(timeout)
    assert not runner.is_alive(), "the step waited for a pool thread that never started"
    if error:
        raise error[0]
    return result[0]


def test_a_small_model_takes_chunks_of_at_least_min_chunk_samples():
    with ParallelStep(nn.lenet5(seed=1), 2) as step:
        assert step.small
        assert MIN_CHUNK == 32
        assert step.chunks(128) == [(0, 32), (32, 64), (64, 96), (96, 128)]
        assert step.chunks(64) == [(0, 32), (32, 64)]          # 2 chunks of 32, not 4 of 16
        assert step.chunks(3) == [(0, 2), (2, 3)]              # one per thread at least
        assert all(hi - lo >= MIN_CHUNK for lo, hi in step.chunks(96)) and len(step.chunks(96)) == 3


def test_a_big_model_takes_one_chunk_per_thread():
    with ParallelStep(nn.alexnet(64, dropout=0.0, seed=1), 2) as step:
        assert not step.small
        assert step.chunks(64) == [(0, 32), (32, 64)]


def test_the_calling_thread_alone_gives_the_same_bits_and_a_late_pool_task_is_cancelled():
    model = nn.lenet5(seed=2)
    x, y = _batch(model, 64)
    with ParallelStep(model, 2) as step:
        ref_loss, g = step.loss_and_grad(x, y)
        ref = g.copy()
    release = threading.Event()
    pool = ThreadPoolExecutor(1)
    try:
        blocker = pool.submit(release.wait)              # the pool's one thread is busy
        with ParallelStep(model, 2, executor=pool) as step:
            got = _in_a_thread(lambda: [(loss, g.copy()) for loss, g in (step.loss_and_grad(x, y) for _ in range(2))],
                               60)                       # without the pool thread
        assert not blocker.done()
        assert len(got) == 2
        for loss, g in got:
            assert loss == ref_loss
            np.testing.assert_array_equal(g, ref)        # chunk c fills row c, whoever runs it
    finally:
        release.set()
        pool.shutdown(wait=True)


def test_more_chunks_per_thread_equal_one_thread():
    model = nn.lenet5(seed=3)
    x, y = _batch(model, 6 * MIN_CHUNK)
    g1 = model.loss_and_grad(x, y)[1].copy()
    with ParallelStep(model, 2, chunks_per_thread=3) as step:
        assert len(step.chunks(6 * MIN_CHUNK)) == 6
        g = step.loss_and_grad(x, y)[1]
    np.testing.assert_allclose(g, g1, rtol=0, atol=1e-5 * np.abs(g1).max())
    with pytest.raises(ValueError, match="chunks_per_thread"):
        ParallelStep(model, 2, chunks_per_thread=0)


def test_a_big_model_sums_every_slice_when_its_pool_thread_never_starts():
    model = nn.alexnet(64, dropout=0.0, seed=4)
    x, y = _batch(model, 32)
    with ParallelStep(model, 2) as step:
        ref = step.loss_and_grad(x, y)[1].copy()
    release = threading.Event()
    pool = ThreadPoolExecutor(1)
    try:
        pool.submit(release.wait)
        with ParallelStep(model, 2, executor=pool) as step:
            assert len(step._slices) == 2                # the sum is cut in slices
            g = _in_a_thread(lambda: step.loss_and_grad(x, y)[1].copy(), 120)
        np.testing.assert_array_equal(g, ref)
    finally:
        release.set()
        pool.shutdown(wait=True)
