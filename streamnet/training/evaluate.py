"""Test-set evaluation: accuracy and mean loss, in chunks - of a whole split, or of a
contiguous range of it as counts that add up (the eval bolt's tasks each take one)."""
from __future__ import annotations

import numpy as np

from .. import kernels as K
from ..data import Dataset, Split
from ..nn import Model


def evaluated_size(split: Split, limit: int | None = None) -> int:
    """How many samples of `split` an evaluation with `limit` covers."""
    return len(split) if limit is None else min(limit, len(split))


def evaluate_counts(model: Model, ds: Dataset, split: Split, lo: int, hi: int,
                    chunk: int = 500) -> tuple[int, float, int]:
    """(correct predictions, summed loss, samples) over samples [lo, hi) of `split`."""
    size = model.input_shape[-1]
    correct, loss_sum = 0, 0.0
    for i in range(lo, hi, chunk):
        idx = np.arange(i, min(i + chunk, hi))
        x, y = ds.batch(split, idx, size)
        logits = model.forward(x, train=False)
        loss, _ = K.softmax_cross_entropy(logits, y)
        loss_sum += float(loss) * len(y)
        correct += int(np.sum(K.argmax_rows(logits) == y))
    return correct, loss_sum, max(hi - lo, 0)


def evaluate(model: Model, ds: Dataset, split: Split, limit: int | None = None,
             chunk: int = 500) -> tuple[float, float]:
    """(accuracy, mean loss) over the first `limit` samples of `split` (all: None)."""
    correct, loss_sum, n = evaluate_counts(model, ds, split, 0, evaluated_size(split, limit), chunk)
    return correct / max(n, 1), loss_sum / max(n, 1)
