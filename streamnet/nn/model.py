"""A sequential model over one flat float32 parameter vector.

Every layer's weights and gradients are views into `model.params` and
`model.grads`, so synchronising a model is one message and one vector operation.
"""
from __future__ import annotations

import numpy as np

from .. import kernels as K
from .layers import ConvMaxPool, DenseReLU, Layer, layer_from_spec


def compute_order(layers: list[Layer]) -> list[Layer]:
    """The layers in the order they are computed, some fused.

    A ReLU directly followed by a max pool runs after it instead. max and ReLU
    commute (both monotone, and ties and the all-negative window route the gradient
    to zero either way), so values and gradients are bit-identical, and the ReLU's
    forward and backward touch a quarter of the elements: LeNet-5 batch 64 relu1
    0.43 -> ~0.1 ms per step. Then a one-channel convolution, its 2x2 max pool and
    that ReLU become one ConvMaxPool step (LeNet-5's conv1), and a dense layer and
    its ReLU one DenseReLU step, bit-identical too: fewer kernel calls per step, each
    of which re-takes the GIL (a thread of a ParallelStep that finds the other one
    holding it sleeps until woken: see nn/parallel.py)."""
    order = list(layers)
    i = 0
    while i + 1 < len(order):
        if order[i].type == "relu" and order[i + 1].type == "maxpool":
            order[i], order[i + 1] = order[i + 1], order[i]
            i += 2
        else:
            i += 1
    fused, i = [], 0
    while i < len(order):
        if i + 1 < len(order) and ConvMaxPool.fits(order[i], order[i + 1]):
            relu = order[i + 2] if i + 2 < len(order) and order[i + 2].type == "relu" else None
            fused.append(ConvMaxPool(order[i], order[i + 1], relu))
            i += 3 if relu is not None else 2
        elif i + 1 < len(order) and order[i].type == "dense" and order[i + 1].type == "relu":
            fused.append(DenseReLU(order[i], order[i + 1]))
            i += 2
        else:
            fused.append(order[i])
            i += 1
    return fused


def _own_or(given: np.ndarray | None, size: int, what: str) -> np.ndarray:
    if given is None:
        return np.zeros(size, dtype=np.float32)
    if given.shape != (size,) or given.dtype != np.float32 or not given.flags.c_contiguous:
        raise ValueError(f"{what} must be a contiguous float32 vector of {size} values, "
                         f"got {given.dtype} {given.shape}")
    return given


class Model:
    def __init__(self, layers: list[Layer], input_shape: tuple[int, int, int], *,
                 params: np.ndarray | None = None, seed: int = 0,
                 share_params: np.ndarray | None = None, grads_out: np.ndarray | None = None):
        """`share_params` / `grads_out` (float32, 1-D, right size) make the model use
        those vectors instead of its own (no initialisation): how `replica` makes a
        second set of layers over the same weights."""
        self.layers = layers
        self._order = compute_order(layers)
        self._seeded = [layer for layer in layers if hasattr(layer, "step")]  # dropout
        self.input_shape = tuple(int(v) for v in input_shape)
        shape = self.input_shape
        slots: list[tuple[Layer, str, tuple[int, ...]]] = []
        for layer in layers:
            shape = layer.out_shape(shape)
            slots += [(layer, pname, pshape) for pname, pshape in layer.param_shapes()]
        self.output_shape = shape
        size = sum(int(np.prod(s)) for _, _, s in slots)
        self.params = _own_or(share_params, size, "share_params")
        self.grads = _own_or(grads_out, size, "grads_out")
        self._parallel: dict[int, object] = {}
        self._named: list[tuple[str, np.ndarray]] = []
        self._named_grads: list[tuple[str, np.ndarray]] = []
        offset = 0
        per_layer: dict[int, tuple[dict, dict]] = {}
        for layer, pname, pshape in slots:
            n = int(np.prod(pshape))
            pv = self.params[offset:offset + n].reshape(pshape)
            gv = self.grads[offset:offset + n].reshape(pshape)
            offset += n
            self._named.append((f"{layer.name}.{pname}", pv))
            self._named_grads.append((f"{layer.name}.{pname}", gv))
            p, g = per_layer.setdefault(id(layer), ({}, {}))
            p[pname], g[pname] = pv, gv
        rng = np.random.default_rng(seed)
        for layer in layers:
            if id(layer) in per_layer:
                p, g = per_layer[id(layer)]
                layer.bind(p, g)
                if share_params is None:
                    layer.init(p, rng)
        if params is not None:
            self.set_params(params)

    # -- parameters -------------------------------------------------------
    @property
    def num_params(self) -> int:
        return self.params.size

    def named_params(self) -> list[tuple[str, np.ndarray]]:
        return list(self._named)

    def named_grads(self) -> list[tuple[str, np.ndarray]]:
        return list(self._named_grads)

    # -- random state (dropout counters): part of what a resumable checkpoint saves --
    def random_state(self) -> list[int]:
        return [int(layer.step) for layer in self._seeded]

    def set_random_state(self, steps: list[int]) -> None:
        layers = self._seeded
        if len(steps) != len(layers):
            raise ValueError(f"random state has {len(steps)} counters for {len(layers)} seeded layers")
        counters = [int(step) for step in steps]      # all, before any layer's changes
        for layer, step in zip(layers, counters):
            layer.step = step

    def set_sample_offset(self, first: int) -> None:
        """Index of this batch's first sample in a larger batch (seeded layers draw
        their masks there); 0 for a whole batch. Used by ParallelStep's shards."""
        for layer in self._seeded:
            layer.sample_offset = int(first)

    def replica(self, grads: np.ndarray | None = None) -> "Model":
        """A second set of layers over this model's parameter vector (shared, not
        copied), with its own gradient vector (`grads`, or a new one) and its own
        saved activations: what one thread of a ParallelStep runs."""
        return Model([layer_from_spec(l.spec()) for l in self.layers], self.input_shape,
                     share_params=self.params, grads_out=grads)

    def set_params(self, params: np.ndarray) -> None:
        params = np.asarray(params)
        if params.shape != self.params.shape:
            raise ValueError(f"parameter vector has {params.size} values, model needs {self.params.size}")
        self.params[...] = params  # in place: layer views stay valid

    # -- compute ----------------------------------------------------------
    def _check_input(self, x: np.ndarray) -> np.ndarray:
        if x.ndim != 4 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"expected input of shape (N, {', '.join(map(str, self.input_shape))}), "
                             f"got {tuple(x.shape)}")
        return np.ascontiguousarray(x, dtype=np.float32)

    def forward(self, x: np.ndarray, train: bool = False) -> np.ndarray:
        h = self._check_input(x)
        for layer in self._order:
            h = layer.forward(h, train)
        return h

    def predict(self, x: np.ndarray, batch: int = 512) -> np.ndarray:
        """Logits, evaluated in chunks so a whole test set fits in memory."""
        return np.concatenate([self.forward(x[i:i + batch], train=False)
                               for i in range(0, len(x), batch)]) if len(x) else \
            np.zeros((0,) + self.output_shape, np.float32)

    def _check_labels(self, y: np.ndarray, n: int) -> np.ndarray:
        labels = np.ascontiguousarray(y, dtype=np.int64)
        if labels.shape != (n,):
            raise ValueError(f"expected {n} labels, got shape {labels.shape}")
        k = self.output_shape[0]
        if labels.size and (labels.min() < 0 or labels.max() >= k):
            raise ValueError(f"labels must lie in [0, {k}), got {labels.min()}..{labels.max()}")
        return labels

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray, threads: int = 1) -> tuple[float, np.ndarray]:
        """Mean softmax cross-entropy and its gradient.

        The gradient returned is `model.grads`, overwritten by the next call: copy it
        if you need to keep it. `threads > 1` splits the batch across that many
        threads (a `ParallelStep` made on first use and kept on the model; see
        streamnet/nn/parallel.py); the result equals the one-thread one to float32
        rounding. Not re-entrant: one step at a time per model.
        """
        if threads > 1:
            step = self._parallel.get(threads)
            if step is None:
                from .parallel import ParallelStep
                step = self._parallel[threads] = ParallelStep(self, threads)
            return step.loss_and_grad(x, y)
        x = self._check_input(x)
        return self._loss_and_grad(x, self._check_labels(y, x.shape[0]))

    def _loss_and_grad(self, x: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
        """loss_and_grad of checked input: contiguous float32 x, int64 labels in range
        (ParallelStep checks the whole batch once, then runs its chunks through this)."""
        h = x
        for layer in self._order:
            h = layer.forward(h, True)
        logits = h
        loss, d = K.softmax_cross_entropy(logits, labels)
        for i in range(len(self._order) - 1, -1, -1):
            layer = self._order[i]
            # the first layer's input gradient is never needed: skip its col2im
            d = layer.backward(d, need_dx=i > 0)
        return float(loss), self.grads

    # -- architecture as plain data --------------------------------------
    def spec(self) -> dict:
        return {"input_shape": list(self.input_shape), "layers": [l.spec() for l in self.layers]}

    @classmethod
    def from_spec(cls, spec: dict, params: np.ndarray | None = None, seed: int = 0) -> "Model":
        return cls([layer_from_spec(s) for s in spec["layers"]], tuple(spec["input_shape"]),
                   params=params, seed=seed)

    def __repr__(self) -> str:
        names = " -> ".join(l.name or l.type for l in self.layers)
        return f"Model({names}; {self.num_params:,} params)"
