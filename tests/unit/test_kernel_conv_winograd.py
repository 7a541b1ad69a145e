"""The Winograd F(2x2, 3x3) and F(2x2, 5x5) convolutions (kernels/conv_winograd.py:
3x3 or 5x5, stride 1, more input channels than the batch-minor path takes) against a
plain convolution and central finite differences in float64, with the transformed
input kept from the forward pass and rebuilt, on even and odd output sizes and every
padding they take; and against the im2col path in float32."""
import numpy as np
import pytest

from streamnet import kernels as K
from streamnet.kernels import conv, conv_minor, conv_winograd

from .conv_reference import check_gradients, reference

C = 30  # past the batch-minor path for either kernel size (30 * 9 > MINOR_MAX_ROWS)


@pytest.fixture
def rng():
    return np.random.default_rng(1357)


def test_which_layers_take_the_path():
    assert not conv_minor.use_minor(C, 3, 3, 1)
    assert conv_winograd.use_winograd(3, 3, 1, 1)  # AlexNet's conv3-5
    assert conv_winograd.use_winograd(5, 5, 1, 2)  # AlexNet's conv2
    assert not conv_winograd.use_winograd(3, 3, 2, 1)
    assert not conv_winograd.use_winograd(5, 5, 2, 2)
    assert not conv_winograd.use_winograd(3, 5, 1, 1)
    assert not conv_winograd.use_winograd(7, 7, 1, 3)
    assert not conv_winograd.use_winograd(3, 3, 1, 3)  # padding as wide as the kernel: im2col takes it
    assert not conv_winograd.use_winograd(5, 5, 1, 5)
    for r, pad in [(3, 1), (5, 2)]:
        x_shape, w_shape = (4, C, 8, 8), (5, C, r, r)
        assert K.columns_size(x_shape, w_shape, 1, pad) == conv_winograd.winograd_size(x_shape, 5, r, pad)


@pytest.mark.parametrize("r", [3, 5])
def test_the_transforms_compute_a_correlation(r):
    """sum_j A^T[i, j] G[j, k] B^T[j, l] = 1 where l = i + k, else 0: the 1-D F(2, r)
    that the 2-D one nests (Y = A^T [(G g) * (B^T d)] is then y_i = sum_k g_k d_(i+k))."""
    at, g, bt = {3: (conv_winograd.AT3, conv_winograd.G3, conv_winograd.BT3),
                 5: (conv_winograd.AT5, conv_winograd.G5, conv_winograd.BT5)}[r]
    assert at.shape == (2, r + 1) and g.shape == (r + 1, r) and bt.shape == (r + 1, r + 1)
    got = np.einsum("ij,jk,jl->ikl", at, g, bt)
    want = np.zeros((2, r, r + 1))
    for i in range(2):
        for k in range(r):
            want[i, k, i + k] = 1.0
    np.testing.assert_allclose(got, want, atol=1e-14)


# (h, w, pad, n, o): even tiles, odd outputs both ways, no padding, the largest
# padding taken, fewer outputs than inputs
@pytest.mark.parametrize("r,h,w,pad,n,o", [(3, 8, 8, 1, 2, 4), (3, 7, 9, 1, 3, 5), (3, 6, 7, 0, 2, 3),
                                           (3, 5, 6, 2, 2, 4), (3, 9, 8, 0, 1, 40),
                                           (5, 8, 8, 2, 2, 4), (5, 7, 9, 2, 3, 5), (5, 6, 7, 0, 2, 3),
                                           (5, 5, 6, 4, 2, 4), (5, 9, 8, 1, 1, 40)])
def test_matches_plain_convolution_and_finite_differences(r, h, w, pad, n, o, rng):
    x = rng.standard_normal((n, C, h, w))
    wt = rng.standard_normal((o, C, r, r))
    b = rng.standard_normal(o)
    ref = reference(x, wt, b, pad)
    out = K.conv2d_forward(x, wt, b, 1, pad)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-11)
    r = rng.standard_normal(out.shape)
    dw, db = np.empty_like(wt), np.empty_like(b)
    dx = K.conv2d_backward(r, x, wt, dw, db, 1, pad, True)
    check_gradients(x, wt, b, pad, r, dx, dw, db, rng)
    # the same through the kept workspace (filled with NaN: everything read is written first)
    work = np.full(K.columns_size(x.shape, wt.shape, 1, pad), np.nan)
    np.testing.assert_allclose(K.conv2d_forward_keep(x, wt, b, 1, pad, work), ref, rtol=1e-12, atol=1e-11)
    dw2, db2 = np.empty_like(wt), np.empty_like(b)
    dx2 = K.conv2d_backward_kept(r, x, wt, dw2, db2, 1, pad, True, work)
    np.testing.assert_allclose(dx2, dx, rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(dw2, dw, rtol=1e-12, atol=1e-11)
    np.testing.assert_array_equal(db2, db)


def test_weight_gradient_without_the_input_gradient(rng):
    x = rng.standard_normal((2, C, 6, 6))
    wt = rng.standard_normal((3, C, 3, 3))
    b = np.zeros(3)
    r = rng.standard_normal((2, 3, 6, 6))
    dw1, db1, dw2, db2 = np.empty_like(wt), np.empty_like(b), np.empty_like(wt), np.empty_like(b)
    K.conv2d_backward(r, x, wt, dw1, db1, 1, 1, True)
    assert K.conv2d_backward(r, x, wt, dw2, db2, 1, 1, False).size == 0
    np.testing.assert_array_equal(dw2, dw1)
    np.testing.assert_array_equal(db2, db1)


# AlexNet-64's conv4 and conv2 shapes, smaller batch and fewer outputs
@pytest.mark.parametrize("c,h,r,pad", [(64, 8, 3, 1), (64, 16, 5, 2)])
def test_float32_agrees_with_im2col(c, h, r, pad, rng):
    """Winograd's transforms cost only rounding."""
    n, o = 3, 32
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    wt = (rng.standard_normal((o, c, r, r)) * 0.05).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    rows, p = c * r * r, h * h
    cols = np.empty(rows * n * p, dtype=np.float32)
    ref = conv._gemm_forward(x, wt, b, 1, pad, cols, True)  # im2col + GEMM, columns kept
    out = K.conv2d_forward(x, wt, b, 1, pad)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    r = rng.standard_normal(out.shape).astype(np.float32)
    dw_ref, db_ref = np.empty_like(wt), np.empty_like(b)
    dx_ref = conv._gemm_backward(r, x, wt, dw_ref, db_ref, 1, pad, True, cols, True)
    dw, db = np.empty_like(wt), np.empty_like(b)
    dx = K.conv2d_backward(r, x, wt, dw, db, 1, pad, True)
    assert dx.dtype == dw.dtype == np.float32
    for got, want in [(dx, dx_ref), (dw, dw_ref), (db, db_ref)]:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
