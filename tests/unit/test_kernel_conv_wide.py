"""The direct one-channel convolution (kernels/conv_wide.py) against central finite
differences in float64, and against a plain convolution."""
import numpy as np
import pytest

from streamnet import kernels as K
from streamnet.kernels import conv_wide

from .conv_reference import check_gradients, fd, reference


@pytest.fixture
def rng():
    """Each test seeds its own generator: its data do not depend on which tests ran before."""
    return np.random.default_rng(4321)


@pytest.mark.parametrize("size,k,pad,o", [(9, 5, 2, 4), (7, 3, 0, 4), (8, 5, 0, 6), (8, 5, 1, 5),
                                           (6, 3, 1, 4)])
def test_wide_path_is_used_and_matches_plain_convolution(size, k, pad, o, rng):
    assert conv_wide.use_wide(1, 1) and not conv_wide.use_wide(2, 1) and not conv_wide.use_wide(1, 2)
    x = rng.standard_normal((3, 1, size, size))
    w = rng.standard_normal((o, 1, k, k))
    b = rng.standard_normal(o)
    np.testing.assert_allclose(K.conv2d_forward(x, w, b, 1, pad), reference(x, w, b, pad), rtol=1e-12, atol=1e-12)


# o: 3 and 6 run the three-channel 5-wide kernels only, 4 and 7 also the one-channel ones
@pytest.mark.parametrize("size,k,pad,o", [(9, 5, 2, 3), (8, 5, 1, 7), (7, 5, 0, 4), (7, 3, 0, 3),
                                           (6, 3, 1, 6)])
def test_wide_gradients_finite_differences(size, k, pad, o, rng):
    x = rng.standard_normal((2, 1, size, size))
    w = rng.standard_normal((o, 1, k, k))
    b = rng.standard_normal(o)
    out = K.conv2d_forward(x, w, b, 1, pad)
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.conv2d_backward(r, x, w, dw, db, 1, pad, True)
    check_gradients(x, w, b, pad, r, dx, dw, db, rng)


def test_wide_float32_weight_gradient_without_dx(rng):
    x = rng.standard_normal((16, 1, 28, 28)).astype(np.float32)
    w = rng.standard_normal((6, 1, 5, 5)).astype(np.float32)
    b = np.zeros(6, np.float32)
    r = rng.standard_normal((16, 6, 28, 28)).astype(np.float32)
    dw, db = np.empty_like(w), np.empty_like(b)
    assert K.conv2d_backward(r, x, w, dw, db, 1, 2, False).size == 0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (2, 2), (2, 2)))
    ref = np.empty((6, 1, 5, 5))
    for i in range(5):
        for j in range(5):
            ref[:, 0, i, j] = np.einsum("nhw,nohw->o", xp[:, 0, i:i + 28, j:j + 28], r)
    np.testing.assert_allclose(dw, ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(db, r.astype(np.float64).sum((0, 2, 3)), rtol=1e-4)
    assert dw.dtype == np.float32


# the last: AlexNet-64's conv1, whose kept columns stay in several chunks (kept_chunk);
# no 3x3 stride 1 with many channels: that is the Winograd path (test_kernel_conv_winograd.py)
@pytest.mark.parametrize("stride,pad,k,c,size", [(2, 1, 3, 40, 12), (2, 2, 5, 1, 12), (1, 2, 5, 16, 12),
                                                 (2, 2, 5, 1, 64)])
def test_kept_columns_give_the_same_gradients(stride, pad, k, c, size, rng):
    """conv2d_forward_keep / conv2d_backward_kept (columns kept from the forward
    pass, the batch as one chunk where chunks would be narrow) equal the plain pair,
    on the im2col path, in several chunks: to rounding, as their GEMMs sum over
    other blocks."""
    x = rng.standard_normal((9, c, size, size))
    w = rng.standard_normal((5, c, k, k))
    b = rng.standard_normal(5)
    need = K.columns_size(x.shape, w.shape, stride, pad)
    oh = (size + 2 * pad - k) // stride + 1
    assert need > 0 and (c == 1 or K.conv.chunk_size(9, c * k * k, oh * oh) < 9)  # several chunks
    if size == 64:
        assert 1 < K.conv.kept_chunk(9, c * k * k, oh * oh) < 9
    cols = np.full(need, np.nan)
    out = K.conv2d_forward_keep(x, w, b, stride, pad, cols)
    np.testing.assert_allclose(out, K.conv2d_forward(x, w, b, stride, pad), rtol=1e-12, atol=1e-10)
    r = rng.standard_normal(out.shape)
    dw1, db1, dw2, db2 = np.empty_like(w), np.empty_like(b), np.empty_like(w), np.empty_like(b)
    dx1 = K.conv2d_backward(r, x, w, dw1, db1, stride, pad, True)
    dx2 = K.conv2d_backward_kept(r, x, w, dw2, db2, stride, pad, True, cols)
    np.testing.assert_allclose(dw2, dw1, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(db2, db1, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(dx2, dx1, rtol=1e-12, atol=1e-10)
    v = rng.standard_normal(w.shape)
    f = lambda z: np.sum(r * K.conv2d_forward(x, z, b, stride, pad))
    numeric = fd(f, w, v)
    assert abs(np.sum(dw2 * v) - numeric) <= 1e-6 * max(1.0, abs(numeric))


def test_wide_layers_keep_no_columns():
    assert K.columns_size((4, 1, 28, 28), (6, 1, 5, 5), 1, 2) == 0
    assert K.columns_size((4, 6, 14, 14), (16, 6, 5, 5), 1, 0) == 0
    assert K.columns_size((4, 1, 64, 64), (64, 1, 5, 5), 2, 2) == 25 * 4 * 32 * 32  # im2col (AlexNet-64 conv1)


def _pooled_reference(x, w, b, pad, relu):
    """relu(maxpool2x2(conv(x))) with NumPy: the three layers wide_pool_forward fuses."""
    out = reference(x, w, b, pad)
    n, o, oh, ow = out.shape
    ph, pw = oh // 2, ow // 2
    pooled = out[:, :, :2 * ph, :2 * pw].reshape(n, o, ph, 2, pw, 2).max(axis=(3, 5))
    return np.maximum(pooled, 0.0) if relu else pooled


# odd output sizes (7x7 from 9, pad 1, k 3) drop the last row and column, as PyTorch's floor mode
@pytest.mark.parametrize("size,k,pad,o,relu", [(9, 5, 2, 3, True), (8, 5, 2, 7, False), (9, 3, 0, 4, True),
                                                (10, 5, 1, 6, True)])
def test_wide_pool_forward_and_finite_differences(size, k, pad, o, relu, rng):
    x = rng.standard_normal((2, 1, size, size))
    w = rng.standard_normal((o, 1, k, k))
    b = rng.standard_normal(o)
    assert K.use_wide_pool(1, 1, 2, 2) and not K.use_wide_pool(1, 1, 3, 2) and not K.use_wide_pool(2, 1, 2, 2)
    out, arg = K.wide_pool_forward(x, w, b, pad, relu)
    np.testing.assert_allclose(out, _pooled_reference(x, w, b, pad, relu), rtol=1e-12, atol=1e-12)
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(w), np.empty_like(b)
    dx = K.wide_pool_backward(r, out, arg, x, w, dw, db, pad, relu, True)
    for arr, grad, f in [
        (x, dx, lambda z: np.sum(r * K.wide_pool_forward(z, w, b, pad, relu)[0])),
        (w, dw, lambda z: np.sum(r * K.wide_pool_forward(x, z, b, pad, relu)[0])),
        (b, db, lambda z: np.sum(r * K.wide_pool_forward(x, w, z, pad, relu)[0])),
    ]:
        v = rng.standard_normal(arr.shape)
        numeric = fd(f, arr, v)
        assert abs(np.sum(grad * v) - numeric) <= 1e-6 * max(1.0, abs(numeric))
    dw2, db2 = np.empty_like(w), np.empty_like(b)
    assert K.wide_pool_backward(r, out, arg, x, w, dw2, db2, pad, relu, False).size == 0
    np.testing.assert_array_equal(dw2, dw)
    np.testing.assert_array_equal(db2, db)


def test_wide_pool_equals_the_three_kernels_bit_for_bit(rng):
    """float32, LeNet-5's conv1 shapes: conv2d_forward -> maxpool -> relu and back."""
    x = rng.standard_normal((5, 1, 28, 28)).astype(np.float32)
    x[0, 0, :6, :6] = -3.0  # windows where ReLU cuts everything
    w = rng.standard_normal((6, 1, 5, 5)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    conv = K.conv2d_forward(x, w, b, 1, 2)
    pooled, parg = K.maxpool_forward(conv, 2, 2)
    act = K.relu_forward(pooled)
    out, arg = K.wide_pool_forward(x, w, b, 2, True)
    np.testing.assert_array_equal(out, act)
    r = rng.standard_normal(out.shape).astype(np.float32)
    dw1, db1, dw2, db2 = np.empty_like(w), np.empty_like(b), np.empty_like(w), np.empty_like(b)
    dconv = K.maxpool_backward(K.relu_backward(r, act), parg, conv.shape)
    dx1 = K.conv2d_backward(dconv, x, w, dw1, db1, 1, 2, True)
    dx2 = K.wide_pool_backward(r, out, arg, x, w, dw2, db2, 2, True, True)
    np.testing.assert_array_equal(dw2, dw1)
    np.testing.assert_array_equal(db2, db1)
    np.testing.assert_array_equal(dx2, dx1)
