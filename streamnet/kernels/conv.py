"""2-D convolution as im2col + GEMM over chunks of the batch.

Measured here (perf/kernels.py, one thread): a column matrix for the whole batch
is memory-bound (AlexNet-64's conv2 builds a 105 MB one), and one GEMM per sample
is overhead-bound on LeNet's tiny layers. So the batch is cut into chunks whose
column matrix stays about COL_BUDGET floats (cache-sized) unless that would leave
fewer than MIN_COLS GEMM columns, and each chunk is one GEMM (LeNet-5 step 9.2 ms
at a 256 KiB budget against 12.7 ms at 4 MiB; AlexNet-64 gains from the floor).
conv2d_forward_keep leaves a training forward's columns for the backward pass.

Column layout: row (c, i, j), column (sample in chunk, oh, ow).
Weight layout is PyTorch's: (out, in, kh, kw).

Three kinds of layer take their own paths: one input channel, stride 1 (LeNet-5's
conv1) is direct (conv_wide.py); stride 1 with few column rows (LeNet-5's conv2)
runs over batch-minor blocks (conv_minor.py); any other 3x3 or 5x5, stride 1
(AlexNet's conv2-5) is Winograd F(2x2, 3x3) or F(2x2, 5x5) (conv_winograd.py).
"""
import numpy as np

from ._jit import jit
from .bias import bias_grad
from .conv_minor import minor_backward, minor_forward, use_minor
from .conv_wide import use_wide, wide_backward, wide_forward
from .conv_winograd import use_winograd, winograd_backward, winograd_forward, winograd_size
from .pool import maxpool_backward, maxpool_forward

COL_BUDGET = 1 << 16  # floats in one chunk's column matrix (256 KiB: stays in L2)
MIN_COLS = 256        # but at least this many GEMM columns, below which BLAS is inefficient
WHOLE_BELOW = 1024    # a training forward whose chunks are narrower than this runs the batch as one chunk


@jit
def conv_out_size(size, kernel, stride, pad):
    return (size + 2 * pad - kernel) // stride + 1


@jit
def chunk_size(n, rows, p):
    by_cache = COL_BUDGET // max(rows * p, 1)
    by_gemm = (MIN_COLS + p - 1) // p
    return max(1, min(n, max(by_cache, by_gemm)))


@jit
def kept_chunk(n, rows, p):
    """Samples per chunk of a training forward that keeps its columns: the whole batch
    where chunk_size's chunks would be narrow (see conv2d_forward_keep)."""
    s = chunk_size(n, rows, p)
    return n if s * p < WHOLE_BELOW else s


@jit
def _padded(x, n0, n1, pad):
    """Samples n0..n1-1 of x with a zero border of `pad` on each side."""
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    xp = np.zeros((n1 - n0, c, h + 2 * pad, w + 2 * pad), dtype=x.dtype)
    for ni in range(n0, n1):
        for ci in range(c):
            for y in range(h):
                src = x[ni, ci, y]
                dst = xp[ni - n0, ci, y + pad, pad:]
                for z in range(w):
                    dst[z] = src[z]
    return xp


@jit
def im2col(x, n0, n1, kh, kw, stride, pad, col):
    """Fill col with the columns of samples n0..n1-1.

    Read from a zero-padded copy of the samples, so no index is out of bounds and
    each output row is a plain copy from a view indexed with the bare loop counter
    (numba's negative-index wrap then drops out and the copy vectorises); each
    column row is written front to back. Against the bounds test in the inner loop
    it replaced (one core, whole batch 32 of AlexNet-64): conv2 20.4 -> 4.5 ms,
    conv3 7.5 -> 1.5, conv4 18.3 -> 3.3, conv5 11.4 -> 2.5, conv1 (stride 2)
    1.12 -> 0.71. (Hoisting the bounds out per tap instead was slower than the
    bounds test: AlexNet-64 conv2 13.2 -> 17.4 ms.)
    """
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    xp = _padded(x, n0, n1, pad)
    oh = conv_out_size(h, kh, stride, pad)
    ow = conv_out_size(w, kw, stride, pad)
    p = oh * ow
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                row = col[(ci * kh + i) * kw + j]
                for s in range(n1 - n0):
                    plane = xp[s, ci]
                    for y in range(oh):
                        src = plane[y * stride + i, j:]
                        dst = row[s * p + y * ow:]
                        if stride == 1:
                            for z in range(ow):
                                dst[z] = src[z]
                        else:
                            for z in range(ow):
                                dst[z] = src[z * stride]


@jit
def col2im(col, n0, n1, kh, kw, stride, pad, dx):
    """Add the column gradients of samples n0..n1-1 into dx (which starts zeroed).

    Into a zero-padded buffer first, as im2col reads from one, so the adds need no
    valid ranges and vectorise; then its interior into dx. Same order of adds, so
    the same bits, as the per-tap valid ranges it replaced; whole batch 32 of
    AlexNet-64, one core: conv2 12.5 -> 9.5 ms, conv3 6.3 -> 2.2, conv4 21.2 ->
    5.5, conv5 9.8 -> 3.7 (conv1, stride 2: 0.67 -> 0.76).
    """
    c, h, w = dx.shape[1], dx.shape[2], dx.shape[3]
    oh = conv_out_size(h, kh, stride, pad)
    ow = conv_out_size(w, kw, stride, pad)
    p = oh * ow
    dxp = np.zeros((n1 - n0, c, h + 2 * pad, w + 2 * pad), dtype=dx.dtype)
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                row = col[(ci * kh + i) * kw + j]
                for s in range(n1 - n0):
                    plane = dxp[s, ci]
                    for y in range(oh):
                        dst = plane[y * stride + i, j:]
                        src = row[s * p + y * ow:]
                        if stride == 1:
                            for z in range(ow):
                                dst[z] += src[z]
                        else:
                            for z in range(ow):
                                dst[z * stride] += src[z]
    for s in range(n1 - n0):
        for ci in range(c):
            for y in range(h):
                src = dxp[s, ci, y + pad, pad:]
                dst = dx[n0 + s, ci, y]
                for z in range(w):
                    dst[z] += src[z]


@jit
def conv2d_forward(x, weight, bias, stride, pad):
    """out (N, O, OH, OW) = conv(x, weight) + bias."""
    n, c, h, w = x.shape
    if use_wide(c, stride):  # one input channel: direct, see conv_wide.py
        return wide_forward(x, weight, bias, pad)
    kh, kw = weight.shape[2], weight.shape[3]
    if use_minor(c, kh, kw, stride):  # few column rows: batch-minor blocks, see conv_minor.py
        return minor_forward(x, weight, bias, pad)
    if use_winograd(kh, kw, stride, pad):  # 3x3 or 5x5, stride 1: see conv_winograd.py
        return winograd_forward(x, weight, bias, pad, np.empty(0, dtype=x.dtype))
    rows = c * kh * kw
    p = conv_out_size(h, kh, stride, pad) * conv_out_size(w, kw, stride, pad)
    col_buf = np.empty(rows * chunk_size(n, rows, p) * p, dtype=x.dtype)  # one chunk, reused
    return _gemm_forward(x, weight, bias, stride, pad, col_buf, False)


@jit
def columns_size(x_shape, w_shape, stride, pad):
    """Floats of the column matrix conv2d_forward_keep leaves for the backward pass
    (on the Winograd path, its transformed input): 0 for layers on the direct or
    batch-minor paths, which rebuild columns cheaply."""
    n, c, h, w = x_shape
    o, _, kh, kw = w_shape
    if use_wide(c, stride) or use_minor(c, kh, kw, stride):
        return 0
    if use_winograd(kh, kw, stride, pad):
        return winograd_size(x_shape, o, kh, pad)
    return c * kh * kw * n * conv_out_size(h, kh, stride, pad) * conv_out_size(w, kw, stride, pad)


@jit
def conv2d_forward_keep(x, weight, bias, stride, pad, cols):
    """conv2d_forward that also leaves the batch's columns in cols (a flat buffer of
    columns_size floats) for conv2d_backward_kept, which then skips rebuilding them:
    AlexNet-64 batch 32 saves one im2col per conv layer (conv2: 12 ms of its 128 ms
    backward).

    Where chunk_size's chunks would have fewer than WHOLE_BELOW columns (its
    MIN_COLS floor: the layers with many column rows), the whole batch is one chunk:
    its columns go to memory anyway, and the backward's weight gradient is then one
    GEMM over all n*oh*ow columns instead of one per narrow chunk summed in float64
    (AlexNet-64 batch 32, one core: conv3 37.8 -> 31.1 ms, conv4 51.1 -> 43.0, conv2
    74.8 -> 61.4; BLAS then sums all columns in float32, where the chunks' sums were
    added in float64: kept and rebuilt columns differ by that rounding), while the
    forward's one GEMM runs as fast as its chunks did
    (conv3 28.5 against 28.8 ms). Wide chunks stay: AlexNet-64's conv1 (25 rows,
    2048 columns a chunk) as one chunk took 16.2 ms forward and 17.5 backward
    against 5.6 and 5.6, its 64 x 32768 output going through memory twice."""
    if cols.size == 0:
        return conv2d_forward(x, weight, bias, stride, pad)
    if use_winograd(weight.shape[2], weight.shape[3], stride, pad):
        return winograd_forward(x, weight, bias, pad, cols)  # cols: its transformed input
    return _gemm_forward(x, weight, bias, stride, pad, cols, True)


@jit
def _gemm_forward(x, weight, bias, stride, pad, cols, keep):
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh = conv_out_size(h, kh, stride, pad)
    ow = conv_out_size(w, kw, stride, pad)
    p = oh * ow
    rows = c * kh * kw
    s = kept_chunk(n, rows, p) if keep else chunk_size(n, rows, p)
    # flat buffers reshaped per chunk: a sliced 2-D buffer would be non-contiguous,
    # and numba copies non-contiguous operands of np.dot on every call
    y_buf = np.empty(o * s * p, dtype=x.dtype)
    wm = weight.reshape(o, rows)
    out = np.empty((n, o, oh, ow), dtype=x.dtype)
    out_flat = out.reshape(n, o, p)
    for n0 in range(0, n, s):
        n1 = min(n, n0 + s)
        m = (n1 - n0) * p
        first = rows * n0 * p if keep else 0  # keep: each chunk its own block
        col = cols[first:first + rows * m].reshape(rows, m)
        y = y_buf[:o * m].reshape(o, m)
        im2col(x, n0, n1, kh, kw, stride, pad, col)
        np.dot(wm, col, y)
        for ni in range(n0, n1):
            base = (ni - n0) * p
            for oi in range(o):
                b = bias[oi]
                for q in range(p):
                    out_flat[ni, oi, q] = y[oi, base + q] + b
    return out


@jit
def conv2d_backward(dout, x, weight, dweight, dbias, stride, pad, need_dx):
    """Overwrite dweight and dbias (views of a flat gradient); return dx, or an empty
    array when need_dx is False (the first layer's input gradient is never used)."""
    n, c, h, w = x.shape
    if use_wide(c, stride):
        return wide_backward(dout, x, weight, dweight, dbias, pad, need_dx)
    if use_minor(c, weight.shape[2], weight.shape[3], stride):
        return minor_backward(dout, x, weight, dweight, dbias, pad, need_dx)
    if use_winograd(weight.shape[2], weight.shape[3], stride, pad):
        return winograd_backward(dout, x, weight, dweight, dbias, pad, need_dx, np.empty(0, dtype=x.dtype), False)
    return _gemm_backward(dout, x, weight, dweight, dbias, stride, pad, need_dx,
                          np.empty(0, dtype=x.dtype), False)


@jit
def conv2d_backward_kept(dout, x, weight, dweight, dbias, stride, pad, need_dx, cols):
    """conv2d_backward reading the columns conv2d_forward_keep left in cols. It uses
    cols up: with need_dx they are overwritten by the input gradient's columns (a
    second buffer of their size would double the largest allocation of a step)."""
    if cols.size == 0:
        return conv2d_backward(dout, x, weight, dweight, dbias, stride, pad, need_dx)
    if use_winograd(weight.shape[2], weight.shape[3], stride, pad):
        return winograd_backward(dout, x, weight, dweight, dbias, pad, need_dx, cols, True)
    return _gemm_backward(dout, x, weight, dweight, dbias, stride, pad, need_dx, cols, True)


@jit
def _gemm_backward(dout, x, weight, dweight, dbias, stride, pad, need_dx, cols, kept):
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    oh = dout.shape[2]
    ow = dout.shape[3]
    p = oh * ow
    rows = c * kh * kw
    s = kept_chunk(n, rows, p) if kept else chunk_size(n, rows, p)
    col_buf = np.empty(0 if kept else rows * s * p, dtype=x.dtype)
    dy_buf = np.empty(o * s * p, dtype=x.dtype)
    dw_acc = np.zeros((o, rows), dtype=np.float64) if n > s else np.zeros((0, 0), dtype=np.float64)
    part = np.empty((o, rows), dtype=x.dtype) if n > s else np.empty((0, 0), dtype=x.dtype)
    dflat = dout.reshape(n, o, p)
    wm = weight.reshape(o, rows)
    wmt = np.ascontiguousarray(wm.T)
    dwm = dweight.reshape(o, rows)
    bias_grad(dflat, dbias)
    if need_dx:
        dx = np.zeros((n, c, h, w), dtype=x.dtype)
        dcol_buf = np.empty(0 if kept else rows * s * p, dtype=x.dtype)
    else:
        dx = np.empty((0, 0, 0, 0), dtype=x.dtype)
        dcol_buf = np.empty(0, dtype=x.dtype)
    for n0 in range(0, n, s):
        n1 = min(n, n0 + s)
        m = (n1 - n0) * p
        if kept:
            col = cols[rows * n0 * p:rows * n1 * p].reshape(rows, m)
        else:
            col = col_buf[:rows * m].reshape(rows, m)
            im2col(x, n0, n1, kh, kw, stride, pad, col)
        dy = dy_buf[:o * m].reshape(o, m)
        for ni in range(n0, n1):
            base = (ni - n0) * p
            for oi in range(o):
                for q in range(p):
                    dy[oi, base + q] = dflat[ni, oi, q]
        if n > s:
            np.dot(dy, col.T, part)
            dw_acc += part
        else:
            np.dot(dy, col.T, dwm)  # one chunk: straight into the gradient view
        if need_dx:
            # kept: the chunk's own columns, which the weight gradient has read
            dcol = col if kept else dcol_buf[:rows * m].reshape(rows, m)
            np.dot(wmt, dy, dcol)
            col2im(dcol, n0, n1, kh, kw, stride, pad, dx)
    if n > s:
        dwm[:, :] = dw_acc
    return dx


# -- fused with the max pool after it (and a ReLU after that) --------------------

@jit
def conv2d_pool_forward(x, weight, bias, stride, pad, k, s, relu, cols):
    """relu(maxpool(conv2d_forward_keep(x, ...), k, s)) in one call: (out, arg, the
    convolution's output shape) for conv2d_pool_backward. The same kernels as the
    three layers, so the same bits; one call where there were three, each of which
    re-takes the GIL on return (nn/parallel.py). (A one-channel convolution pooled
    2x2 has its own, conv_wide.wide_pool_forward, that never stores its output.)"""
    y = conv2d_forward_keep(x, weight, bias, stride, pad, cols)
    out, arg = maxpool_forward(y, k, s)
    if relu:
        flat = out.reshape(-1)
        for i in range(flat.size):
            v = flat[i]
            flat[i] = v if v > 0 else 0.0
    return out, arg, y.shape


@jit
def conv2d_pool_backward(dout, out, arg, conv_shape, x, weight, dweight, dbias, stride, pad, relu,
                         need_dx, cols):
    """Backward of conv2d_pool_forward (dout: the gradient of its output `out`):
    overwrite dweight and dbias, return dx or an empty array. Uses cols up, as
    conv2d_backward_kept does."""
    if relu:
        g = np.empty_like(dout)
        gf, df, of = g.reshape(-1), dout.reshape(-1), out.reshape(-1)
        for i in range(gf.size):
            gf[i] = df[i] if of[i] > 0 else 0.0
    else:
        g = dout
    dconv = maxpool_backward(g, arg, conv_shape)
    return conv2d_backward_kept(dconv, x, weight, dweight, dbias, stride, pad, need_dx, cols)
