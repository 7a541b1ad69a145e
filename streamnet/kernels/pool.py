"""Max and average pooling, kernel k and stride s, no padding (PyTorch's floor mode).

Max pooling returns the flat index of each winner inside its input plane so the
backward pass routes the gradient without searching again; overlapping windows
(k > s, as in AlexNet-224) accumulate.
"""
import numpy as np

from ._jit import jit


@jit
def pool_out_size(size, kernel, stride):
    return (size - kernel) // stride + 1


@jit
def _maxpool2(x, out, arg):
    """k = s = 2, the common case, unrolled: LeNet-5 pool1 batch 64 0.64 -> see
    perf/kernels.py layer table."""
    n, c, h, w = x.shape
    oh, ow = out.shape[2], out.shape[3]
    for ni in range(n):
        for ci in range(c):
            for y in range(oh):
                r0 = x[ni, ci, 2 * y]
                r1 = x[ni, ci, 2 * y + 1]
                o = out[ni, ci, y]
                a = arg[ni, ci, y]
                b0 = 2 * y * w
                for z in range(ow):
                    j = 2 * z
                    best, bi = r0[j], b0 + j
                    if r0[j + 1] > best:
                        best, bi = r0[j + 1], b0 + j + 1
                    if r1[j] > best:
                        best, bi = r1[j], b0 + w + j
                    if r1[j + 1] > best:
                        best, bi = r1[j + 1], b0 + w + j + 1
                    o[z] = best
                    a[z] = bi


@jit
def maxpool_forward(x, k, s):
    n, c, h, w = x.shape
    oh = pool_out_size(h, k, s)
    ow = pool_out_size(w, k, s)
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    arg = np.empty((n, c, oh, ow), dtype=np.int32)
    if k == 2 and s == 2:
        _maxpool2(x, out, arg)
        return out, arg
    for ni in range(n):
        for ci in range(c):
            for y in range(oh):
                for z in range(ow):
                    y0 = y * s
                    z0 = z * s
                    best = x[ni, ci, y0, z0]
                    bi = y0 * w + z0
                    for i in range(k):
                        for j in range(k):
                            v = x[ni, ci, y0 + i, z0 + j]
                            if v > best:
                                best = v
                                bi = (y0 + i) * w + z0 + j
                    out[ni, ci, y, z] = best
                    arg[ni, ci, y, z] = bi
    return out, arg


@jit
def maxpool_backward(dout, arg, x_shape):
    n, c, h, w = x_shape
    dx = np.zeros((n, c, h, w), dtype=dout.dtype)
    oh = dout.shape[2]
    ow = dout.shape[3]
    for ni in range(n):
        for ci in range(c):
            plane = dx[ni, ci].reshape(h * w)
            for y in range(oh):
                for z in range(ow):
                    plane[arg[ni, ci, y, z]] += dout[ni, ci, y, z]
    return dx


@jit
def avgpool_forward(x, k, s):
    n, c, h, w = x.shape
    oh = pool_out_size(h, k, s)
    ow = pool_out_size(w, k, s)
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    inv = 1.0 / (k * k)
    for ni in range(n):
        for ci in range(c):
            for y in range(oh):
                for z in range(ow):
                    acc = 0.0
                    for i in range(k):
                        for j in range(k):
                            acc += x[ni, ci, y * s + i, z * s + j]
                    out[ni, ci, y, z] = acc * inv
    return out


@jit
def avgpool_backward(dout, x_shape, k, s):
    n, c, h, w = x_shape
    dx = np.zeros((n, c, h, w), dtype=dout.dtype)
    oh = dout.shape[2]
    ow = dout.shape[3]
    inv = 1.0 / (k * k)
    for ni in range(n):
        for ci in range(c):
            for y in range(oh):
                for z in range(ow):
                    g = dout[ni, ci, y, z] * inv
                    for i in range(k):
                        for j in range(k):
                            dx[ni, ci, y * s + i, z * s + j] += g
    return dx
