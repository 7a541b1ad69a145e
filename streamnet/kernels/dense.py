"""Fully connected layer, weight layout (out, in) as PyTorch's Linear."""
import numpy as np

from ._jit import jit


@jit
def dense_forward(x, weight, bias):
    y = np.dot(x, weight.T)
    n, o = y.shape
    for i in range(n):
        for j in range(o):
            y[i, j] += bias[j]
    return y


@jit
def dense_backward(dy, x, weight, dweight, dbias, need_dx):
    """Overwrite dweight, dbias (views of a flat gradient); return dx or an empty array."""
    n, o = dy.shape
    for j in range(o):
        s = 0.0
        for i in range(n):
            s += dy[i, j]
        dbias[j] = s
    # straight into the caller's view: a temporary plus a copy cost AlexNet-64's fc1
    # (4096 x 1024) two extra passes over 16 MB per step
    np.dot(dy.T, x, dweight)
    if not need_dx:
        return np.empty((0, 0), dtype=dy.dtype)
    return np.dot(dy, weight)
