"""The dense layer's two GEMM arrangements (plain for small weights, transposed
for big ones, kernels/dense.py) against finite differences in float64."""
import numpy as np
import pytest

from streamnet import kernels as K
from streamnet.kernels import dense


@pytest.fixture
def rng():
    """Each test seeds its own generator: its data do not depend on which tests ran before."""
    return np.random.default_rng(99)


EPS = 1e-6


@pytest.mark.parametrize("fin,fout", [(7, 3), (600, dense.TALL // 600 + 1)])
def test_dense_gradients_both_arrangements(fin, fout, rng):
    x = rng.standard_normal((5, fin))
    w = rng.standard_normal((fout, fin)) / np.sqrt(fin)
    b = rng.standard_normal(fout)
    out = K.dense_forward(x, w, b)
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-12, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.dense_backward(r, x, w, dw, db, True)
    np.testing.assert_allclose(dw, r.T @ x, rtol=1e-12, atol=1e-12)
    for arr, grad, f in [
        (x, dx, lambda z: np.sum(r * K.dense_forward(z, w, b))),
        (w, dw, lambda z: np.sum(r * K.dense_forward(x, z, b))),
        (b, db, lambda z: np.sum(r * K.dense_forward(x, w, z))),
    ]:
        v = rng.standard_normal(arr.shape)
        numeric = (f(arr + EPS * v) - f(arr - EPS * v)) / (2 * EPS)
        assert abs(np.sum(grad * v) - numeric) <= 1e-6 * max(1.0, abs(numeric))
    assert dx.flags.c_contiguous


@pytest.mark.parametrize("fin,fout", [(7, 3), (600, dense.TALL // 600 + 1)])
def test_dense_relu_is_relu_of_dense_and_its_gradients_hold(fin, fout, rng):
    x = rng.standard_normal((6, fin))
    w = rng.standard_normal((fout, fin)) / np.sqrt(fin)
    b = rng.standard_normal(fout)
    out = K.dense_relu_forward(x, w, b)
    np.testing.assert_array_equal(out, K.relu_forward(K.dense_forward(x, w, b)))
    assert (out == 0).any() and (out > 0).any()       # both sides of the ReLU are exercised
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.dense_relu_backward(r, out, x, w, dw, db, True)
    for arr, grad, f in [
        (x, dx, lambda z: np.sum(r * K.dense_relu_forward(z, w, b))),
        (w, dw, lambda z: np.sum(r * K.dense_relu_forward(x, z, b))),
        (b, db, lambda z: np.sum(r * K.dense_relu_forward(x, w, z))),
    ]:
        v = rng.standard_normal(arr.shape)
        numeric = (f(arr + EPS * v) - f(arr - EPS * v)) / (2 * EPS)
        assert abs(np.sum(grad * v) - numeric) <= 1e-6 * max(1.0, abs(numeric))
    dw2, db2 = np.empty_like(w), np.empty_like(b)
    assert K.dense_relu_backward(r, out, x, w, dw2, db2, False).size == 0
    np.testing.assert_array_equal(dw2, dw)
