"""What the convolution kernel tests check against: a plain NumPy convolution and
central finite differences."""
import numpy as np

from streamnet import kernels as K

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


def check_gradients(x, w, b, pad, r, dx, dw, db, rng):
    """dx, dw, db (conv2d_backward of the upstream gradient r) against finite differences
    of sum(r * conv2d(x, w, b)), each along a random direction."""
    for arr, grad, f in [
        (x, dx, lambda z: np.sum(r * K.conv2d_forward(z, w, b, 1, pad))),
        (w, dw, lambda z: np.sum(r * K.conv2d_forward(x, z, b, 1, pad))),
        (b, db, lambda z: np.sum(r * K.conv2d_forward(x, w, z, 1, pad))),
    ]:
        v = rng.standard_normal(arr.shape)
        numeric = fd(f, arr, v)
        assert abs(np.sum(grad * v) - numeric) <= 1e-6 * max(1.0, abs(numeric))
