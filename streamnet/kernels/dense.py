"""Fully connected layer, weight layout (out, in) as PyTorch's Linear.

For big weights the GEMMs run transposed, with the weight as the tall operand
(y^T = W x^T, dx^T = W^T dy^T, dW = dy^T x): OpenBLAS is faster with the big
dimension as M than with a batch of 16-64 rows as M. One thread, same process,
old vs new: AlexNet-64 fc1 (batch 32, 4096 -> 1024) forward 4.51 -> 3.69 ms,
backward 13.07 -> 12.63 ms; AlexNet-224 fc1 (batch 16, 6400 -> 4096) 20.8 ->
17.2 ms and 58.3 -> 45.6 ms. For LeNet-5's small layers the plain form is a
little faster (fc1 backward 0.138 against 0.171 ms), hence TALL.
"""
import numpy as np

from ._jit import jit

TALL = 1 << 18  # weights with at least this many entries use the transposed form


@jit
def dense_forward(x, weight, bias):
    n = x.shape[0]
    o = weight.shape[0]
    if weight.size < TALL:
        y = np.dot(x, weight.T)
        for i in range(n):
            for j in range(o):
                y[i, j] += bias[j]
        return y
    yt = np.dot(weight, np.ascontiguousarray(x.T))
    y = np.empty((n, o), dtype=yt.dtype)
    for j in range(o):
        b = bias[j]
        row = yt[j]
        for i in range(n):
            y[i, j] = row[i] + b
    return y


@jit
def dense_backward(dy, x, weight, dweight, dbias, need_dx):
    """Overwrite dweight, dbias (views of a flat gradient); return dx or an empty array."""
    n, o = dy.shape
    dyt = np.ascontiguousarray(dy.T)
    for j in range(o):
        row = dyt[j]
        s = 0.0
        for i in range(n):
            s += row[i]
        dbias[j] = s
    # straight into the caller's view: a temporary plus a copy cost AlexNet-64's fc1
    # (4096 x 1024) two extra passes over 16 MB per step
    np.dot(dyt, x, dweight)
    if not need_dx:
        return np.empty((0, 0), dtype=dy.dtype)
    if weight.size < TALL:
        return np.dot(dy, weight)
    return np.ascontiguousarray(np.dot(weight.T, dyt).T)


@jit
def dense_relu_forward(x, weight, bias):
    """relu(dense_forward(x, weight, bias)), in one call: a layer call fewer per
    step, each of which re-takes the GIL (see nn/parallel.py)."""
    y = dense_forward(x, weight, bias)
    flat = y.reshape(-1)
    for i in range(flat.size):
        v = flat[i]
        flat[i] = v if v > 0 else 0.0
    return y


@jit
def dense_relu_backward(dy, out, x, weight, dweight, dbias, need_dx):
    """dense_backward of relu_backward(dy, out): out is dense_relu_forward's output."""
    g = np.empty_like(dy)
    gf, df, of = g.reshape(-1), dy.reshape(-1), out.reshape(-1)
    for i in range(gf.size):
        gf[i] = df[i] if of[i] > 0 else 0.0
    return dense_backward(g, x, weight, dweight, dbias, need_dx)
