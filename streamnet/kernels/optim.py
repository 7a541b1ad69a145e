"""Optimiser steps and parameter averaging over flat float32 vectors, in place."""
import numpy as np

from ._jit import jit


@jit
def sgd_step(params, grads, velocity, lr, momentum, weight_decay, nesterov):
    """PyTorch's SGD: g += wd*p; v = mu*v + g; p -= lr * (g + mu*v if nesterov else v).

    With momentum == 0 velocity is not touched (it may be an empty array).
    """
    for i in range(params.size):
        g = grads[i] + weight_decay * params[i]
        if momentum != 0.0:
            v = momentum * velocity[i] + g
            velocity[i] = v
            if nesterov:
                g = g + momentum * v
            else:
                g = v
        params[i] -= lr * g


SUM_BLOCK = 2048  # entries per block of the blocked loops below (16 KiB of float64 sums: stays in L1)


@jit
def weighted_average(out, vectors, weights):
    """out = sum_k weights[k] * vectors[k] / sum(weights); vectors is (K, P).

    Summation runs in float64 in a fixed order (k = 0..K-1), so the result does not
    depend on which contribution arrived first.

    Block by block (_block_sum, as weighted_sum_rows), so the inner loops run along
    contiguous memory and vectorise; each entry sees the same float64 operations in
    the same order as with k innermost, so the result is the same (LeNet-5's 61,706
    entries, 2 rows: 88 -> 34-42 us).
    """
    k, p = vectors.shape
    total = 0.0
    for j in range(k):
        total += weights[j]
    acc = np.empty(SUM_BLOCK, dtype=np.float64)
    for a in range(0, p, SUM_BLOCK):
        m = min(p, a + SUM_BLOCK) - a
        _block_sum(acc, vectors, weights, a, m)
        dst = out[a:a + m]
        for t in range(m):
            dst[t] = acc[t] / total


@jit
def weighted_sum_rows(out, rows, weights, lo, hi):
    """out[lo:hi] = sum_k weights[k] * rows[k, lo:hi], summed in float64 in the fixed
    order k = 0..K-1: several threads may each reduce their own [lo, hi) of one
    vector at once, and the result never depends on which finished first.

    Row by row over blocks of SUM_BLOCK entries, so every inner loop runs along
    contiguous memory and vectorises; the sum with k innermost (strided across
    rows) did not: LeNet-5's 30,853-entry half of 2 rows 109 -> 10 us.
    """
    acc = np.empty(SUM_BLOCK, dtype=np.float64)
    for a in range(lo, hi, SUM_BLOCK):
        m = min(hi, a + SUM_BLOCK) - a
        _block_sum(acc, rows, weights, a, m)
        dst = out[a:a + m]
        for t in range(m):
            dst[t] = acc[t]


@jit
def _block_sum(acc, rows, weights, a, m):
    """acc[:m] = sum_k weights[k] * rows[k, a:a + m] in float64, k = 0..K-1 in order,
    each row's pass along contiguous memory."""
    src = rows[0, a:a + m]
    wj = weights[0]
    for t in range(m):
        acc[t] = wj * src[t]
    for j in range(1, rows.shape[0]):
        src = rows[j, a:a + m]
        wj = weights[j]
        for t in range(m):
            acc[t] += wj * src[t]


@jit
def all_finite(x):
    """No NaN or inf in x. Block by block, with an OR over the block that vectorises
    (v - v is 0 exactly when v is finite), not an exit at the first bad entry, which
    did not: 62k float32 21 -> 3 us."""
    n = x.size
    for a in range(0, n, SUM_BLOCK):
        bad = False
        for i in range(a, min(n, a + SUM_BLOCK)):
            v = x.flat[i]
            bad |= not (v - v == 0)
        if bad:
            return False
    return True
