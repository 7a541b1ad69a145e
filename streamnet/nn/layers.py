"""Layers over caller-owned parameter views.

A layer declares its parameter shapes; the model carves views for them out of one
flat parameter vector and one flat gradient vector and hands them over with
`bind`. Forward passes keep what their backward pass needs on the layer (this is
the one place where per-step state lives; kernels keep none).

Each layer class maps to one `spec` dict (`{"type": ..., **fields}`) and back.
"""
from __future__ import annotations

import numpy as np

from .. import kernels as K


class Layer:
    type: str = ""
    name: str = ""

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return []

    def bind(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        pass

    def out_shape(self, in_shape: tuple[int, ...]) -> tuple[int, ...]:
        return in_shape

    def init(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        pass

    def forward(self, x: np.ndarray, train: bool) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        raise NotImplementedError

    def spec(self) -> dict:
        return {"type": self.type}


def _torch_default_init(weight: np.ndarray, bias: np.ndarray, fan_in: int,
                        rng: np.random.Generator) -> None:
    # PyTorch's default for Conv2d and Linear: kaiming_uniform(a=sqrt(5)) for the
    # weight, which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for bias.
    bound = 1.0 / np.sqrt(fan_in)
    weight[...] = rng.uniform(-bound, bound, weight.shape)
    bias[...] = rng.uniform(-bound, bound, bias.shape)


class Conv2d(Layer):
    type = "conv2d"

    def __init__(self, name: str, in_channels: int, out_channels: int, kernel: int,
                 stride: int = 1, padding: int = 0):
        self.name, self.cin, self.cout = name, in_channels, out_channels
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def param_shapes(self):
        return [("weight", (self.cout, self.cin, self.kernel, self.kernel)), ("bias", (self.cout,))]

    def bind(self, params, grads):
        self.w, self.b, self.dw, self.db = params["weight"], params["bias"], grads["weight"], grads["bias"]

    def init(self, params, rng):
        _torch_default_init(params["weight"], params["bias"], self.cin * self.kernel ** 2, rng)

    def out_shape(self, in_shape):
        c, h, w = in_shape
        if c != self.cin:
            raise ValueError(f"layer {self.name!r} expects {self.cin} input channels, got {c}")
        oh = (h + 2 * self.padding - self.kernel) // self.stride + 1
        ow = (w + 2 * self.padding - self.kernel) // self.stride + 1
        if oh < 1 or ow < 1:
            raise ValueError(f"layer {self.name!r}: input {h}x{w} is smaller than kernel {self.kernel}")
        return (self.cout, oh, ow)

    # a training forward keeps its im2col columns for the backward pass, in a
    # workspace made once per batch shape (no allocation per step), unless they
    # would pass this many floats (then the backward rebuilds them)
    KEEP_COLUMNS_MAX = 1 << 26

    def columns(self, x, train):
        """The workspace a training forward leaves its columns in for the backward
        pass (an empty array when it keeps none); sets _kept."""
        if train:
            need = self._columns_size(x.shape)
            if 0 < need <= self.KEEP_COLUMNS_MAX:
                ws = getattr(self, "_cols", None)
                if ws is None or ws.size != need or ws.dtype != x.dtype:
                    ws = self._cols = np.empty(need, dtype=x.dtype)
                self._kept = True
                return ws
        self._kept = False
        return np.empty(0, dtype=x.dtype)

    def forward(self, x, train):
        self._x = x
        return K.conv2d_forward_keep(x, self.w, self.b, self.stride, self.padding, self.columns(x, train))

    def _columns_size(self, shape):
        """K.columns_size, kept per input shape: a kernel call fewer per step (each
        re-takes the GIL on return, see nn/parallel.py)."""
        if getattr(self, "_size_of", (None,))[0] != shape:
            self._size_of = (shape, K.columns_size(shape, self.w.shape, self.stride, self.padding))
        return self._size_of[1]

    def backward(self, dy, need_dx):
        if self._kept:
            dx = K.conv2d_backward_kept(dy, self._x, self.w, self.dw, self.db, self.stride, self.padding,
                                        need_dx, self._cols)
        else:
            dx = K.conv2d_backward(dy, self._x, self.w, self.dw, self.db, self.stride, self.padding, need_dx)
        self._x = None
        self._kept = False
        return dx if need_dx else None

    def spec(self):
        return {"type": self.type, "name": self.name, "in_channels": self.cin,
                "out_channels": self.cout, "kernel": self.kernel, "stride": self.stride,
                "padding": self.padding}


class Dense(Layer):
    type = "dense"

    def __init__(self, name: str, in_features: int, out_features: int):
        self.name, self.fin, self.fout = name, in_features, out_features

    def param_shapes(self):
        return [("weight", (self.fout, self.fin)), ("bias", (self.fout,))]

    def bind(self, params, grads):
        self.w, self.b, self.dw, self.db = params["weight"], params["bias"], grads["weight"], grads["bias"]

    def init(self, params, rng):
        _torch_default_init(params["weight"], params["bias"], self.fin, rng)

    def out_shape(self, in_shape):
        if in_shape != (self.fin,):
            raise ValueError(f"layer {self.name!r} expects {self.fin} features, got shape {in_shape}")
        return (self.fout,)

    def forward(self, x, train):
        self._x = x
        return K.dense_forward(x, self.w, self.b)

    def backward(self, dy, need_dx):
        dx = K.dense_backward(dy, self._x, self.w, self.dw, self.db, need_dx)
        self._x = None
        return dx if need_dx else None

    def spec(self):
        return {"type": self.type, "name": self.name, "in_features": self.fin,
                "out_features": self.fout}


class _Pool(Layer):
    def __init__(self, kernel: int, stride: int | None = None):
        self.kernel = kernel
        self.stride = kernel if stride is None else stride

    def out_shape(self, in_shape):
        c, h, w = in_shape
        oh = (h - self.kernel) // self.stride + 1
        ow = (w - self.kernel) // self.stride + 1
        if oh < 1 or ow < 1:
            raise ValueError(f"{self.type} {self.kernel}/{self.stride} does not fit input {h}x{w}")
        return (c, oh, ow)

    def spec(self):
        return {"type": self.type, "kernel": self.kernel, "stride": self.stride}


class MaxPool2d(_Pool):
    type = "maxpool"

    def forward(self, x, train):
        out, self._arg = K.maxpool_forward(x, self.kernel, self.stride)
        self._x_shape = x.shape
        return out

    def backward(self, dy, need_dx):
        return K.maxpool_backward(dy, self._arg, self._x_shape)


class AvgPool2d(_Pool):
    type = "avgpool"

    def forward(self, x, train):
        self._x_shape = x.shape
        return K.avgpool_forward(x, self.kernel, self.stride)

    def backward(self, dy, need_dx):
        return K.avgpool_backward(dy, self._x_shape, self.kernel, self.stride)


class _Activation(Layer):
    fwd = staticmethod(lambda x: x)
    bwd = staticmethod(lambda dy, out: dy)

    def forward(self, x, train):
        self._out = type(self).fwd(x)
        return self._out

    def backward(self, dy, need_dx):
        return type(self).bwd(dy, self._out)


class ReLU(_Activation):
    type = "relu"
    fwd, bwd = staticmethod(K.relu_forward), staticmethod(K.relu_backward)


class Tanh(_Activation):
    type = "tanh"
    fwd, bwd = staticmethod(K.tanh_forward), staticmethod(K.tanh_backward)


class Sigmoid(_Activation):
    type = "sigmoid"
    fwd, bwd = staticmethod(K.sigmoid_forward), staticmethod(K.sigmoid_backward)


class LRN(Layer):
    type = "lrn"

    def __init__(self, size: int = 5, alpha: float = 1e-4, beta: float = 0.75, k: float = 2.0):
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x, train):
        out, self._scale = K.lrn_forward(x, self.size, self.alpha, self.beta, self.k)
        self._x = x
        return out

    def backward(self, dy, need_dx):
        return K.lrn_backward(dy, self._x, self._scale, self.size, self.alpha, self.beta)

    def spec(self):
        return {"type": self.type, "size": self.size, "alpha": self.alpha, "beta": self.beta, "k": self.k}


class Dropout(Layer):
    """Seeded dropout: the mask of step t is a pure function of (seed, t)."""
    type = "dropout"

    def __init__(self, p: float = 0.5, seed: int = 0):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p, self.seed, self.step = p, seed, 0
        self.sample_offset = 0  # first sample's index in the whole batch (ParallelStep shards)

    def forward(self, x, train):
        if not train or self.p == 0.0:
            self._mask = None
            return x
        per_sample = x.size // max(x.shape[0], 1)
        # (seed << 32) + step, kept to 63 bits: a wider key is no integer numba can type
        # (a seed of 2**32 failed the first step); unchanged for every seed below 2**31
        key = ((self.seed & 0x7FFFFFFF) << 32) + (self.step & 0xFFFFFFFF)
        out, self._mask = K.dropout_forward(x, self.p, key, self.sample_offset * per_sample)
        self.step += 1
        return out

    def backward(self, dy, need_dx):
        return dy if self._mask is None else K.dropout_backward(dy, self._mask)

    def spec(self):
        return {"type": self.type, "p": self.p, "seed": self.seed}


class Flatten(Layer):
    type = "flatten"

    def out_shape(self, in_shape):
        return (int(np.prod(in_shape)),)

    def forward(self, x, train):
        self._x_shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy, need_dx):
        return dy.reshape(self._x_shape)


class ConvMaxPool(Layer):
    """A convolution, the max pool after it and the ReLU after that (if any) as one
    kernel call each way: a compute step the model makes of its declared layers,
    never declared itself, with the conv layer's parameters; values and gradients
    bit-identical to the three layers'. Why: every kernel call re-takes the GIL on
    return, and a thread of a ParallelStep that finds the other one holding it sleeps
    until woken (nn/parallel.py). A one-channel convolution pooled 2x2 (LeNet-5's
    conv1) runs kernels/conv_wide.py's wide_pool_forward, which also never stores
    the convolution's full output; others conv2d_pool_forward (kernels/conv.py)."""
    type = "conv2d+maxpool"

    def __init__(self, conv: Conv2d, pool: MaxPool2d, relu: ReLU | None):
        self.conv, self.pool, self.relu = conv, pool, relu
        self.name = conv.name
        self.parts = [conv, pool] + ([relu] if relu is not None else [])
        self.wide = K.use_wide_pool(conv.cin, conv.stride, pool.kernel, pool.stride)

    @staticmethod
    def fits(conv: Layer, pool: Layer) -> bool:
        return conv.type == "conv2d" and pool.type == "maxpool"

    def forward(self, x, train):
        c, p, relu = self.conv, self.pool, self.relu is not None
        self._x = x
        if self.wide:
            out, self._arg = K.wide_pool_forward(x, c.w, c.b, c.padding, relu)
        else:
            self._cols = c.columns(x, train)
            out, self._arg, self._conv_shape = K.conv2d_pool_forward(
                x, c.w, c.b, c.stride, c.padding, p.kernel, p.stride, relu, self._cols)
        self._out = out
        return out

    def backward(self, dy, need_dx):
        c, relu = self.conv, self.relu is not None
        if self.wide:
            dx = K.wide_pool_backward(dy, self._out, self._arg, self._x, c.w, c.dw, c.db, c.padding, relu,
                                      need_dx)
        else:
            dx = K.conv2d_pool_backward(dy, self._out, self._arg, self._conv_shape, self._x, c.w, c.dw, c.db,
                                        c.stride, c.padding, relu, need_dx, self._cols)
            self._cols = None
        self._x = self._out = self._arg = None
        return dx if need_dx else None


class DenseReLU(Layer):
    """A dense layer and the ReLU after it as one kernel call each way (kernels/dense.py,
    dense_relu_forward): a compute step the model makes of its declared layers, with
    the dense layer's parameters; bit-identical to the two layers. Why: every kernel
    call re-takes the GIL on return, and a thread that finds the other one holding it
    sleeps until it is woken (nn/parallel.py)."""
    type = "dense+relu"

    def __init__(self, dense: Dense, relu: ReLU):
        self.dense, self.relu = dense, relu
        self.name = dense.name
        self.parts = [dense, relu]

    def forward(self, x, train):
        d = self.dense
        self._x = x
        self._out = K.dense_relu_forward(x, d.w, d.b)
        return self._out

    def backward(self, dy, need_dx):
        d = self.dense
        dx = K.dense_relu_backward(dy, self._out, self._x, d.w, d.dw, d.db, need_dx)
        self._x = self._out = None
        return dx if need_dx else None


LAYER_TYPES: dict[str, type[Layer]] = {
    cls.type: cls for cls in (Conv2d, Dense, MaxPool2d, AvgPool2d, ReLU, Tanh, Sigmoid, LRN, Dropout, Flatten)
}


def layer_from_spec(spec: dict) -> Layer:
    fields = dict(spec)
    kind = fields.pop("type", None)
    if kind not in LAYER_TYPES:
        raise ValueError(f"unknown layer type {kind!r}; known: {', '.join(sorted(LAYER_TYPES))}")
    return LAYER_TYPES[kind](**fields)
