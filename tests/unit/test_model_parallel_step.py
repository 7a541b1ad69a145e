"""One step split across threads equals the one-thread step (1e-5 relative), run
after run, whatever order the threads finish in."""
import numpy as np
import pytest

from streamnet import kernels as K
from streamnet import nn
from streamnet.kernels.optim import SUM_BLOCK
from streamnet.nn.parallel import ParallelStep, shard_bounds


def _batch(model, n, seed=0):
    rng = np.random.default_rng(seed)
    size = model.input_shape[1]
    return rng.standard_normal((n, 1, size, size)).astype(np.float32), rng.integers(0, 10, n)


def _assert_rel(a, b, tol):
    scale = np.max(np.abs(b))
    assert np.max(np.abs(a - b)) <= tol * scale, np.max(np.abs(a - b)) / scale


def test_shard_bounds_cover_the_batch_in_order():
    assert shard_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert shard_bounds(3, 4) == [(0, 1), (1, 2), (2, 3)]
    assert shard_bounds(5, 1) == [(0, 5)]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_weighted_sum_rows_is_the_float64_sum_in_row_order(k):
    # ranges that start and end inside a block and span several blocks
    rng = np.random.default_rng(k)
    p = 3 * SUM_BLOCK + 17
    rows = rng.standard_normal((k, p)).astype(np.float32)
    weights = rng.random(k)
    out = np.full(p, 7.0, dtype=np.float32)
    lo, hi = 5, p - 3
    K.weighted_sum_rows(out, rows, weights, lo, hi)
    want = np.zeros(p)
    for j in range(k):  # the same order as the kernel: bit-identical
        want += weights[j] * rows[j].astype(np.float64)
    assert np.array_equal(out[lo:hi], want[lo:hi].astype(np.float32))
    assert (out[:lo] == 7.0).all() and (out[hi:] == 7.0).all()


@pytest.mark.parametrize("build,n", [(lambda: nn.lenet5(seed=3), 37),
                                     (lambda: nn.lenet5(activation="tanh", pool="avg", seed=3), 16),
                                     (lambda: nn.alexnet(64, dropout=0.5, lrn=True, seed=3), 6)])
def test_two_and_four_threads_equal_one(build, n):
    model = build()
    x, y = _batch(model, n)
    start = model.random_state()
    loss1, g1 = model.loss_and_grad(x, y)
    g1 = g1.copy()
    after_one = model.random_state()
    for threads in (2, 4):
        with ParallelStep(model, threads) as step:
            for _ in range(3):  # run after run: no state leaks between steps
                model.set_random_state(start)  # dropout draws the same masks
                loss, g = step.loss_and_grad(x, y)
                assert g is model.grads
                assert abs(loss - loss1) <= 1e-5 * abs(loss1)
                _assert_rel(g, g1, 1e-5)
                assert model.random_state() == after_one


def test_result_does_not_depend_on_timing():
    """Bit-identical across runs: the reduction order is fixed, not arrival order."""
    model = nn.lenet5(seed=4)
    x, y = _batch(model, 64, seed=1)
    with ParallelStep(model, 4) as step:
        ref = step.loss_and_grad(x, y)[1].copy()
        for _ in range(5):
            np.testing.assert_array_equal(step.loss_and_grad(x, y)[1], ref)


def test_parameters_are_shared_not_copied():
    model = nn.lenet5(seed=5)
    x, y = _batch(model, 8)
    with ParallelStep(model, 2) as step:
        g_before = step.loss_and_grad(x, y)[1].copy()
        model.params *= 0.5  # an optimiser step, in place
        g_after = step.loss_and_grad(x, y)[1].copy()
    assert not np.allclose(g_before, g_after)
    _assert_rel(g_after, model.loss_and_grad(x, y)[1].copy(), 1e-5)


def test_model_threads_argument_and_small_batches():
    model = nn.lenet5(seed=6)
    x, y = _batch(model, 3)
    g1 = model.loss_and_grad(x, y)[1].copy()
    _assert_rel(model.loss_and_grad(x, y, threads=4)[1], g1, 1e-5)  # 3 samples, 4 threads
    with pytest.raises(ValueError, match="labels must lie in"):
        model.loss_and_grad(x, np.array([0, 1, 10]), threads=2)


def test_dropout_shard_masks_are_the_batch_mask():
    from streamnet import kernels as K
    x = np.ones((6, 40), np.float32)
    whole, _ = K.dropout_forward(x, 0.5, 9)
    a, _ = K.dropout_forward(x[:2], 0.5, 9, 0)
    b, _ = K.dropout_forward(x[2:], 0.5, 9, 2 * 40)
    np.testing.assert_array_equal(np.concatenate([a, b]), whole)


def test_a_failing_shard_raises_its_own_error_and_the_step_recovers():
    model = nn.lenet5(seed=9)
    x, y = _batch(model, 8)
    with ParallelStep(model, 2) as step:
        ref = step.loss_and_grad(x, y)[1].copy()
        bad = step._replicas[1]
        bad._loss_and_grad = lambda *a: (_ for _ in ()).throw(FloatingPointError("shard 1"))
        with pytest.raises(FloatingPointError, match="shard 1"):
            step.loss_and_grad(x, y)
        del bad._loss_and_grad  # the class's method again
        np.testing.assert_array_equal(step.loss_and_grad(x, y)[1], ref)


def _until(cond, seconds=10.0):
    import time
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_threads_wait_between_steps_then_leave_and_come_back():
    """Threads 1..T-1 stay for the next step a moment, go back to their pool when none
    comes, and the next step brings them again: the same gradient every time."""
    model = nn.lenet5(seed=10)
    x, y = _batch(model, 64)
    with ParallelStep(model, 2) as step:
        ref = step.loss_and_grad(x, y)[1].copy()
        for _ in range(3):
            np.testing.assert_array_equal(step.loss_and_grad(x, y)[1], ref)   # back to back
        _until(lambda: not any(step._alive))                                  # none came: they left
        np.testing.assert_array_equal(step.loss_and_grad(x, y)[1], ref)


def test_a_step_does_not_wait_for_a_thread_that_never_starts():
    """The pool's only thread is busy elsewhere: the calling thread runs every chunk,
    and the task that comes late takes nothing and leaves."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    model = nn.lenet5(seed=11)
    x, y = _batch(model, 64)
    ref = model.loss_and_grad(x, y)[1].copy()
    pool = ThreadPoolExecutor(1)
    release = threading.Event()
    blocker = pool.submit(release.wait, 30)
    try:
        with ParallelStep(model, 2, executor=pool) as step:
            _assert_rel(step.loss_and_grad(x, y)[1].copy(), ref, 1e-5)
            assert step._alive[1]                      # submitted, not started
            release.set()
            blocker.result(timeout=30)
            _until(lambda: not step._alive[1])         # it ran, found no work, and left
            _assert_rel(step.loss_and_grad(x, y)[1].copy(), ref, 1e-5)
    finally:
        release.set()
        pool.shutdown(wait=True)


def test_close_sends_the_waiting_threads_away():
    model = nn.lenet5(seed=12)
    x, y = _batch(model, 64)
    step = ParallelStep(model, 2)
    try:
        step.loss_and_grad(x, y)
        threads = list(step._pool._threads)
    finally:
        step.close()
    assert not any(step._alive) and not any(t.is_alive() for t in threads)
