"""Stride-1 convolution with few column rows (c*kh*kw <= MINOR_MAX_ROWS: LeNet-5's
conv2) as im2col + GEMM over batch-minor blocks.

A block of up to BLOCK samples is copied once into a padded batch-minor array
(c, hp, wp*k): sample index innermost. Column row (c, i, j) of output row y is then
one contiguous run, xt[c, y+i, j*k : (j+ow)*k], so im2col and col2im are long
vectorised copies and adds, and the GEMM computes only real outputs: no padded
"wide" columns (14/10 more work for LeNet-5's conv2), no short rows. Each output
row y of a block is one GEMM over ow*k columns (160 for LeNet-5, a size OpenBLAS
runs well: one GEMM over a whole 64-sample batch's 6400 columns took 2x longer
per column here).

Measured against the wide columns it replaced (same process, paired alternating
blocks, one core, load 12-19), LeNet-5 conv2 batch 64: forward 1.48x, backward
1.23x; a 64-batch step then ran at 30.5 % of the matmul peak (load 2.3-3.1).
Not better: blocks of 8 (the same at batch 64, slower at 32) or 32 (forward
1.08x); writing the output sample-outer (0.85x); gathering the output gradient
with contiguous writes and transposing it (no change); the input gradient's GEMM
on the transposed gradient, saving one gather (GEMM 0.26 -> 0.46 ms); the weight
gradient as one GEMM per block over all its output rows' columns (rows x 1600)
instead of one per row (backward 0.80x at batch 64 and 32, IQR 0.74-0.83, paired,
load 2.9; likely the block's 960 KB of columns crowding L2). Where the
backward's 1.24 ms go (ablation, batch 64): weight-gradient GEMM 0.42, input-
gradient GEMM 0.23, output-gradient gather 0.17, col2im 0.12, im2col 0.11.

Column layout (per output row y of a block): row (c, i, j), column (x, sample).
"""
import numpy as np

from ._jit import jit
from .bias import bias_grad

MINOR_MAX_ROWS = 256  # c*kh*kw up to which this path is used (LeNet-5 conv2: 150)
BLOCK = 16            # samples per block


@jit
def use_minor(c, kh, kw, stride):
    return stride == 1 and c > 1 and c * kh * kw <= MINOR_MAX_ROWS


@jit
def _to_minor(x, n0, k, pad, xt):
    """Samples n0..n0+k-1 into xt (c, hp, wp*k), sample innermost; border zeroed."""
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    if pad > 0:
        xt[:] = 0.0
    for s in range(k):
        for ci in range(c):
            for y in range(h):
                src = x[n0 + s, ci, y]
                dst = xt[ci, y + pad, pad * k + s:]
                for z in range(w):
                    dst[z * k] = src[z]


@jit
def _cols(xt, y, k, kh, kw, ow, col):
    """Columns of output row y: col[(c, i, j), x*k + s] = xt[c, y+i, (x+j)*k + s]."""
    c = xt.shape[0]
    m = ow * k
    for ci in range(c):
        for i in range(kh):
            row = xt[ci, y + i]
            for j in range(kw):
                d = col[(ci * kh + i) * kw + j]
                src = row[j * k:]
                for t in range(m):
                    d[t] = src[t]


@jit
def minor_forward(x, weight, bias, pad):
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = hp - kh + 1, wp - kw + 1
    rows = c * kh * kw
    b = max(1, min(n, BLOCK))  # an empty batch still gets a (zero-trip) loop step
    xt_buf = np.empty(c * hp * wp * b, dtype=x.dtype)
    col_buf = np.empty(rows * ow * b, dtype=x.dtype)
    y_buf = np.empty(o * ow * b, dtype=x.dtype)
    wm = weight.reshape(o, rows)
    out = np.empty((n, o, oh, ow), dtype=x.dtype)
    for n0 in range(0, n, b):
        k = min(b, n - n0)
        m = ow * k
        xt = xt_buf[:c * hp * wp * k].reshape(c, hp, wp * k)
        _to_minor(x, n0, k, pad, xt)
        col = col_buf[:rows * m].reshape(rows, m)
        yv = y_buf[:o * m].reshape(o, m)
        for y in range(oh):
            _cols(xt, y, k, kh, kw, ow, col)
            np.dot(wm, col, yv)
            for oi in range(o):
                bo = bias[oi]
                src = yv[oi]
                for z in range(ow):
                    for s in range(k):
                        out[n0 + s, oi, y, z] = src[z * k + s] + bo
    return out


@jit
def minor_backward(dout, x, weight, dweight, dbias, pad, need_dx):
    """As conv2d_backward, over batch-minor blocks (columns rebuilt per output row)."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = hp - kh + 1, wp - kw + 1
    rows = c * kh * kw
    b = max(1, min(n, BLOCK))  # an empty batch still gets a (zero-trip) loop step
    bias_grad(dout.reshape(n, o, oh * ow), dbias)
    xt_buf = np.empty(c * hp * wp * b, dtype=x.dtype)
    col_buf = np.empty(rows * ow * b, dtype=x.dtype)
    # the output gradient of one row twice: (o, m) for the input gradient's GEMM and
    # (m, o) for the weight gradient's, so both GEMMs take row-major operands
    dy_buf = np.empty(o * ow * b, dtype=x.dtype)
    dyt_buf = np.empty(o * ow * b, dtype=x.dtype)
    wm = weight.reshape(o, rows)
    wmt = np.ascontiguousarray(wm.T)
    dw_acc = np.zeros((rows, o), dtype=np.float64)
    part = np.empty((rows, o), dtype=x.dtype)
    dx = np.empty((n, c, h, w) if need_dx else (0, 0, 0, 0), dtype=x.dtype)
    dcol_buf = np.empty(rows * ow * b, dtype=x.dtype)
    dxt_buf = np.empty(c * hp * wp * b, dtype=x.dtype)
    for n0 in range(0, n, b):
        k = min(b, n - n0)
        m = ow * k
        xt = xt_buf[:c * hp * wp * k].reshape(c, hp, wp * k)
        _to_minor(x, n0, k, pad, xt)
        col = col_buf[:rows * m].reshape(rows, m)
        dy = dy_buf[:o * m].reshape(o, m)
        dyt = dyt_buf[:o * m].reshape(m, o)
        dxt = dxt_buf[:c * hp * wp * k].reshape(c, hp, wp * k)
        dcol = dcol_buf[:rows * m].reshape(rows, m)
        if need_dx:
            dxt[:] = 0.0
        for y in range(oh):
            for oi in range(o):
                d = dy[oi]
                for s in range(k):
                    src = dout[n0 + s, oi, y]
                    for z in range(ow):
                        v = src[z]
                        d[z * k + s] = v
                        dyt[z * k + s, oi] = v
            _cols(xt, y, k, kh, kw, ow, col)
            np.dot(col, dyt, part)
            dw_acc += part
            if need_dx:
                np.dot(wmt, dy, dcol)
                for ci in range(c):
                    for i in range(kh):
                        row = dxt[ci, y + i]
                        for j in range(kw):
                            g = dcol[(ci * kh + i) * kw + j]
                            dst = row[j * k:]
                            for t in range(m):
                                dst[t] += g[t]
        if need_dx:
            for s in range(k):
                for ci in range(c):
                    for yy in range(h):
                        src = dxt[ci, yy + pad, pad * k + s:]
                        d = dx[n0 + s, ci, yy]
                        for z in range(w):
                            d[z] = src[z * k]
    dwm = dweight.reshape(o, rows)
    for oi in range(o):
        for r in range(rows):
            dwm[oi, r] = dw_acc[r, oi]
    return dx
