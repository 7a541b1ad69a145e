"""Stride-1 convolution with one input channel (LeNet-5's conv1), direct over
"wide" planes.

im2col + GEMM is a poor fit for a layer with one input channel: the column matrix
is 25x the input, and a 6-row GEMM runs at ~20 GFLOP/s. Here each output plane is
computed over the full padded width wp instead of ow (the last kw-1 columns of
every row are garbage, dropped on the way out), so each kernel tap (i, j) is one
long contiguous axpy, out_plane += w[i, j] * x_plane[i*wp + j :], that LLVM
vectorises. Short rows (ow = 28) are not vectorised well: a 28-long inner loop ran
at 4.3 GMAC/s, below im2col + GEMM.

Garbage columns of the output gradient are set to zero, so they add nothing to
the weight or input gradients. (Layers with a few input channels, LeNet-5's
conv2, once used the same wide planes as im2col columns; conv_minor.py replaced
that: it does not compute the garbage columns.)
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
        src = xp[i * wp:]  # a view, so the indices below are provably >= 0
        if kw == 5:
            # a kernel row in one pass: 5 loads per store instead of 1 (LeNet-5)
            a0, a1, a2, a3, a4 = w[i, 0], w[i, 1], w[i, 2], w[i, 3], w[i, 4]
            for t in range(plane.size):
                plane[t] += (a0 * src[t] + a1 * src[t + 1] + a2 * src[t + 2]
                             + a3 * src[t + 3] + a4 * src[t + 4])
            continue
        for j in range(kw):
            a = w[i, j]
            sj = src[j:]
            for t in range(plane.size):
                plane[t] += a * sj[t]


@jit_fast
def _taps5x3(planes, xp, weight, bias, o0, wp):
    """_taps for output channels o0..o0+2 of a 5-wide kernel at once: each kernel row
    is one pass whose 5 input loads serve 3 planes (15 multiply-adds, not 5).
    LeNet-5 conv1 forward, batch 64, one core under load: 0.78 -> 0.57 ms (min of
    40 alternating blocks)."""
    p0, p1, p2 = planes[0], planes[1], planes[2]
    w0, w1, w2 = weight[o0, 0], weight[o0 + 1, 0], weight[o0 + 2, 0]
    b0, b1, b2 = bias[o0], bias[o0 + 1], bias[o0 + 2]
    for t in range(p0.size):
        p0[t] = b0
        p1[t] = b1
        p2[t] = b2
    for i in range(w0.shape[0]):
        src = xp[i * wp:]
        a0, a1, a2, a3, a4 = w0[i, 0], w0[i, 1], w0[i, 2], w0[i, 3], w0[i, 4]
        c0, c1, c2, c3, c4 = w1[i, 0], w1[i, 1], w1[i, 2], w1[i, 3], w1[i, 4]
        e0, e1, e2, e3, e4 = w2[i, 0], w2[i, 1], w2[i, 2], w2[i, 3], w2[i, 4]
        for t in range(p0.size):
            s0, s1, s2, s3, s4 = src[t], src[t + 1], src[t + 2], src[t + 3], src[t + 4]
            p0[t] += a0 * s0 + a1 * s1 + a2 * s2 + a3 * s3 + a4 * s4
            p1[t] += c0 * s0 + c1 * s1 + c2 * s2 + c3 * s3 + c4 * s4
            p2[t] += e0 * s0 + e1 * s1 + e2 * s2 + e3 * s3 + e4 * s4


@jit
def _unwide(plane, out, ni, oi, wp):
    """The first ow columns of each wide row of plane into out[ni, oi]."""
    oh, ow = out.shape[2], out.shape[3]
    for y in range(oh):
        dst = out[ni, oi, y]
        src = plane[y * wp:]
        for z in range(ow):
            dst[z] = src[z]


@jit_fast
def wide_forward(x, weight, bias, pad):
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = hp - kh + 1, wp - kw + 1
    length = oh * wp
    xp = np.zeros(hp * wp + kw, dtype=x.dtype)  # tail: the garbage columns read past the plane
    planes = np.empty((3, length), dtype=x.dtype)
    out = np.empty((n, o, oh, ow), dtype=x.dtype)
    grouped = o - o % 3 if kw == 5 else 0  # channels done three at a time
    for ni in range(n):
        _padded(x, ni, pad, xp)
        for o0 in range(0, grouped, 3):
            _taps5x3(planes, xp, weight, bias, o0, wp)
            for k in range(3):
                _unwide(planes[k], out, ni, o0 + k, wp)
        for oi in range(grouped, o):
            _taps(planes[0], xp, weight[oi, 0], bias[oi], wp)
            _unwide(planes[0], out, ni, oi, wp)
    return out


@jit_fast
def _dw5x3(dplanes, xp, o0, wp, dw_acc):
    """Weight gradient of output channels o0..o0+2 of a 5-wide kernel: per kernel
    row one pass over their three output-gradient planes, 15 dot products whose 5
    input loads serve all three (the one-channel pass does 5 per 6 loads)."""
    g0, g1, g2 = dplanes[o0], dplanes[o0 + 1], dplanes[o0 + 2]
    for i in range(dw_acc.shape[1]):
        src = xp[i * wp:]
        # float32 lanes (float64 for float64 input: the sums take the planes' type)
        a0 = a1 = a2 = a3 = a4 = np.float32(0.0)
        c0 = c1 = c2 = c3 = c4 = np.float32(0.0)
        e0 = e1 = e2 = e3 = e4 = np.float32(0.0)
        for t in range(g0.size):
            s0, s1, s2, s3, s4 = src[t], src[t + 1], src[t + 2], src[t + 3], src[t + 4]
            u, v, q = g0[t], g1[t], g2[t]
            a0 += u * s0
            a1 += u * s1
            a2 += u * s2
            a3 += u * s3
            a4 += u * s4
            c0 += v * s0
            c1 += v * s1
            c2 += v * s2
            c3 += v * s3
            c4 += v * s4
            e0 += q * s0
            e1 += q * s1
            e2 += q * s2
            e3 += q * s3
            e4 += q * s4
        dw_acc[o0, i, 0] += a0
        dw_acc[o0, i, 1] += a1
        dw_acc[o0, i, 2] += a2
        dw_acc[o0, i, 3] += a3
        dw_acc[o0, i, 4] += a4
        dw_acc[o0 + 1, i, 0] += c0
        dw_acc[o0 + 1, i, 1] += c1
        dw_acc[o0 + 1, i, 2] += c2
        dw_acc[o0 + 1, i, 3] += c3
        dw_acc[o0 + 1, i, 4] += c4
        dw_acc[o0 + 2, i, 0] += e0
        dw_acc[o0 + 2, i, 1] += e1
        dw_acc[o0 + 2, i, 2] += e2
        dw_acc[o0 + 2, i, 3] += e3
        dw_acc[o0 + 2, i, 4] += e4


@jit_fast
def _dw_one(dplane, xp, oi, wp, dw_acc):
    """Weight gradient of one output channel (any kernel width)."""
    kh, kw = dw_acc.shape[1], dw_acc.shape[2]
    for i in range(kh):
        for j in range(kw):
            src = xp[i * wp + j:]  # views: see _taps
            d = np.float32(0.0)  # float32 lanes (float64 for float64 input)
            for t in range(dplane.size):
                d += dplane[t] * src[t]
            dw_acc[oi, i, j] += d


@jit_fast
def _sample_backward(dplanes, xp, weight, wp, dw_acc, db_acc, need_dx, dxp, dx, ni, pad):
    """One sample's share of the gradients, from its output-gradient planes (wide,
    garbage columns zero) and its padded input xp: bias and weight gradients added
    to db_acc and dw_acc, and dx[ni] written when need_dx."""
    o, length = dplanes.shape
    kh, kw = weight.shape[2], weight.shape[3]
    h, w = dx.shape[2], dx.shape[3]
    oh, ow = length // wp, wp - kw + 1
    for oi in range(o):
        acc = 0.0
        for y in range(oh):
            src = dplanes[oi, y * wp:]
            for z in range(ow):
                acc += src[z]
        db_acc[oi] += acc
    grouped = o - o % 3 if kw == 5 else 0  # channels whose weight gradient runs three at a time
    for o0 in range(0, grouped, 3):
        _dw5x3(dplanes, xp, o0, wp, dw_acc)
    for oi in range(grouped, o):
        _dw_one(dplanes[oi], xp, oi, wp, dw_acc)
    if need_dx:
        dxp[:] = 0.0
        for oi in range(o):
            dplane = dplanes[oi]
            for i in range(kh):
                for j in range(kw):
                    a = weight[oi, 0, i, j]
                    dst = dxp[i * wp + j:]
                    for t in range(length):
                        dst[t] += a * dplane[t]
        for y in range(h):
            dst = dx[ni, 0, y]
            src = dxp[(y + pad) * wp + pad:]
            for z in range(w):
                dst[z] = src[z]


@jit
def _backward_buffers(x, weight, pad, need_dx):
    """(xp, dplanes, dw_acc, db_acc, dx, dxp) for a backward pass: dplanes one sample's
    output-gradient planes, zeroed (garbage columns stay zero)."""
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    xp = np.zeros(hp * wp + kw, dtype=x.dtype)
    dplanes = np.zeros((o, (hp - kh + 1) * wp), dtype=x.dtype)
    dw_acc = np.zeros((o, kh, kw), dtype=np.float64)
    db_acc = np.zeros(o, dtype=np.float64)
    if need_dx:
        dx = np.empty((n, 1, h, w), dtype=x.dtype)
        dxp = np.empty(hp * wp + kw, dtype=x.dtype)
    else:
        dx = np.empty((0, 1, h, w), dtype=x.dtype)
        dxp = np.empty(0, dtype=x.dtype)
    return xp, dplanes, dw_acc, db_acc, dx, dxp


@jit
def _store_grads(dw_acc, db_acc, dweight, dbias):
    o, kh, kw = dw_acc.shape
    for oi in range(o):
        dbias[oi] = db_acc[oi]
        for i in range(kh):
            for j in range(kw):
                dweight[oi, 0, i, j] = dw_acc[oi, i, j]


@jit_fast
def wide_backward(dout, x, weight, dweight, dbias, pad, need_dx):
    """As conv2d_backward, for one input channel and stride 1."""
    n = x.shape[0]
    o, _, kh, kw = weight.shape
    wp = x.shape[3] + 2 * pad
    oh, ow = dout.shape[2], dout.shape[3]
    xp, dplanes, dw_acc, db_acc, dx, dxp = _backward_buffers(x, weight, pad, need_dx)
    for ni in range(n):
        _padded(x, ni, pad, xp)
        for oi in range(o):
            for y in range(oh):
                src = dout[ni, oi, y]
                dst = dplanes[oi, y * wp:]
                for z in range(ow):
                    dst[z] = src[z]
        _sample_backward(dplanes, xp, weight, wp, dw_acc, db_acc, need_dx, dxp, dx, ni, pad)
    _store_grads(dw_acc, db_acc, dweight, dbias)
    return dx if need_dx else np.empty((0, 0, 0, 0), dtype=x.dtype)


# -- fused with a 2x2 max pool (and a ReLU after it) ------------------------------

@jit
def use_wide_pool(c, stride, pool_kernel, pool_stride):
    """The fused convolution + max pool applies: the wide path, pooled 2x2 stride 2."""
    return use_wide(c, stride) and pool_kernel == 2 and pool_stride == 2


@jit
def _pool_plane(plane, wp, out, arg, ni, oi, relu):
    """2x2 max pool of a wide plane's first ow columns into out[ni, oi] (ReLU'd after,
    when relu), winners' wide indices into arg[ni, oi]. Ties and comparison order as
    pool._maxpool2, so values and winners are the same as the unfused layers'."""
    ph, pw = out.shape[2], out.shape[3]
    for y in range(ph):
        b0 = 2 * y * wp
        r0 = plane[b0:]
        r1 = plane[b0 + wp:]
        o = out[ni, oi, y]
        a = arg[ni, oi, y]
        for z in range(pw):
            j = 2 * z
            best, bi = r0[j], b0 + j
            if r0[j + 1] > best:
                best, bi = r0[j + 1], b0 + j + 1
            if r1[j] > best:
                best, bi = r1[j], b0 + wp + j
            if r1[j + 1] > best:
                best, bi = r1[j + 1], b0 + wp + j + 1
            if relu and not best > 0:
                best = 0.0
            o[z] = best
            a[z] = bi


@jit_fast
def wide_pool_forward(x, weight, bias, pad, relu):
    """maxpool2x2(conv(x, weight) + bias), then ReLU when relu: (out, arg), arg the
    winners' indices in the wide output plane (rows of wp = w + 2*pad), for
    wide_pool_backward. The convolution's output is never stored whole: each
    sample's planes are pooled while they are in L1 (LeNet-5 conv1, batch 64: a
    1.2 MB output written, read back by the pool, and its gradient made, zeroed,
    scattered and read back in the backward pass)."""
    n, _, h, w = x.shape
    o, _, kh, kw = weight.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    oh, ow = hp - kh + 1, wp - kw + 1
    xp = np.zeros(hp * wp + kw, dtype=x.dtype)
    planes = np.empty((3, oh * wp), dtype=x.dtype)
    out = np.empty((n, o, oh // 2, ow // 2), dtype=x.dtype)
    arg = np.empty((n, o, oh // 2, ow // 2), dtype=np.int32)
    grouped = o - o % 3 if kw == 5 else 0
    for ni in range(n):
        _padded(x, ni, pad, xp)
        for o0 in range(0, grouped, 3):
            _taps5x3(planes, xp, weight, bias, o0, wp)
            for k in range(3):
                _pool_plane(planes[k], wp, out, arg, ni, o0 + k, relu)
        for oi in range(grouped, o):
            _taps(planes[0], xp, weight[oi, 0], bias[oi], wp)
            _pool_plane(planes[0], wp, out, arg, ni, oi, relu)
    return out, arg


@jit_fast
def wide_pool_backward(dout, out, arg, x, weight, dweight, dbias, pad, relu, need_dx):
    """Backward of wide_pool_forward: dout (N, O, PH, PW) the gradient of its output
    `out`; overwrite dweight and dbias, return dx (or an empty array). Each winner's
    gradient goes into the sample's zeroed planes, which then run the unfused
    backward's per-sample code: the same sums in the same order, so the same bits."""
    n = x.shape[0]
    o = weight.shape[0]
    wp = x.shape[3] + 2 * pad
    ph, pw = dout.shape[2], dout.shape[3]
    xp, dplanes, dw_acc, db_acc, dx, dxp = _backward_buffers(x, weight, pad, need_dx)
    for ni in range(n):
        _padded(x, ni, pad, xp)
        for oi in range(o):
            plane = dplanes[oi]
            for y in range(ph):
                for z in range(pw):
                    g = dout[ni, oi, y, z]
                    if relu and not out[ni, oi, y, z] > 0:
                        g = 0.0
                    plane[arg[ni, oi, y, z]] += g
        _sample_backward(dplanes, xp, weight, wp, dw_acc, db_acc, need_dx, dxp, dx, ni, pad)
        for oi in range(o):  # back to zero for the next sample: only the winners were set
            plane = dplanes[oi]
            for y in range(ph):
                for z in range(pw):
                    plane[arg[ni, oi, y, z]] = 0.0
    _store_grads(dw_acc, db_acc, dweight, dbias)
    return dx if need_dx else np.empty((0, 0, 0, 0), dtype=x.dtype)
