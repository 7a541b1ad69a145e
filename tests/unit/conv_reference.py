"""What the convolution kernel tests check against: a plain NumPy convolution and
central finite differences."""
import numpy as np

EPS = 1e-6


def fd(f, x, v):
    """The directional derivative of f at x along v, by central differences."""
    return (f(x + EPS * v) - f(x - EPS * v)) / (2 * EPS)


def reference(x, w, b, pad):
    """conv2d(x, w) + b with `pad` zeros around, one output position at a time."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    oh, ow = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
    out = np.empty((x.shape[0], w.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = np.einsum("nchw,ochw->no", xp[:, :, i:i + kh, j:j + kw], w) + b
    return out
