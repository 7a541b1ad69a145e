"""A convolution fused with the max pool and ReLU after it (kernels/conv.py,
conv2d_pool_forward/backward) against finite differences in float64, and bit for bit
against the three kernels it replaces, on the batch-minor and im2col paths."""
import numpy as np
import pytest

from streamnet import kernels as K

from .conv_reference import fd


@pytest.fixture
def rng():
    """Each test seeds its own generator: its data do not depend on which tests ran before."""
    return np.random.default_rng(2468)


def _three(x, w, b, stride, pad, k, s, relu):
    conv = K.conv2d_forward(x, w, b, stride, pad)
    pooled, arg = K.maxpool_forward(conv, k, s)
    return conv, (K.relu_forward(pooled) if relu else pooled), arg


# (c, size, kernel, stride, pad, pool k, pool s): LeNet-5's conv2 (batch-minor), an
# im2col layer with a 3/2 overlapping pool (AlexNet-224's), a strided one, no ReLU, and
# a Winograd layer (AlexNet's conv5: 3x3, stride 1, many channels)
CASES = [(6, 14, 5, 1, 0, 2, 2, True), (3, 11, 3, 1, 1, 3, 2, True), (2, 12, 5, 2, 2, 2, 2, True),
         (4, 9, 3, 1, 0, 2, 2, False), (30, 8, 3, 1, 1, 2, 2, True)]


@pytest.mark.parametrize("c,size,kern,stride,pad,k,s,relu", CASES)
def test_conv_pool_finite_differences(c, size, kern, stride, pad, k, s, relu, rng):
    x = rng.standard_normal((3, c, size, size))
    w = rng.standard_normal((5, c, kern, kern))
    b = rng.standard_normal(5)
    cols = np.empty(K.columns_size(x.shape, w.shape, stride, pad))
    out, arg, shape = K.conv2d_pool_forward(x, w, b, stride, pad, k, s, relu, cols)
    conv, ref, _ = _three(x, w, b, stride, pad, k, s, relu)
    assert shape == conv.shape
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.conv2d_pool_backward(r, out, arg, shape, x, w, dw, db, stride, pad, relu, True, cols)
    fwd = lambda x_, w_, b_: np.sum(r * K.conv2d_pool_forward(x_, w_, b_, stride, pad, k, s, relu,
                                                              np.empty(0))[0])
    for arr, grad, f in [(x, dx, lambda z: fwd(z, w, b)), (w, dw, lambda z: fwd(x, z, b)),
                         (b, db, lambda z: fwd(x, w, z))]:
        v = rng.standard_normal(arr.shape)
        numeric = fd(f, arr, v)
        assert abs(np.sum(grad * v) - numeric) <= 1e-6 * max(1.0, abs(numeric))


@pytest.mark.parametrize("c,size,kern,stride,pad,k,s,relu", CASES)
def test_conv_pool_equals_the_three_kernels_bit_for_bit(c, size, kern, stride, pad, k, s, relu, rng):
    x = rng.standard_normal((5, c, size, size)).astype(np.float32)
    x[0] = -np.abs(x[0])  # a sample whose windows ReLU cuts more often
    w = rng.standard_normal((7, c, kern, kern)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    cols = np.empty(K.columns_size(x.shape, w.shape, stride, pad), np.float32)
    out, arg, shape = K.conv2d_pool_forward(x, w, b, stride, pad, k, s, relu, cols)
    conv, ref, parg = _three(x, w, b, stride, pad, k, s, relu)
    np.testing.assert_array_equal(out, ref)
    r = rng.standard_normal(out.shape).astype(np.float32)
    dw1, db1, dw2, db2 = np.empty_like(w), np.empty_like(b), np.empty_like(w), np.empty_like(b)
    dconv = K.maxpool_backward(K.relu_backward(r, ref) if relu else r, parg, conv.shape)
    dx1 = K.conv2d_backward(dconv, x, w, dw1, db1, stride, pad, True)
    dx2 = K.conv2d_pool_backward(r, out, arg, shape, x, w, dw2, db2, stride, pad, relu, True, cols)
    np.testing.assert_array_equal(dw2, dw1)
    np.testing.assert_array_equal(db2, db1)
    np.testing.assert_array_equal(dx2, dx1)
