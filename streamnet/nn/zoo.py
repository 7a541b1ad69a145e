"""The reference networks: LeNet-5 and AlexNet (64x64 and 224x224 inputs)."""
from __future__ import annotations

from .layers import (LRN, AvgPool2d, Conv2d, Dense, Dropout, Flatten, MaxPool2d, ReLU, Sigmoid,
                     Tanh)
from .model import Model

_ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid}
_POOLS = {"max": MaxPool2d, "avg": AvgPool2d}


def _choice(field: str, value: str, allowed: dict):
    if value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)}; got {value!r}")
    return allowed[value]


def lenet5(activation: str = "relu", pool: str = "max", input_size: int = 28,
           num_classes: int = 10, seed: int = 0) -> Model:
    """LeNet-5. ReLU + max pooling by default; tanh + average pooling is the 1998 network."""
    act = _choice("activation", activation, _ACTIVATIONS)
    pl = _choice("pool", pool, _POOLS)
    pad = 2 if input_size == 28 else 0  # 28x28 padded to 32x32, as in the paper
    s = (input_size + 2 * pad - 4) // 2
    s = (s - 4) // 2
    layers = [
        Conv2d("conv1", 1, 6, 5, padding=pad), act(), pl(2),
        Conv2d("conv2", 6, 16, 5), act(), pl(2),
        Flatten(),
        Dense("fc1", 16 * s * s, 120), act(),
        Dense("fc2", 120, 84), act(),
        Dense("fc3", 84, num_classes),
    ]
    return Model(layers, (1, input_size, input_size), seed=seed)


def alexnet(input_size: int = 64, dropout: float = 0.5, lrn: bool = False,
            num_classes: int = 10, seed: int = 0) -> Model:
    """AlexNet for one-channel input: the 64x64 variant or the 224x224 original."""
    norm = (lambda: [LRN()]) if lrn else (lambda: [])
    if input_size == 64:
        feats = [
            Conv2d("conv1", 1, 64, 5, stride=2, padding=2), ReLU(), *norm(), MaxPool2d(2),
            Conv2d("conv2", 64, 192, 5, padding=2), ReLU(), *norm(), MaxPool2d(2),
            Conv2d("conv3", 192, 384, 3, padding=1), ReLU(),
            Conv2d("conv4", 384, 256, 3, padding=1), ReLU(),
            Conv2d("conv5", 256, 256, 3, padding=1), ReLU(), MaxPool2d(2),
        ]
        flat, hidden = 256 * 4 * 4, 1024
    elif input_size == 224:
        feats = [
            Conv2d("conv1", 1, 96, 11, stride=4, padding=1), ReLU(), *norm(), MaxPool2d(3, 2),
            Conv2d("conv2", 96, 256, 5, padding=2), ReLU(), *norm(), MaxPool2d(3, 2),
            Conv2d("conv3", 256, 384, 3, padding=1), ReLU(),
            Conv2d("conv4", 384, 384, 3, padding=1), ReLU(),
            Conv2d("conv5", 384, 256, 3, padding=1), ReLU(), MaxPool2d(3, 2),
        ]
        flat, hidden = 256 * 5 * 5, 4096
    else:
        raise ValueError(f"input_size must be 64 or 224; got {input_size}")
    layers = feats + [
        Flatten(),
        Dense("fc1", flat, hidden), ReLU(), Dropout(dropout, seed=seed + 1),
        Dense("fc2", hidden, hidden), ReLU(), Dropout(dropout, seed=seed + 2),
        Dense("fc3", hidden, num_classes),
    ]
    return Model(layers, (1, input_size, input_size), seed=seed)


MODELS = {"lenet5": lenet5, "alexnet": alexnet}


def build_model(name: str, **options) -> Model:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name](**options)
