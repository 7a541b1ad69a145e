"""The same network in PyTorch, with the same weights: the oracle for tests and the
peer for benchmarks. PyTorch is optional (the `perf` extra); importing this module
without it raises ImportError, which callers turn into a skip."""
from __future__ import annotations

import numpy as np
import torch

from .model import Model


def torch_module(model: Model) -> torch.nn.Sequential:
    nn = torch.nn
    mods = []
    for spec in model.spec()["layers"]:
        kind = spec["type"]
        if kind == "conv2d":
            mods.append(nn.Conv2d(spec["in_channels"], spec["out_channels"], spec["kernel"],
                                  stride=spec["stride"], padding=spec["padding"]))
        elif kind == "dense":
            mods.append(nn.Linear(spec["in_features"], spec["out_features"]))
        elif kind == "maxpool":
            mods.append(nn.MaxPool2d(spec["kernel"], spec["stride"]))
        elif kind == "avgpool":
            mods.append(nn.AvgPool2d(spec["kernel"], spec["stride"]))
        elif kind == "relu":
            mods.append(nn.ReLU())
        elif kind == "tanh":
            mods.append(nn.Tanh())
        elif kind == "sigmoid":
            mods.append(nn.Sigmoid())
        elif kind == "lrn":
            mods.append(nn.LocalResponseNorm(spec["size"], spec["alpha"], spec["beta"], spec["k"]))
        elif kind == "dropout":
            mods.append(nn.Dropout(spec["p"]))
        elif kind == "flatten":
            mods.append(nn.Flatten())
        else:
            raise ValueError(f"no PyTorch counterpart for layer type {kind!r}")
    seq = nn.Sequential(*mods)
    load_params(seq, model.params)
    return seq


def load_params(seq: torch.nn.Sequential, flat: np.ndarray) -> None:
    """Copy a flat parameter vector into the module; PyTorch's parameter order is ours."""
    offset = 0
    with torch.no_grad():
        for p in seq.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(np.ascontiguousarray(flat[offset:offset + n])).view_as(p))
            offset += n
    if offset != flat.size:
        raise ValueError(f"flat vector has {flat.size} values, module has {offset}")


def flat_grad(seq: torch.nn.Sequential) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in seq.parameters()]).numpy()
