"""Inverted dropout with a counter-based random mask.

The mask of element i is a hash of (seed, i) - no generator state, so the same
seed gives the same mask on any thread, and a layer replays a step exactly by
replaying its seed.
"""
import numpy as np

from ._jit import jit


@jit
def _uniform(seed, i):
    # splitmix64 finaliser over seed and index; top 24 bits -> [0, 1)
    z = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(i) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.float64(z >> np.uint64(40)) / 16777216.0


@jit
def dropout_mask(shape_size, p, seed, start=0):
    """float32 mask: 0 where dropped, 1/(1-p) where kept. Element i takes the draw
    of index start + i, so a shard of a batch gets exactly its part of the batch's mask."""
    mask = np.empty(shape_size, dtype=np.float32)
    keep = 1.0 / (1.0 - p)
    for i in range(shape_size):
        mask[i] = keep if _uniform(seed, start + i) >= p else 0.0
    return mask


@jit
def dropout_forward(x, p, seed, start=0):
    """Return (out, mask); start as for dropout_mask."""
    mask = dropout_mask(x.size, p, seed, start).reshape(x.shape)
    return _times(x, mask), mask


@jit
def _times(a, mask):
    out = np.empty_like(a)
    fa = a.reshape(-1)
    fo = out.reshape(-1)
    fm = mask.reshape(-1)
    for i in range(fa.size):
        fo[i] = fa[i] * fm[i]
    return out


@jit
def dropout_backward(dy, mask):
    return _times(dy, mask)
