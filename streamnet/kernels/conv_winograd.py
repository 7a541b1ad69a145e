"""Stride-1 3x3 and 5x5 convolution as Winograd F(2x2, 3x3) and F(2x2, 5x5) (Lavin
and Gray, 2015): AlexNet's conv2-5, forward and both gradients.

Each 2x2 block of outputs (a "tile") of an r x r kernel is computed from the a x a
block of padded input under it (a = r + 1): Y = A^T [(G g G^T) * (B^T d B)] A, *
elementwise. Across channels the a*a elementwise products of a tile become a*a
GEMMs, M[k] = U[k] @ V[k], with U[k] the (out, in) matrix of transformed kernels at
position k of the a x a block and V[k] the (in, tiles) matrix of transformed input:
16 multiplies per 4 outputs instead of 36 for 3x3 (2.25x fewer GEMM flops than
im2col), 36 instead of 100 for 5x5 (2.78x).

The matrices come from the Cook-Toom construction at the points 0, 1, -1 (3x3) and
0, 1, -1, 2, -1/2 (5x5), each with the point at infinity. The 3x3 transforms are
adds and halvings, so the result differs from im2col + GEMM by rounding only. The
5x5 ones have entries up to 5/2 and 16/15: in float32 against a float64 convolution
(AlexNet-64's conv2, 64 channels) 1.1e-6 of the largest output, where im2col + GEMM
is at 5e-7 (the points 2, -2 gave 2.6e-6, and 1/2, -1/2 2.8e-6).

Tiles are laid out batch-minor, column q = tile * n + sample of every V and M, so
each transform is a few axpys over a tile row's tiles and samples at once, which
vectorise (the transforms had been per tile, scalar: 12 of AlexNet-64 conv4's
42 ms forward at batch 32).

- The weight gradient is the same algorithm transposed: dg = G^T [(A dy A^T) *
  (B^T d B)] G per tile, summed over tiles inside the product, so again a*a GEMMs,
  (out, tiles) @ (tiles, in), over the forward's V, which a training forward
  leaves in the caller's workspace (winograd_size floats) for the backward pass.
- The input gradient is the forward's adjoint from the same A dy A^T: a*a GEMMs
  U[k].T @ (A dy A^T)[k], then each tile's B (.) B^T added into the padded input
  (_scatter). It had been a convolution of the output gradient by the kernels
  turned 180 degrees, which transformed the output gradient a second time, as an
  input (AlexNet-64 conv2: 25 ms for its 192 channels, 57 MB written).

Tiles cover the output in steps of 2; an odd output size computes one more row or
column of outputs from zero padding and drops it (its gradient is taken as zero).
"""
import numpy as np

from ._jit import jit
from .bias import bias_grad

# (A^T, G, B^T) of F(2, 3) and F(2, 5); test_kernel_conv_winograd checks that each
# triple computes a correlation (B^T is applied written out: _bt4, _bt6)
AT3 = np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]])
G3 = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
BT3 = np.array([[1.0, 0.0, -1.0, 0.0], [0.0, 1.0, 1.0, 0.0], [0.0, -1.0, 1.0, 0.0], [0.0, 1.0, 0.0, -1.0]])
AT5 = np.array([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, 2.0, -0.5, 1.0]])
G5 = np.array([[1.0, 0.0, 0.0, 0.0, 0.0],
               [-1 / 3, -1 / 3, -1 / 3, -1 / 3, -1 / 3],
               [1 / 3, -1 / 3, 1 / 3, -1 / 3, 1 / 3],
               [1 / 15, 2 / 15, 4 / 15, 8 / 15, 16 / 15],
               [-16 / 15, 8 / 15, -4 / 15, 2 / 15, -1 / 15],
               [0.0, 0.0, 0.0, 0.0, 1.0]])
BT5 = np.array([[1.0, 1.5, -2.0, -1.5, 1.0, 0.0],
                [0.0, -1.0, -2.5, -0.5, 1.0, 0.0],
                [0.0, 1.0, 0.5, -2.5, 1.0, 0.0],
                [0.0, -0.5, -1.0, 0.5, 1.0, 0.0],
                [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
                [0.0, 1.0, 1.5, -2.0, -1.5, 1.0]])


def _kernel_transform(g: np.ndarray) -> np.ndarray:
    """(a*a, r*r): row a*k + l maps a kernel's taps (row-major) to (G g G^T)[k, l]."""
    a, r = g.shape
    return np.einsum("ka,lb->klab", g, g).reshape(a * a, r * r)


GG3, GG5 = _kernel_transform(G3), _kernel_transform(G5)


@jit
def use_winograd(kh, kw, stride, pad):
    return kh == kw and (kh == 3 or kh == 5) and stride == 1 and pad <= kh - 1


@jit
def _tiles(h, w, r, pad):
    """Tile rows and columns of the output of an r x r kernel over h x w padded by pad."""
    return (h + 2 * pad - r + 2) // 2, (w + 2 * pad - r + 2) // 2


@jit
def _regions(x_shape, o, r, pad):
    """Floats of the two regions of a training workspace: the first holds V of the
    forward pass, then the input gradient's U^T (A dy A^T); the second M of the
    forward, then G = A dy A^T of the backward. A workspace kept per layer saves
    allocating them each step: fresh, they cost page faults (AlexNet-64 conv2 at
    batch 32: a 57 MB M, forward 83 ms, against 37 ms of work)."""
    n, c, h, w = x_shape
    a2 = (r + 1) * (r + 1)
    th, tw = _tiles(h, w, r, pad)
    p = n * th * tw
    return a2 * c * p, a2 * o * p


@jit
def winograd_size(x_shape, o, r, pad):
    """Floats of the workspace a training forward leaves V in for the backward pass."""
    first, second = _regions(x_shape, o, r, pad)
    return first + second


@jit
def _at(r):
    return AT3 if r == 3 else AT5


@jit
def _gg(r):
    return GG3 if r == 3 else GG5


@jit
def _weights(weight):
    """U (a*a, out, in): G g G^T of each kernel g = weight[o, c], as one small GEMM
    over all kernels."""
    o, c, r = weight.shape[0], weight.shape[1], weight.shape[2]
    gg = _gg(r).astype(weight.dtype)
    u = np.empty((gg.shape[0], o, c), dtype=weight.dtype)
    np.dot(gg, weight.reshape(o * c, r * r).T, u.reshape(gg.shape[0], o * c))
    return u


# B^T's entries past 1, as float32: a float64 literal would make float32 sums float64
HALF, ONE_HALF, TWO, TWO_HALF = np.float32(0.5), np.float32(1.5), np.float32(2.0), np.float32(2.5)


@jit
def _bt4(s0, s1, s2, s3, d0, d1, d2, d3):
    """d_k = sum_j BT3[k, j] s_j, elementwise over equal-length runs."""
    for i in range(d0.size):
        x0, x1, x2, x3 = s0[i], s1[i], s2[i], s3[i]
        d0[i] = x0 - x2
        d1[i] = x1 + x2
        d2[i] = x2 - x1
        d3[i] = x1 - x3


@jit
def _bt6(s0, s1, s2, s3, s4, s5, d0, d1, d2, d3, d4, d5):
    """d_k = sum_j BT5[k, j] s_j, elementwise over equal-length runs: written out, each
    input read once and each output written once (as six passes of axpys the input
    transform of AlexNet-64 conv2's output gradient took 32 ms at batch 32)."""
    for i in range(d0.size):
        x0, x1, x2, x3, x4, x5 = s0[i], s1[i], s2[i], s3[i], s4[i], s5[i]
        d0[i] = x0 + ONE_HALF * x1 - TWO * x2 - ONE_HALF * x3 + x4
        d1[i] = x4 - x1 - TWO_HALF * x2 - HALF * x3
        d2[i] = x1 + HALF * x2 - TWO_HALF * x3 + x4
        d3[i] = HALF * (x3 - x1) - x2 + x4
        d4[i] = TWO * (x1 - x3) - x2 + x4
        d5[i] = x1 + ONE_HALF * x2 - TWO * x3 - ONE_HALF * x4 + x5


@jit
def _inputs(x, r, pad, th, tw, v):
    """v (a*a, in, th*tw*n) = B^T d B of each tile's a x a input block d.

    A padded input plane is held batch-minor with its even and odd columns apart, so
    for one tile row the inputs of every tile at block column j are one contiguous
    run (tile, sample): B along the rows is elementwise over runs of tw*n floats."""
    n, c, h, w = x.shape
    a = r + 1
    hp, half = 2 * th + r - 1, tw + r // 2  # rows; columns of each parity
    plane = np.zeros((hp, 2, half, n), dtype=x.dtype)  # column z at [z % 2, z // 2]; the border stays zero
    rows = plane.reshape(hp, 2 * half * n)
    e = np.empty((a, 2, half * n), dtype=x.dtype)  # B^T down the columns of one tile row
    run = tw * n
    for ci in range(c):
        for ni in range(n):
            for y in range(h):
                src = x[ni, ci, y]
                dst = plane[y + pad]
                for z in range(w):
                    dst[(z + pad) % 2, (z + pad) // 2, ni] = src[z]
        for ty in range(th):
            q = ty * run
            if a == 4:
                _bt4(rows[2 * ty], rows[2 * ty + 1], rows[2 * ty + 2], rows[2 * ty + 3],
                     e[0].reshape(-1), e[1].reshape(-1), e[2].reshape(-1), e[3].reshape(-1))
                for k in range(a):  # then B along the row, all its tiles at once
                    ev, od = e[k, 0], e[k, 1]
                    _bt4(ev[:run], od[:run], ev[n:n + run], od[n:n + run],
                         v[4 * k, ci][q:q + run], v[4 * k + 1, ci][q:q + run],
                         v[4 * k + 2, ci][q:q + run], v[4 * k + 3, ci][q:q + run])
            else:
                _bt6(rows[2 * ty], rows[2 * ty + 1], rows[2 * ty + 2], rows[2 * ty + 3], rows[2 * ty + 4],
                     rows[2 * ty + 5], e[0].reshape(-1), e[1].reshape(-1), e[2].reshape(-1),
                     e[3].reshape(-1), e[4].reshape(-1), e[5].reshape(-1))
                for k in range(a):
                    ev, od = e[k, 0], e[k, 1]
                    _bt6(ev[:run], od[:run], ev[n:n + run], od[n:n + run], ev[2 * n:2 * n + run],
                         od[2 * n:2 * n + run], v[6 * k, ci][q:q + run], v[6 * k + 1, ci][q:q + run],
                         v[6 * k + 2, ci][q:q + run], v[6 * k + 3, ci][q:q + run],
                         v[6 * k + 4, ci][q:q + run], v[6 * k + 5, ci][q:q + run])


@jit
def _b4(m0, m1, m2, m3, t0, t1, t2, t3):
    """t_j = sum_l BT3[l, j] m_l (B: the adjoint of _bt4), elementwise."""
    for i in range(t0.size):
        x0, x1, x2, x3 = m0[i], m1[i], m2[i], m3[i]
        t0[i] = x0
        t1[i] = x1 - x2 + x3
        t2[i] = x1 + x2 - x0
        t3[i] = -x3


@jit
def _b6(m0, m1, m2, m3, m4, m5, t0, t1, t2, t3, t4, t5):
    """t_j = sum_l BT5[l, j] m_l (B: the adjoint of _bt6), elementwise."""
    for i in range(t0.size):
        x0, x1, x2, x3, x4, x5 = m0[i], m1[i], m2[i], m3[i], m4[i], m5[i]
        t0[i] = x0
        t1[i] = ONE_HALF * x0 - x1 + x2 - HALF * x3 + TWO * x4 + x5
        t2[i] = HALF * x2 - TWO * x0 - TWO_HALF * x1 - x3 - x4 + ONE_HALF * x5
        t3[i] = HALF * x3 - ONE_HALF * x0 - HALF * x1 - TWO_HALF * x2 - TWO * (x4 + x5)
        t4[i] = x0 + x1 + x2 + x3 + x4 - ONE_HALF * x5
        t5[i] = x5


@jit
def _scatter(m, r, pad, th, tw, dx):
    """dx (n, C, h, w) = the adjoint of _inputs applied to m (a*a, C, th*tw*n): each
    tile's B m B^T added into a padded input plane at the tile's block (blocks
    overlap), the padding dropped. Planes and runs are laid out as in _inputs."""
    n, c, h, w = dx.shape
    a = r + 1
    hp, half = 2 * th + r - 1, tw + r // 2
    plane = np.empty((hp, 2, half, n), dtype=dx.dtype)
    rows = plane.reshape(hp, 2 * half * n)
    e = np.empty((a, 2, half * n), dtype=dx.dtype)  # B along the rows of one tile row, block row k
    run = tw * n
    t = np.empty((a, run), dtype=dx.dtype)          # one block row's a columns, before they are added
    tr = np.empty((a, 2 * half * n), dtype=dx.dtype)  # one tile row's a plane rows, before they are added
    flat = plane.reshape(-1)
    for ci in range(c):
        for i in range(flat.size):
            flat[i] = 0.0
        for ty in range(th):
            q = ty * run
            for k in range(a):
                ek = e[k].reshape(-1)
                for i in range(ek.size):
                    ek[i] = 0.0
                if a == 4:
                    _b4(m[4 * k, ci][q:q + run], m[4 * k + 1, ci][q:q + run], m[4 * k + 2, ci][q:q + run],
                        m[4 * k + 3, ci][q:q + run], t[0], t[1], t[2], t[3])
                else:
                    _b6(m[6 * k, ci][q:q + run], m[6 * k + 1, ci][q:q + run], m[6 * k + 2, ci][q:q + run],
                        m[6 * k + 3, ci][q:q + run], m[6 * k + 4, ci][q:q + run],
                        m[6 * k + 5, ci][q:q + run], t[0], t[1], t[2], t[3], t[4], t[5])
                for j in range(a):  # block column j of every tile: one run, overlapping j + 2's
                    dst = e[k, j % 2][(j // 2) * n:(j // 2) * n + run]
                    src = t[j]
                    for i in range(run):
                        dst[i] += src[i]
            if a == 4:
                _b4(e[0].reshape(-1), e[1].reshape(-1), e[2].reshape(-1), e[3].reshape(-1),
                    tr[0], tr[1], tr[2], tr[3])
            else:
                _b6(e[0].reshape(-1), e[1].reshape(-1), e[2].reshape(-1), e[3].reshape(-1),
                    e[4].reshape(-1), e[5].reshape(-1), tr[0], tr[1], tr[2], tr[3], tr[4], tr[5])
            for j in range(a):  # the tile row's rows, overlapping the next tile row's
                dst = rows[2 * ty + j]
                src = tr[j]
                for i in range(dst.size):
                    dst[i] += src[i]
        for ni in range(n):
            for y in range(h):
                src = plane[y + pad]
                d = dx[ni, ci, y]
                for z in range(w):
                    d[z] = src[(z + pad) % 2, (z + pad) // 2, ni]


@jit
def _outputs(m, bias, r, th, tw, out):
    """out (n, O, oh, ow) = A^T m A + bias, tile by tile, from m (a*a, O, th*tw*n)."""
    n, o, oh, ow = out.shape
    a = r + 1
    at = _at(r).astype(out.dtype)
    run = tw * n
    f = np.empty((2, a, run), dtype=out.dtype)  # A^T m of one tile row
    y = np.empty((2, 2, run), dtype=out.dtype)  # its 2x2 outputs, batch-minor
    for oi in range(o):
        b = bias[oi]
        for ty in range(th):
            q = ty * run
            for l in range(a):
                f0, f1 = f[0, l], f[1, l]
                for i in range(run):
                    f0[i] = 0.0
                    f1[i] = 0.0
                for k in range(a):
                    src = m[a * k + l, oi][q:q + run]
                    c0, c1 = at[0, k], at[1, k]
                    for i in range(run):
                        f0[i] += c0 * src[i]
                        f1[i] += c1 * src[i]
            for yi in range(2):
                for xi in range(2):
                    dst = y[yi, xi]
                    for i in range(run):
                        dst[i] = b
                    for l in range(a):
                        cf = at[xi, l]
                        if cf != 0.0:
                            src = f[yi, l]
                            for i in range(run):
                                dst[i] += cf * src[i]
            for yi in range(min(2, oh - 2 * ty)):
                for ni in range(n):
                    row = out[ni, oi, 2 * ty + yi]
                    for tx in range(tw):
                        row[2 * tx] = y[yi, 0, tx * n + ni]
                        if 2 * tx + 1 < ow:
                            row[2 * tx + 1] = y[yi, 1, tx * n + ni]


@jit
def _gradients(dout, r, th, tw, g):
    """g (a*a, O, th*tw*n) = A dy A^T of each tile's 2x2 output gradient dy (zero
    past the output's edge)."""
    n, o, oh, ow = dout.shape
    a = r + 1
    at = _at(r).astype(dout.dtype)
    run = tw * n
    plane = np.zeros((2 * th, 2, run), dtype=dout.dtype)  # column 2*tx + xi at [xi, tx*n:]; past the edge stays zero
    h = np.empty((a, 2, run), dtype=dout.dtype)
    for oi in range(o):
        for ni in range(n):
            for yy in range(oh):
                src = dout[ni, oi, yy]
                dst = plane[yy]
                for z in range(ow):
                    dst[z % 2, (z // 2) * n + ni] = src[z]
        for ty in range(th):
            q = ty * run
            for k in range(a):  # A dy: (a, 2)
                c0, c1 = at[0, k], at[1, k]
                for xi in range(2):
                    top, bottom, dst = plane[2 * ty, xi], plane[2 * ty + 1, xi], h[k, xi]
                    for i in range(run):
                        dst[i] = c0 * top[i] + c1 * bottom[i]
            for k in range(a):  # (A dy) A^T
                left, right = h[k, 0], h[k, 1]
                for l in range(a):
                    c0, c1 = at[0, l], at[1, l]
                    dst = g[a * k + l, oi][q:q + run]
                    for i in range(run):
                        dst[i] = c0 * left[i] + c1 * right[i]


@jit
def _convolve(x, u, bias, r, pad, v, mm):
    """The convolution of x by the kernels transformed into u, with v (a*a * th*tw*n
    * C floats) as the transformed input's workspace and mm (a*a * th*tw*n * O
    floats) as the products'."""
    n, c, h, w = x.shape
    a2, o = u.shape[0], u.shape[1]
    th, tw = _tiles(h, w, r, pad)
    p = n * th * tw
    vv = v[:a2 * c * p].reshape(a2, c, p)
    _inputs(x, r, pad, th, tw, vv)
    m = mm[:a2 * o * p].reshape(a2, o, p)
    for k in range(a2):
        np.dot(u[k], vv[k], m[k])
    out = np.empty((n, o, h + 2 * pad - r + 1, w + 2 * pad - r + 1), dtype=x.dtype)
    _outputs(m, bias, r, th, tw, out)
    return out


@jit
def winograd_forward(x, weight, bias, pad, work):
    """out (N, O, OH, OW) = conv(x, weight (O, C, r, r), stride 1, pad) + bias; work:
    winograd_size floats, in which V stays for winograd_backward (or an empty array:
    a workspace of its own, for a forward with no backward pass)."""
    n, c, h, w = x.shape
    o, r = weight.shape[0], weight.shape[2]
    u = _weights(weight)
    if work.size == 0:  # no backward pass will use it: room for this pass alone
        th, tw = _tiles(h, w, r, pad)
        p = u.shape[0] * n * th * tw
        return _convolve(x, u, bias, r, pad, np.empty(p * c, dtype=x.dtype), np.empty(p * o, dtype=x.dtype))
    first = _regions(x.shape, o, r, pad)[0]
    return _convolve(x, u, bias, r, pad, work[:first], work[first:])


@jit
def winograd_backward(dout, x, weight, dweight, dbias, pad, need_dx, work, kept):
    """Overwrite dweight and dbias; return dx, or an empty array without need_dx. kept:
    work holds the V that winograd_forward left there (else it is rebuilt from x).
    Uses work up: the input gradient is computed in it (see _regions)."""
    n, c, h, w = x.shape
    o, r = weight.shape[0], weight.shape[2]
    a2 = (r + 1) * (r + 1)
    th, tw = _tiles(h, w, r, pad)
    p = n * th * tw
    if work.size == 0:
        work = np.empty(winograd_size(x.shape, o, r, pad), dtype=x.dtype)
    first = _regions(x.shape, o, r, pad)[0]
    v = work[:a2 * c * p].reshape(a2, c, p)
    if not kept:
        _inputs(x, r, pad, th, tw, v)
    bias_grad(dout.reshape(n, o, dout.shape[2] * dout.shape[3]), dbias)
    g = work[first:first + a2 * o * p].reshape(a2, o, p)
    _gradients(dout, r, th, tw, g)
    m = np.empty((a2, o, c), dtype=x.dtype)
    for k in range(a2):
        np.dot(g[k], v[k].T, m[k])
    np.dot(m.reshape(a2, o * c).T, _gg(r).astype(x.dtype), dweight.reshape(o * c, r * r))  # G^T m G
    if not need_dx:
        return np.empty((0, 0, 0, 0), dtype=x.dtype)
    u = _weights(weight)
    vbar = v  # V is read: its room takes U^T G, the gradient of the transformed input
    for k in range(a2):
        np.dot(u[k].T, g[k], vbar[k])
    dx = np.empty((n, c, h, w), dtype=x.dtype)
    _scatter(vbar, r, pad, th, tw, dx)
    return dx
