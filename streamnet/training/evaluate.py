"""Test-set evaluation: accuracy and mean loss, in chunks."""
from __future__ import annotations

import numpy as np

from .. import kernels as K
from ..data import Dataset, Split
from ..nn import Model


def evaluate(model: Model, ds: Dataset, split: Split, limit: int | None = None,
             chunk: int = 500) -> tuple[float, float]:
    n = len(split) if limit is None else min(limit, len(split))
    size = model.input_shape[-1]
    correct, loss_sum = 0, 0.0
    for i in range(0, n, chunk):
        idx = np.arange(i, min(i + chunk, n))
        x, y = ds.batch(split, idx, size)
        logits = model.forward(x, train=False)
        loss, _ = K.softmax_cross_entropy(logits, y)
        loss_sum += float(loss) * len(y)
        correct += int(np.sum(K.argmax_rows(logits) == y))
    return correct / max(n, 1), loss_sum / max(n, 1)
