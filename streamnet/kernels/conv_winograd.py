"""Stride-1 3x3 convolution as Winograd F(2x2, 3x3) (Lavin and Gray, 2015):
AlexNet's conv3-5, forward and both gradients.

Each 2x2 block of outputs (a "tile") is computed from the 4x4 block of padded input
under it: Y = A^T [(G g G^T) * (B^T d B)] A, * elementwise. Across channels the 16
elementwise products of a tile become 16 GEMMs, M[k] = U[k] @ V[k], with U[k] the
(out, in) matrix of transformed kernels at position k of the 4x4 block and V[k] the
(in, tiles) matrix of transformed input: 16 multiplies per 4 outputs instead of 36,
2.25x fewer GEMM flops than im2col. The transforms are adds and halvings, so the
result differs from im2col + GEMM by rounding only (float32: ~1e-6 relative).

- The input gradient of a stride-1 convolution is a convolution of the output
  gradient by the kernels turned 180 degrees, in and out swapped, padded by 2 - pad:
  the same code, with U[k].T for U[k].
- The weight gradient is the same algorithm transposed: dg = G^T [(A dy A^T) *
  (B^T d B)] G per tile, summed over tiles inside the product, so again 16 GEMMs,
  (out, tiles) @ (tiles, in), over the forward's V, which a training forward
  leaves in the caller's workspace (winograd_size floats) for the backward pass.

Tiles cover the output in steps of 2; an odd output size computes one more row or
column of outputs from zero padding and drops it (its gradient is taken as zero).
"""
import numpy as np

from ._jit import jit
from .bias import bias_grad


@jit
def use_winograd(kh, kw, stride, pad):
    return kh == 3 and kw == 3 and stride == 1 and pad <= 2


def _transform() -> np.ndarray:
    """(16, 9): row 4r + j maps a kernel's 9 taps (row-major) to (G g G^T)[r, j]."""
    g = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
    return np.einsum("ra,jb->rjab", g, g).reshape(16, 9)


GG = _transform()
GG_FLIPPED = np.ascontiguousarray(GG[:, ::-1])  # the same of the kernel turned 180 degrees


@jit
def _tiles(h, w, pad):
    """Tile rows and columns of the output of a 3x3 kernel over h x w padded by pad."""
    return (h + 2 * pad - 1) // 2, (w + 2 * pad - 1) // 2


@jit
def _v_size(x_shape, pad):
    """Floats of V, the transformed input of a convolution of an x of x_shape."""
    n, c, h, w = x_shape
    th, tw = _tiles(h, w, pad)
    return 16 * n * th * tw * c


@jit
def winograd_size(x_shape, o, pad):
    """Floats of the workspace a training forward leaves V in for the backward pass,
    which then transforms the output gradient into it for the input gradient (a
    convolution of the output gradient, padded by 2 - pad): room for either."""
    n, c, h, w = x_shape
    return max(_v_size(x_shape, pad), _v_size((n, o, h + 2 * pad - 2, w + 2 * pad - 2), 2 - pad))


@jit
def _weights(weight, flip):
    """U (16, out, in): G g G^T of each 3x3 kernel g = weight[o, c], as one small GEMM
    over all kernels (flip: of each kernel turned 180 degrees, for the input
    gradient, which also swaps in and out: _winograd multiplies by U[k].T)."""
    o, c = weight.shape[0], weight.shape[1]
    gg = (GG_FLIPPED if flip else GG).astype(weight.dtype)
    u = np.empty((16, o, c), dtype=weight.dtype)
    np.dot(gg, weight.reshape(o * c, 9).T, u.reshape(16, o * c))
    return u


@jit
def _inputs(x, pad, th, tw, v):
    """v (16, in, n*th*tw) = B^T d B of each tile's 4x4 input block d."""
    n, c, h, w = x.shape
    hp, wp = 2 * th + 2, 2 * tw + 2
    t = th * tw
    plane = np.zeros((hp, wp), dtype=x.dtype)  # one padded input plane; the border stays zero
    e = np.empty((4, wp), dtype=x.dtype)
    for ni in range(n):
        for ci in range(c):
            for y in range(h):
                src = x[ni, ci, y]
                dst = plane[y + pad, pad:]
                for z in range(w):
                    dst[z] = src[z]
            for ty in range(th):
                r0, r1, r2, r3 = plane[2 * ty], plane[2 * ty + 1], plane[2 * ty + 2], plane[2 * ty + 3]
                e0, e1, e2, e3 = e[0], e[1], e[2], e[3]
                for z in range(wp):  # B^T down the columns, whole rows at once
                    e0[z] = r0[z] - r2[z]
                    e1[z] = r1[z] + r2[z]
                    e2[z] = r2[z] - r1[z]
                    e3[z] = r1[z] - r3[z]
                base = ni * t + ty * tw
                for k in range(4):  # then B along each row, tile by tile
                    ek = e[k]
                    d0, d1, d2, d3 = v[4 * k, ci], v[4 * k + 1, ci], v[4 * k + 2, ci], v[4 * k + 3, ci]
                    for tx in range(tw):
                        a, b, cc, d = ek[2 * tx], ek[2 * tx + 1], ek[2 * tx + 2], ek[2 * tx + 3]
                        d0[base + tx] = a - cc
                        d1[base + tx] = b + cc
                        d2[base + tx] = cc - b
                        d3[base + tx] = b - d


@jit
def _outputs(m, bias, th, tw, out):
    """out (n, O, oh, ow) = A^T m A + bias, tile by tile, from m (16, O, n*th*tw)."""
    n, o, oh, ow = out.shape
    t = th * tw
    for oi in range(o):
        b = bias[oi]
        for ni in range(n):
            for ty in range(th):
                y0 = 2 * ty
                for tx in range(tw):
                    q = ni * t + ty * tw + tx
                    s0 = m[0, oi, q] + m[4, oi, q] + m[8, oi, q]
                    s1 = m[1, oi, q] + m[5, oi, q] + m[9, oi, q]
                    s2 = m[2, oi, q] + m[6, oi, q] + m[10, oi, q]
                    s3 = m[3, oi, q] + m[7, oi, q] + m[11, oi, q]
                    t0 = m[4, oi, q] - m[8, oi, q] - m[12, oi, q]
                    t1 = m[5, oi, q] - m[9, oi, q] - m[13, oi, q]
                    t2 = m[6, oi, q] - m[10, oi, q] - m[14, oi, q]
                    t3 = m[7, oi, q] - m[11, oi, q] - m[15, oi, q]
                    x0 = 2 * tx
                    out[ni, oi, y0, x0] = s0 + s1 + s2 + b
                    if x0 + 1 < ow:
                        out[ni, oi, y0, x0 + 1] = s1 - s2 - s3 + b
                    if y0 + 1 < oh:
                        out[ni, oi, y0 + 1, x0] = t0 + t1 + t2 + b
                        if x0 + 1 < ow:
                            out[ni, oi, y0 + 1, x0 + 1] = t1 - t2 - t3 + b


@jit
def _gradients(dout, th, tw, g):
    """g (16, O, n*th*tw) = A dy A^T of each tile's 2x2 output gradient dy (zero
    past the output's edge)."""
    n, o, oh, ow = dout.shape
    t = th * tw
    zero = np.zeros(1, dtype=dout.dtype)[0]  # not 0.0: a float64 literal would make the sums float64
    for ni in range(n):
        for oi in range(o):
            for ty in range(th):
                y0 = 2 * ty
                for tx in range(tw):
                    x0 = 2 * tx
                    a = dout[ni, oi, y0, x0]
                    b = dout[ni, oi, y0, x0 + 1] if x0 + 1 < ow else zero
                    c = dout[ni, oi, y0 + 1, x0] if y0 + 1 < oh else zero
                    d = dout[ni, oi, y0 + 1, x0 + 1] if y0 + 1 < oh and x0 + 1 < ow else zero
                    q = ni * t + ty * tw + tx
                    # A dy has rows (a, b), (a+c, b+d), (a-c, b-d), (-c, -d); A^T takes
                    # each row (p, r) to (p, p+r, p-r, -r)
                    g[0, oi, q], g[1, oi, q], g[2, oi, q], g[3, oi, q] = a, a + b, a - b, -b
                    p, r = a + c, b + d
                    g[4, oi, q], g[5, oi, q], g[6, oi, q], g[7, oi, q] = p, p + r, p - r, -r
                    p, r = a - c, b - d
                    g[8, oi, q], g[9, oi, q], g[10, oi, q], g[11, oi, q] = p, p + r, p - r, -r
                    g[12, oi, q], g[13, oi, q], g[14, oi, q], g[15, oi, q] = -c, -c - d, d - c, d


@jit
def _convolve(x, u, trans, bias, pad, v):
    """The convolution of x by the kernels transformed into u (by u[k].T with trans),
    with v (16 * n*th*tw * C floats) as the transformed input's workspace."""
    n, c, h, w = x.shape
    o = u.shape[2] if trans else u.shape[1]
    th, tw = _tiles(h, w, pad)
    p = n * th * tw
    vv = v[:16 * c * p].reshape(16, c, p)
    _inputs(x, pad, th, tw, vv)
    m = np.empty((16, o, p), dtype=x.dtype)
    for k in range(16):
        if trans:
            np.dot(u[k].T, vv[k], m[k])
        else:
            np.dot(u[k], vv[k], m[k])
    out = np.empty((n, o, h + 2 * pad - 2, w + 2 * pad - 2), dtype=x.dtype)
    _outputs(m, bias, th, tw, out)
    return out


@jit
def winograd_forward(x, weight, bias, pad, work):
    """out (N, O, OH, OW) = conv(x, weight (O, C, 3, 3), stride 1, pad) + bias; work:
    winograd_size floats, in which V stays for winograd_backward (or an empty array:
    a workspace of its own, for a forward with no backward pass)."""
    if work.size == 0:  # room for V alone: no backward pass will use it
        work = np.empty(_v_size(x.shape, pad), dtype=x.dtype)
    return _convolve(x, _weights(weight, False), False, bias, pad, work)


@jit
def winograd_backward(dout, x, weight, dweight, dbias, pad, need_dx, work, kept):
    """Overwrite dweight and dbias; return dx, or an empty array without need_dx. kept:
    work holds the V that winograd_forward left there (else it is rebuilt from x).
    Uses work up: the input gradient transforms the output gradient into it."""
    n, c, h, w = x.shape
    o = weight.shape[0]
    th, tw = _tiles(h, w, pad)
    p = n * th * tw
    if work.size == 0:
        work = np.empty(winograd_size(x.shape, o, pad), dtype=x.dtype)
    v = work[:16 * c * p].reshape(16, c, p)
    if not kept:
        _inputs(x, pad, th, tw, v)
    bias_grad(dout.reshape(n, o, dout.shape[2] * dout.shape[3]), dbias)
    g = np.empty((16, o, p), dtype=x.dtype)
    _gradients(dout, th, tw, g)
    m = np.empty((16, o, c), dtype=x.dtype)
    for k in range(16):
        np.dot(g[k], v[k].T, m[k])
    np.dot(m.reshape(16, o * c).T, GG.astype(x.dtype), dweight.reshape(o * c, 9))  # G^T m G
    if not need_dx:
        return np.empty((0, 0, 0, 0), dtype=x.dtype)
    zero = np.zeros(c, dtype=x.dtype)
    return _convolve(dout, _weights(weight, True), True, zero, 2 - pad, work)
