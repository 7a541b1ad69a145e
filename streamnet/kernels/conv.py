"""2-D convolution as im2col + one GEMM per pass.

Measured on LeNet-5 and AlexNet: one large GEMM over the whole batch beats one
GEMM per sample and beats direct loops, because BLAS is efficient only on big
matrices. The column matrix has shape (C*KH*KW, N*OH*OW): row (c, i, j), column
(n, oh, ow). It is returned by the forward pass and consumed by the backward
pass, so the caller (a layer) owns it; kernels keep no state.

Weight layout is PyTorch's: (out, in, kh, kw).
"""
import numpy as np

from ._jit import jit


@jit
def conv_out_size(size, kernel, stride, pad):
    return (size + 2 * pad - kernel) // stride + 1


@jit
def im2col(x, kh, kw, stride, pad):
    n, c, h, w = x.shape
    oh = conv_out_size(h, kh, stride, pad)
    ow = conv_out_size(w, kw, stride, pad)
    p = oh * ow
    col = np.empty((c * kh * kw, n * p), dtype=x.dtype)
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                r = (ci * kh + i) * kw + j
                for ni in range(n):
                    base = ni * p
                    for y in range(oh):
                        iy = y * stride - pad + i
                        row_ok = 0 <= iy < h
                        for z in range(ow):
                            ix = z * stride - pad + j
                            if row_ok and 0 <= ix < w:
                                col[r, base + y * ow + z] = x[ni, ci, iy, ix]
                            else:
                                col[r, base + y * ow + z] = 0.0
    return col


@jit
def col2im(col, n, c, h, w, kh, kw, stride, pad):
    oh = conv_out_size(h, kh, stride, pad)
    ow = conv_out_size(w, kw, stride, pad)
    p = oh * ow
    dx = np.zeros((n, c, h, w), dtype=col.dtype)
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                r = (ci * kh + i) * kw + j
                for ni in range(n):
                    base = ni * p
                    for y in range(oh):
                        iy = y * stride - pad + i
                        if iy < 0 or iy >= h:
                            continue
                        for z in range(ow):
                            ix = z * stride - pad + j
                            if 0 <= ix < w:
                                dx[ni, ci, iy, ix] += col[r, base + y * ow + z]
    return dx


@jit
def conv2d_forward(x, weight, bias, stride, pad):
    """Return (out, col): out is (N, O, OH, OW); col is kept for the backward pass."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh = conv_out_size(h, kh, stride, pad)
    ow = conv_out_size(w, kw, stride, pad)
    p = oh * ow
    col = im2col(x, kh, kw, stride, pad)
    wm = weight.reshape(o, c * kh * kw)
    y = np.dot(wm, col)  # (O, N*P)
    out = np.empty((n, o, oh, ow), dtype=x.dtype)
    out_flat = out.reshape(n, o, p)
    for ni in range(n):
        for oi in range(o):
            b = bias[oi]
            for q in range(p):
                out_flat[ni, oi, q] = y[oi, ni * p + q] + b
    return out, col


@jit
def conv2d_backward(dout, col, x_shape, weight, dweight, dbias, stride, pad, need_dx):
    """Write weight and bias gradients into dweight, dbias; return dx (or an empty array).

    dweight and dbias are overwritten, not accumulated: they are views into a
    model's flat gradient vector.
    """
    n, c, h, w = x_shape
    o, _, kh, kw = weight.shape
    oh = dout.shape[2]
    ow = dout.shape[3]
    p = oh * ow
    dflat = dout.reshape(n, o, p)
    dy = np.empty((o, n * p), dtype=dout.dtype)
    for oi in range(o):
        s = 0.0
        for ni in range(n):
            for q in range(p):
                v = dflat[ni, oi, q]
                dy[oi, ni * p + q] = v
                s += v
        dbias[oi] = s
    dw = np.dot(dy, col.T)  # (O, C*KH*KW)
    dweight.reshape(o, c * kh * kw)[:, :] = dw
    if not need_dx:
        return np.empty((0, 0, 0, 0), dtype=dout.dtype)
    wm = weight.reshape(o, c * kh * kw)
    dcol = np.dot(wm.T, dy)  # (C*KH*KW, N*P)
    return col2im(dcol, n, c, h, w, kh, kw, stride, pad)
