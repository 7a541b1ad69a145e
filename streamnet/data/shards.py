"""Deterministic shards and per-epoch shuffling.

Shard k of K is fixed for the run (a seeded permutation cut into K parts, sized
by optional weights); each epoch shuffles within the shard with a generator
seeded by (seed, epoch, k), so any unit can recompute any batch of any epoch -
which is what replay after a failure needs.
"""
from __future__ import annotations

import numpy as np


def shard_sizes(n: int, weights: list[float]) -> list[int]:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) == 0 or np.any(w <= 0):
        raise ValueError(f"shard weights must be positive, got {weights}")
    raw = w / w.sum() * n
    sizes = np.floor(raw).astype(int)
    # hand the remainder to the largest fractional parts, lowest index first on ties
    for i in np.argsort(-(raw - sizes), kind="stable")[: n - sizes.sum()]:
        sizes[i] += 1
    return sizes.tolist()


def shard_indices(n: int, num_shards: int, shard: int, seed: int,
                  weights: list[float] | None = None) -> np.ndarray:
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} out of range for {num_shards} shards")
    sizes = shard_sizes(n, weights or [1.0] * num_shards)
    start = sum(sizes[:shard])
    perm = np.random.default_rng([seed, 0x5A4D]).permutation(n)
    return np.sort(perm[start:start + sizes[shard]])


def epoch_order(indices: np.ndarray, seed: int, epoch: int, shard: int) -> np.ndarray:
    return indices[np.random.default_rng([seed, epoch, shard]).permutation(len(indices))]


def batch_slices(count: int, batch: int) -> list[slice]:
    return [slice(i, min(i + batch, count)) for i in range(0, count, batch)]
