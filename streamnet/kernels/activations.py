"""Element-wise activations, written as loops into `empty_like` outputs so float32
stays float32 (numba promotes `float32_array * 1.0` to float64).

 Backward passes take the forward output, not the input:
it is all each derivative needs and saves keeping both."""
import numpy as np

from ._jit import jit


@jit
def relu_forward(x):
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    for i in range(flat.size):
        v = flat[i]
        out[i] = v if v > 0 else 0.0
    return out.reshape(x.shape)


@jit
def relu_backward(dy, out):
    g = dy.reshape(-1)
    o = out.reshape(-1)
    dx = np.empty_like(g)
    for i in range(g.size):
        dx[i] = g[i] if o[i] > 0 else 0.0
    return dx.reshape(dy.shape)


@jit
def tanh_forward(x):
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    for i in range(flat.size):
        out[i] = np.tanh(flat[i])
    return out.reshape(x.shape)


@jit
def tanh_backward(dy, out):
    g = dy.reshape(-1)
    o = out.reshape(-1)
    dx = np.empty_like(g)
    for i in range(g.size):
        dx[i] = g[i] * (1.0 - o[i] * o[i])
    return dx.reshape(dy.shape)


@jit
def sigmoid_forward(x):
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    for i in range(flat.size):
        v = flat[i]
        # split by sign so exp never overflows
        if v >= 0:
            out[i] = 1.0 / (1.0 + np.exp(-v))
        else:
            e = np.exp(v)
            out[i] = e / (1.0 + e)
    return out.reshape(x.shape)


@jit
def sigmoid_backward(dy, out):
    g = dy.reshape(-1)
    o = out.reshape(-1)
    dx = np.empty_like(g)
    for i in range(g.size):
        dx[i] = g[i] * o[i] * (1.0 - o[i])
    return dx.reshape(dy.shape)
