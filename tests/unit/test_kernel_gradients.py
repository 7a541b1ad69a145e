"""Every kernel's backward pass against central finite differences, in float64.

The check is directional: for a random output weighting r and direction v,
d/de sum(r * f(x + e v)) at e = 0 must equal <backward(r), v>. The dense layer's, in
both of its arrangements: test_kernel_dense.py.
"""
import numpy as np
import pytest

from streamnet import kernels as K

rng = np.random.default_rng(1234)
EPS = 1e-6


@pytest.fixture(autouse=True)
def _fresh_rng():
    """Every test (and the helpers it calls) draws from a generator seeded afresh, so
    its data do not depend on which tests ran before it."""
    global rng
    rng = np.random.default_rng(1234)


def directional_fd(f, x, v):
    return (f(x + EPS * v) - f(x - EPS * v)) / (2 * EPS)


def assert_close(analytic, numeric, tol=1e-6):
    assert abs(analytic - numeric) <= tol * max(1.0, abs(numeric)), (analytic, numeric)


@pytest.mark.parametrize("stride,pad,k", [(1, 0, 3), (1, 2, 5), (2, 2, 5), (4, 1, 11)])
def test_conv2d(stride, pad, k):
    size = 23 if k == 11 else 9
    x = rng.standard_normal((2, 3, size, size))
    w = rng.standard_normal((4, 3, k, k))
    b = rng.standard_normal(4)
    out = K.conv2d_forward(x, w, b, stride, pad)
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.conv2d_backward(r, x, w, dw, db, stride, pad, True)
    for arr, grad, f in [
        (x, dx, lambda z: np.sum(r * K.conv2d_forward(z, w, b, stride, pad))),
        (w, dw, lambda z: np.sum(r * K.conv2d_forward(x, z, b, stride, pad))),
        (b, db, lambda z: np.sum(r * K.conv2d_forward(x, w, z, stride, pad))),
    ]:
        v = rng.standard_normal(arr.shape)
        assert_close(np.sum(grad * v), directional_fd(f, arr, v))


def test_conv2d_matches_direct_convolution():
    x = rng.standard_normal((2, 2, 6, 7))
    w = rng.standard_normal((3, 2, 3, 3))
    b = rng.standard_normal(3)
    out = K.conv2d_forward(x, w, b, 2, 1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros_like(out)
    for i in range(out.shape[2]):
        for j in range(out.shape[3]):
            patch = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
            ref[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w) + b
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_conv2d_chunks_agree_with_one_chunk(monkeypatch):
    """A batch large enough to be cut into several chunks gives the same result as
    the same samples one at a time."""
    x = rng.standard_normal((40, 16, 12, 12)).astype(np.float32)  # 144*144*40 > COL_BUDGET
    w = rng.standard_normal((8, 16, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    assert K.conv.chunk_size(40, 16 * 9, 144) < 40
    out = K.conv2d_forward(x, w, b, 1, 1)
    r = rng.standard_normal(out.shape).astype(np.float32)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.conv2d_backward(r, x, w, dw, db, 1, 1, True)
    dw_ref, dx_ref = np.zeros_like(w, dtype=np.float64), []
    for i in range(40):
        np.testing.assert_allclose(out[i:i + 1], K.conv2d_forward(x[i:i + 1], w, b, 1, 1), rtol=1e-5, atol=1e-5)
        dwi, dbi = np.empty_like(w), np.empty_like(b)
        dx_ref.append(K.conv2d_backward(r[i:i + 1], x[i:i + 1], w, dwi, dbi, 1, 1, True))
        dw_ref += dwi
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(dx, np.concatenate(dx_ref), rtol=1e-5, atol=1e-5)


def test_conv2d_backward_without_dx_still_fills_weights():
    x = rng.standard_normal((2, 1, 8, 8))
    w = rng.standard_normal((2, 1, 3, 3))
    b = np.zeros(2)
    out = K.conv2d_forward(x, w, b, 1, 1)
    dw1, db1, dw2, db2 = (np.empty_like(w), np.empty_like(b), np.empty_like(w), np.empty_like(b))
    K.conv2d_backward(np.ones_like(out), x, w, dw1, db1, 1, 1, True)
    dx = K.conv2d_backward(np.ones_like(out), x, w, dw2, db2, 1, 1, False)
    assert dx.size == 0
    np.testing.assert_array_equal(dw1, dw2)
    np.testing.assert_array_equal(db1, db2)


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (3, 3)])
def test_maxpool(k, s):
    x = rng.standard_normal((2, 3, 9, 9))
    out, arg = K.maxpool_forward(x, k, s)
    r = rng.standard_normal(out.shape)
    dx = K.maxpool_backward(r, arg, x.shape)
    v = rng.standard_normal(x.shape)
    assert_close(np.sum(dx * v), directional_fd(lambda z: np.sum(r * K.maxpool_forward(z, k, s)[0]), x, v))


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2)])
def test_avgpool(k, s):
    x = rng.standard_normal((2, 3, 9, 9))
    out = K.avgpool_forward(x, k, s)
    r = rng.standard_normal(out.shape)
    dx = K.avgpool_backward(r, x.shape, k, s)
    v = rng.standard_normal(x.shape)
    assert_close(np.sum(dx * v), directional_fd(lambda z: np.sum(r * K.avgpool_forward(z, k, s)), x, v))


@pytest.mark.parametrize("fwd,bwd", [(K.relu_forward, K.relu_backward),
                                     (K.tanh_forward, K.tanh_backward),
                                     (K.sigmoid_forward, K.sigmoid_backward)])
def test_activations(fwd, bwd):
    x = rng.standard_normal((4, 3, 5, 5)) * 3
    out = fwd(x)
    r = rng.standard_normal(out.shape)
    dx = bwd(r, out)
    v = rng.standard_normal(x.shape)
    assert_close(np.sum(dx * v), directional_fd(lambda z: np.sum(r * fwd(z)), x, v))


def test_sigmoid_is_stable_for_large_inputs():
    out = K.sigmoid_forward(np.array([-1000.0, 0.0, 1000.0], dtype=np.float32))
    np.testing.assert_allclose(out, [0.0, 0.5, 1.0])


@pytest.mark.parametrize("size", [5, 4])
def test_lrn(size):
    x = rng.standard_normal((2, 7, 4, 4)) * 2
    alpha, beta, k = 0.1, 0.75, 2.0  # alpha large enough that the cross terms matter
    out, scale = K.lrn_forward(x, size, alpha, beta, k)
    r = rng.standard_normal(out.shape)
    dx = K.lrn_backward(r, x, scale, size, alpha, beta)
    v = rng.standard_normal(x.shape)
    f = lambda z: np.sum(r * K.lrn_forward(z, size, alpha, beta, k)[0])
    assert_close(np.sum(dx * v), directional_fd(f, x, v))


def test_dropout_is_seeded_and_unbiased():
    x = np.ones((100, 1000), dtype=np.float32)
    a, mask_a = K.dropout_forward(x, 0.3, 7)
    b, mask_b = K.dropout_forward(x, 0.3, 7)
    c, _ = K.dropout_forward(x, 0.3, 8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert abs((mask_a == 0).mean() - 0.3) < 0.01
    assert abs(a.mean() - 1.0) < 0.02
    r = rng.standard_normal(x.shape).astype(np.float32)
    np.testing.assert_array_equal(K.dropout_backward(r, mask_a), r * mask_a)


def test_softmax_cross_entropy():
    logits = rng.standard_normal((6, 10)) * 4
    labels = rng.integers(0, 10, 6)
    loss, d = K.softmax_cross_entropy(logits, labels)
    z = logits - logits.max(1, keepdims=True)
    ref = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(6), labels])
    assert abs(loss - ref) < 1e-12
    v = rng.standard_normal(logits.shape)
    assert_close(np.sum(d * v), directional_fd(lambda q: K.softmax_cross_entropy(q, labels)[0], logits, v))


def test_softmax_cross_entropy_huge_logits_stay_finite():
    logits = np.array([[1e4, -1e4, 0.0]], dtype=np.float32)
    loss, d = K.softmax_cross_entropy(logits, np.array([1]))
    assert np.isfinite(loss) and np.all(np.isfinite(d))


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_step_matches_reference(nesterov):
    p = rng.standard_normal(50).astype(np.float32)
    v = np.zeros_like(p)
    pr, vr = p.astype(np.float64), np.zeros(50)
    lr, mu, wd = 0.1, 0.9, 1e-3
    for _ in range(3):
        g = rng.standard_normal(50).astype(np.float32)
        K.sgd_step(p, g, v, lr, mu, wd, nesterov)
        gg = g + wd * pr
        vr = mu * vr + gg
        pr -= lr * (gg + mu * vr if nesterov else vr)
    np.testing.assert_allclose(p, pr, rtol=1e-5, atol=1e-6)


def test_sgd_without_momentum_ignores_velocity():
    p = np.ones(4, np.float32)
    K.sgd_step(p, np.full(4, 2.0, np.float32), np.empty(0, np.float32), 0.5, 0.0, 0.0, False)
    np.testing.assert_array_equal(p, np.zeros(4))


def test_weighted_average():
    vecs = rng.standard_normal((3, 20)).astype(np.float32)
    w = np.array([1.0, 2.0, 5.0])
    out = np.empty(20, np.float32)
    K.weighted_average(out, vecs, w)
    np.testing.assert_allclose(out, (w[:, None] * vecs).sum(0) / w.sum(), rtol=1e-6)


def test_weighted_average_sums_each_entry_in_float64_in_unit_order_across_blocks():
    """Blocked, yet each entry is (w0*v0 + w1*v1 + ...) / sum(w) in float64, in that
    order: equal, bit for bit, to that formula on a vector several blocks long."""
    from streamnet.kernels.optim import SUM_BLOCK
    n = 3 * SUM_BLOCK + 17
    vecs = rng.standard_normal((3, n)).astype(np.float32)
    w = np.array([256.0, 200.0, 7.0])
    out = np.empty(n, np.float32)
    K.weighted_average(out, vecs, w)
    acc = np.zeros(n, np.float64)
    for j in range(3):
        acc += w[j] * vecs[j].astype(np.float64)
    np.testing.assert_array_equal(out, (acc / w.sum()).astype(np.float32))


def test_all_finite():
    assert K.all_finite(np.ones(5, np.float32))
    assert not K.all_finite(np.array([1.0, np.nan], np.float32))
    assert not K.all_finite(np.array([np.inf], np.float32))
    assert K.all_finite(np.empty(0, np.float32))
    from streamnet.kernels.optim import SUM_BLOCK
    for where in (0, SUM_BLOCK - 1, SUM_BLOCK, 5 * SUM_BLOCK + 3):     # in any block, at its edges
        for bad in (np.nan, np.inf, -np.inf):
            x = np.ones(5 * SUM_BLOCK + 4, np.float32)
            x[where] = bad
            assert not K.all_finite(x), (where, bad)
    assert K.all_finite(np.full(5 * SUM_BLOCK + 4, np.finfo(np.float32).max, np.float32))
