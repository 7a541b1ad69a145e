"""Local response normalisation across channels, with PyTorch's window convention.

    b_c = a_c * s_c ** -beta,   s_c = k + alpha / size * sum_{c' in W(c)} a_c'^2
    W(c) = [c - size // 2, c + (size - 1) // 2]  clipped to the channel range
"""
import numpy as np

from ._jit import jit


@jit
def lrn_forward(x, size, alpha, beta, k):
    """Return (out, scale); scale (s_c above) is kept for the backward pass."""
    n, c, h, w = x.shape
    scale = np.empty_like(x)
    lo_off = size // 2
    hi_off = (size - 1) // 2
    a = alpha / size
    for ni in range(n):
        for ci in range(c):
            lo = max(0, ci - lo_off)
            hi = min(c - 1, ci + hi_off)
            for y in range(h):
                for z in range(w):
                    acc = 0.0
                    for cj in range(lo, hi + 1):
                        v = x[ni, cj, y, z]
                        acc += v * v
                    scale[ni, ci, y, z] = k + a * acc
    out = np.empty_like(x)
    for ni in range(n):
        for ci in range(c):
            for y in range(h):
                for z in range(w):
                    out[ni, ci, y, z] = x[ni, ci, y, z] * scale[ni, ci, y, z] ** (-beta)
    return out, scale


@jit
def lrn_backward(dy, x, scale, size, alpha, beta):
    n, c, h, w = x.shape
    # t_c = dy_c * a_c * s_c^(-beta-1); dx_j = dy_j s_j^-beta - 2 alpha beta / size * a_j * sum_{c: j in W(c)} t_c
    t = np.empty_like(dy)
    dx = np.empty_like(dy)
    for ni in range(n):
        for ci in range(c):
            for y in range(h):
                for z in range(w):
                    s = scale[ni, ci, y, z]
                    g = dy[ni, ci, y, z]
                    dx[ni, ci, y, z] = g * s ** (-beta)
                    t[ni, ci, y, z] = g * x[ni, ci, y, z] * s ** (-beta - 1.0)
    lo_off = (size - 1) // 2
    hi_off = size // 2
    coef = 2.0 * alpha * beta / size
    for ni in range(n):
        for cj in range(c):
            lo = max(0, cj - lo_off)
            hi = min(c - 1, cj + hi_off)
            for y in range(h):
                for z in range(w):
                    acc = 0.0
                    for ci in range(lo, hi + 1):
                        acc += t[ni, ci, y, z]
                    dx[ni, cj, y, z] -= coef * x[ni, cj, y, z] * acc
    return dx
