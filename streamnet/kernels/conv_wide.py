"""Direct stride-1 convolution of one-channel input over "wide" planes.

im2col + GEMM is a poor fit for a layer with one input channel (LeNet-5's conv1):
the column matrix is 25x the input, and a 6-row GEMM runs at ~20 GFLOP/s. Here
each output plane is computed over the full padded width wp instead of ow (the
last kw-1 columns of every row are garbage, dropped on the way out), so each
kernel tap (i, j) is one long contiguous axpy, out_plane += w[i, j] *
x_plane[i*wp + j :], that LLVM vectorises. Short rows (ow = 28) are not
vectorised well: a 28-long inner loop ran at 4.3 GMAC/s, below im2col + GEMM.

Garbage columns of the output gradient are set to zero, so they add nothing to
the weight or input gradients.
"""
import numpy as np

from ._jit import jit, jit_fast


@jit
def use_wide(c, stride):
    return c == 1 and stride == 1


@jit
def _padded(x, ni, pad, xp):
    """Sample ni's plane into xp (flat, hp*wp + tail); border and tail stay zero."""
    h, w = x.shape[2], x.shape[3]
    wp = w + 2 * pad
    for y in range(h):
        row = x[ni, 0, y]
        dst = xp[(y + pad) * wp + pad:]
        for z in range(w):
            dst[z] = row[z]




@jit_fast
def _taps(plane, xp, w, b, wp):
    """plane = b + sum over taps (i, j) of w[i, j] * xp[i*wp + j :].

    Index through a view with the bare loop counter: numba wraps negative indices,
    and unless LLVM can prove the index >= 0 that check keeps the loop scalar
    (xp[off + t] here: 9.2 ms against 0.91 ms for LeNet-5 conv1, batch 64)."""
    kh, kw = w.shape
    for t in range(plane.size):
        plane[t] = b
    for i in range(kh):
        for j in range(kw):
            a = w[i, j]
            src = xp[i * wp + j:]  # a view, so the index below is provably >= 0
            for t in range(plane.size):
                plane[t] += a * src[t]


@jit_fast
def wide_forward(x, weight, bias, pad):
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = hp - kh + 1, wp - kw + 1
    length = oh * wp
    xp = np.zeros(hp * wp + kw, dtype=x.dtype)  # tail: the garbage columns read past the plane
    plane = np.empty(length, dtype=x.dtype)
    out = np.empty((n, o, oh, ow), dtype=x.dtype)
    for ni in range(n):
        _padded(x, ni, pad, xp)
        for oi in range(o):
            _taps(plane, xp, weight[oi, 0], bias[oi], wp)
            for y in range(oh):
                dst = out[ni, oi, y]
                src = plane[y * wp:]
                for z in range(ow):
                    dst[z] = src[z]
    return out


@jit_fast
def wide_backward(dout, x, weight, dweight, dbias, pad, need_dx):
    """As conv2d_backward, for one input channel and stride 1."""
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = hp - kh + 1, wp - kw + 1
    length = oh * wp
    xp = np.zeros(hp * wp + kw, dtype=x.dtype)
    dplane = np.zeros(length, dtype=x.dtype)  # garbage columns stay zero
    dw_acc = np.zeros((o, kh, kw), dtype=np.float64)
    db_acc = np.zeros(o, dtype=np.float64)
    if need_dx:
        dx = np.empty((n, 1, h, w), dtype=x.dtype)
        dxp = np.empty(hp * wp + kw, dtype=x.dtype)
    else:
        dx = np.empty((0, 0, 0, 0), dtype=x.dtype)
        dxp = np.empty(0, dtype=x.dtype)
    for ni in range(n):
        _padded(x, ni, pad, xp)
        if need_dx:
            dxp[:] = 0.0
        for oi in range(o):
            acc = 0.0
            for y in range(oh):
                src = dout[ni, oi, y]
                dst = dplane[y * wp:]
                for z in range(ow):
                    g = src[z]
                    dst[z] = g
                    acc += g
            db_acc[oi] += acc
            for i in range(kh):
                for j in range(kw):
                    src = xp[i * wp + j:]  # views: see _taps
                    d = np.float32(0.0)  # float32 lanes (float64 for float64 input)
                    for t in range(length):
                        d += dplane[t] * src[t]
                    dw_acc[oi, i, j] += d
                    if need_dx:
                        a = weight[oi, 0, i, j]
                        dst = dxp[i * wp + j:]
                        for t in range(length):
                            dst[t] += a * dplane[t]
        if need_dx:
            for y in range(h):
                dst = dx[ni, 0, y]
                src = dxp[(y + pad) * wp + pad:]
                for z in range(w):
                    dst[z] = src[z]
    for oi in range(o):
        dbias[oi] = db_acc[oi]
        for i in range(kh):
            for j in range(kw):
                dweight[oi, 0, i, j] = dw_acc[oi, i, j]
    return dx
