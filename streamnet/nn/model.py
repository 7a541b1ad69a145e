"""A sequential model over one flat float32 parameter vector.

Every layer's weights and gradients are views into `model.params` and
`model.grads`, so synchronising a model is one message and one vector operation.
"""
from __future__ import annotations

import numpy as np

from .. import kernels as K
from .layers import Layer, layer_from_spec


class Model:
    def __init__(self, layers: list[Layer], input_shape: tuple[int, int, int], *,
                 params: np.ndarray | None = None, seed: int = 0):
        self.layers = layers
        self.input_shape = tuple(int(v) for v in input_shape)
        shape = self.input_shape
        slots: list[tuple[Layer, str, tuple[int, ...]]] = []
        for layer in layers:
            shape = layer.out_shape(shape)
            slots += [(layer, pname, pshape) for pname, pshape in layer.param_shapes()]
        self.output_shape = shape
        size = sum(int(np.prod(s)) for _, _, s in slots)
        self.params = np.zeros(size, dtype=np.float32)
        self.grads = np.zeros(size, dtype=np.float32)
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
        return [int(layer.step) for layer in self.layers if hasattr(layer, "step")]

    def set_random_state(self, steps: list[int]) -> None:
        layers = [layer for layer in self.layers if hasattr(layer, "step")]
        if len(steps) != len(layers):
            raise ValueError(f"random state has {len(steps)} counters for {len(layers)} seeded layers")
        for layer, step in zip(layers, steps):
            layer.step = int(step)

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
        for layer in self.layers:
            h = layer.forward(h, train)
        return h

    def predict(self, x: np.ndarray, batch: int = 512) -> np.ndarray:
        """Logits, evaluated in chunks so a whole test set fits in memory."""
        return np.concatenate([self.forward(x[i:i + batch], train=False)
                               for i in range(0, len(x), batch)]) if len(x) else \
            np.zeros((0,) + self.output_shape, np.float32)

    def loss_and_grad(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean softmax cross-entropy and its gradient.

        The gradient returned is `model.grads`, overwritten by the next call: copy it
        if you need to keep it.
        """
        labels = np.ascontiguousarray(y, dtype=np.int64)
        logits = self.forward(x, train=True)
        if labels.shape != (logits.shape[0],):
            raise ValueError(f"expected {logits.shape[0]} labels, got shape {labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[1]):
            raise ValueError(f"labels must lie in [0, {logits.shape[1]}), got {labels.min()}..{labels.max()}")
        loss, d = K.softmax_cross_entropy(logits, labels)
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
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
