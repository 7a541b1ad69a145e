"""The batch-minor convolution (kernels/conv_minor.py: stride 1, a few input
channels) against a plain convolution, central finite differences in float64, and
the generic im2col path in float32, in one block and in several (the last partial)."""
import numpy as np
import pytest

from streamnet import kernels as K
from streamnet.kernels import conv_minor

from .conv_reference import check_gradients, reference


@pytest.fixture
def rng():
    return np.random.default_rng(2468)


def test_which_layers_take_the_path():
    assert conv_minor.use_minor(6, 5, 5, 1)  # LeNet-5 conv2
    assert not conv_minor.use_minor(1, 5, 5, 1)  # one channel: the direct path
    assert not conv_minor.use_minor(64, 5, 5, 1)  # many column rows: im2col
    assert not conv_minor.use_minor(6, 5, 5, 2)


# n past BLOCK: several blocks, the last one partial
@pytest.mark.parametrize("c,h,w,k,pad,n,o", [(3, 9, 9, 3, 1, 2, 3), (2, 8, 8, 5, 0, 3, 3),
                                             (4, 7, 9, 3, 2, 2, 3), (2, 7, 7, 5, 1, conv_minor.BLOCK + 3, 4),
                                             (3, 9, 8, 5, 2, 2 * conv_minor.BLOCK + 1, 7)])
def test_matches_plain_convolution_and_finite_differences(c, h, w, k, pad, n, o, rng):
    assert conv_minor.use_minor(c, k, k, 1)
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((o, c, k, k))
    b = rng.standard_normal(o)
    out = K.conv2d_forward(x, wt, b, 1, pad)
    np.testing.assert_allclose(out, reference(x, wt, b, pad), rtol=1e-12, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(wt), np.empty_like(b)
    dx = K.conv2d_backward(r, x, wt, dw, db, 1, pad, True)
    check_gradients(x, wt, b, pad, r, dx, dw, db, rng)
    dw2, db2 = np.empty_like(wt), np.empty_like(b)
    assert K.conv2d_backward(r, x, wt, dw2, db2, 1, pad, False).size == 0
    np.testing.assert_array_equal(dw2, dw)
    np.testing.assert_array_equal(db2, db)


def test_float32_batch_in_several_blocks_equals_generic_path(rng):
    """LeNet-5's conv2 in float32, 37 samples (blocks of 16, 16, 5), against the
    generic im2col path's columns."""
    n = 37
    x = rng.standard_normal((n, 6, 14, 14)).astype(np.float32)
    w = rng.standard_normal((16, 6, 5, 5)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    out = K.conv2d_forward(x, w, b, 1, 0)
    assert out.dtype == np.float32
    r = rng.standard_normal(out.shape).astype(np.float32)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.conv2d_backward(r, x, w, dw, db, 1, 0, True)
    col = np.empty((150, n * 100), np.float32)
    K.conv.im2col(x, 0, n, 5, 5, 1, 0, col)
    ref = (w.reshape(16, 150) @ col).reshape(16, n, 100).transpose(1, 0, 2).reshape(out.shape) + b[:, None, None]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    dy = r.transpose(1, 0, 2, 3).reshape(16, n * 100)
    np.testing.assert_allclose(dw.reshape(16, 150), dy @ col.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(db, r.astype(np.float64).sum((0, 2, 3)), rtol=1e-4, atol=1e-4)
    dx_ref = np.zeros_like(x)
    K.conv.col2im(w.reshape(16, 150).T @ dy, 0, n, 5, 5, 1, 0, dx_ref)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-4, atol=1e-4)


def test_empty_batch(rng):
    x = np.zeros((0, 6, 14, 14), np.float32)
    w = rng.standard_normal((16, 6, 5, 5)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    out = K.conv2d_forward(x, w, b, 1, 0)
    assert out.shape == (0, 16, 10, 10)
    dw, db = np.full_like(w, np.nan), np.full_like(b, np.nan)
    dx = K.conv2d_backward(out, x, w, dw, db, 1, 0, True)
    assert dx.shape == x.shape and not dw.any() and not db.any()
