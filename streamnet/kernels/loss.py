"""Mean softmax cross-entropy over a batch, forward and backward in one pass."""
import numpy as np

from ._jit import jit


@jit
def softmax_cross_entropy(logits, labels):
    """Return (mean loss as float64, dlogits). labels are integer class ids."""
    n, k = logits.shape
    dlogits = np.empty_like(logits)
    total = 0.0
    inv_n = 1.0 / n
    for i in range(n):
        m = logits[i, 0]
        for j in range(1, k):
            if logits[i, j] > m:
                m = logits[i, j]
        z = 0.0
        for j in range(k):
            z += np.exp(np.float64(logits[i, j]) - m)
        log_z = np.log(z) + m
        total += log_z - logits[i, labels[i]]
        for j in range(k):
            dlogits[i, j] = np.exp(np.float64(logits[i, j]) - log_z) * inv_n
        dlogits[i, labels[i]] -= inv_n
    return total * inv_n, dlogits


@jit
def argmax_rows(logits):
    n, k = logits.shape
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        best = 0
        for j in range(1, k):
            if logits[i, j] > logits[i, best]:
                best = j
        out[i] = best
    return out
