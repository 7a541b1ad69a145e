"""Trained weights out: a checkpoint's parameters as safetensors or as a PyTorch
state_dict, named as a PyTorch user names them (`conv1.weight`, `fc3.bias`: our
layer names, PyTorch's layouts), so they load into the matching `torch.nn` model
with `load_state_dict`.

safetensors is written here, not through the `safetensors` package: the format is a
little-endian u64 header length, a JSON header (each tensor's dtype, shape and byte
range, plus a `__metadata__` map of strings), then the raw bytes. The tests read the
files back with the `safetensors` package itself. The PyTorch format is torch's own
pickle-in-zip: `--format torch` needs PyTorch installed and calls `torch.save`.

The metadata says how to feed the network: input shape, classes, and the pixel
normalisation it was trained with (x / 255, minus mean, over std).
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile

import numpy as np

from ..data.datasets import STATS
from ..errors import ConfigError, StreamnetError
from ..nn import Model, build_model
from .checkpoint import load_checkpoint
from .config import ModelConfig, run_config_from_dict

FORMATS = ("safetensors", "torch")


class ExportError(StreamnetError):
    pass


def _sized(name: str, options: dict, num_classes: int) -> Model:
    return build_model(name, num_classes=num_classes, **options)


def model_for(params: np.ndarray, name: str, options: dict) -> Model:
    """The network `name` holding `params`; its number of classes read from the vector's
    size (a checkpoint does not record the dataset's classes)."""
    try:
        one, two = _sized(name, options, 1).num_params, _sized(name, options, 2).num_params
    except ValueError as e:
        raise ExportError(str(e)) from None
    classes, rest = divmod(params.size - one, two - one)
    if rest or classes < 0:
        raise ExportError(f"the checkpoint holds {params.size:,} parameters, which no {name} with options "
                          f"{options} has; is it another network?")
    net = _sized(name, options, classes + 1)
    try:
        net.set_params(params)
    except ValueError as e:
        raise ExportError(f"the checkpoint's parameters do not fit {name}: {e}") from None
    return net


def load_for_export(path: str, model: str | None = None, input_size: int | None = None) -> tuple[Model, dict]:
    """(model with the checkpoint's parameters, metadata). The architecture comes from the
    run configuration a resumable checkpoint carries; for one holding parameters only,
    from `model` (and `input_size`)."""
    ck = load_checkpoint(path)
    state = ck.get("state")
    if state is not None and not isinstance(state, dict):
        raise ExportError(f"{path} is not a usable checkpoint: its state is a {type(state).__name__}, not a mapping")
    params = ck.get("params")
    if not isinstance(params, np.ndarray) or params.ndim != 1:
        raise ExportError(f"{path} is not a usable checkpoint: its parameters are not a flat vector "
                          f"(shape {getattr(params, 'shape', None)})")
    config = (state or {}).get("config")
    if config is not None:
        try:
            cfg = run_config_from_dict(config)
        except (ConfigError, TypeError, KeyError, ValueError, AttributeError) as e:
            # the file's checksum covers what was written, not who wrote it: a cluster
            # checkpoint's MAC is checked by the workers, which hold the secret, not here
            raise ExportError(f"{path} is not a usable checkpoint: its run configuration cannot be read "
                              f"({type(e).__name__}: {e})") from None
        name, options, dataset = cfg.model.name, dict(cfg.model.options), cfg.data.dataset
        recorded = cfg.model.input_size
        if (model is not None and model != name) or (input_size is not None and input_size != recorded):
            raise ExportError(f"{path} records its network, {name} with input size {recorded}; --model "
                              f"{model or name} --input-size {input_size or recorded} disagrees (leave them out)")
    elif model is not None:
        name, options, dataset = model, ({"input_size": input_size} if input_size is not None else {}), None
        try:
            ModelConfig(name=name, options=options)     # an input size the network cannot take
        except ConfigError as e:
            raise ExportError(f"--model {name} --input-size {input_size}: {getattr(e, 'problem', e)}") from None
    else:
        raise ExportError(f"{path} holds parameters only, without its run configuration; say which network "
                          "with --model (and --input-size for AlexNet)")
    net = model_for(params, name, options)
    meta = {"format": "streamnet", "model": name, "model_options": json.dumps(options, sort_keys=True),
            "input_shape": json.dumps(list(net.input_shape)), "num_classes": str(net.layers[-1].spec()["out_features"]),
            "step": str(ck["step"]), "source": os.path.basename(path)}
    if dataset is not None:
        meta["dataset"] = dataset
    if dataset in STATS:
        mean, std = STATS[dataset]
        meta["normalize"] = json.dumps({"scale": 1 / 255, "mean": mean, "std": std})
    return net, meta


def state_dict(model: Model) -> dict[str, np.ndarray]:
    """{"conv1.weight": array, ...} in PyTorch's order and layouts (copies, C order)."""
    return {name: np.ascontiguousarray(v, np.float32).copy() for name, v in model.named_params()}


_DTYPE = {np.dtype("<f4"): "F32"}


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    header, offset = {}, 0
    for name, a in tensors.items():
        if a.dtype not in _DTYPE:
            raise ExportError(f"{name}: no safetensors dtype for {a.dtype}")
        header[name] = {"dtype": _DTYPE[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)        # the data starts 8-byte aligned, as the format recommends
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for a in tensors.values():
            f.write(a.tobytes())


def write_torch(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:  # noqa: ARG001
    try:
        import torch
    except ImportError:
        raise ExportError("--format torch needs PyTorch installed (pip install torch); --format safetensors "
                          "needs nothing and loads into PyTorch too (safetensors.torch.load_file)") from None
    from collections import OrderedDict
    # a plain state_dict, as model.state_dict() gives; the metadata (how to normalise the
    # input) travels in the safetensors form only
    torch.save(OrderedDict((k, torch.from_numpy(v)) for k, v in tensors.items()), path)


def _beside(out: str) -> str:
    """A new file of its own beside `out` (two exports to one OUT at once wrote the same
    OUT.partial, each renaming the other's half-written file; a file of the user's of that
    name was overwritten), with the mode OUT has or a new file gets."""
    fd, path = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", suffix=".partial",
                                dir=os.path.dirname(os.path.abspath(out)))
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, os.stat(out).st_mode & 0o7777 if os.path.exists(out) else 0o666 & ~umask)
    finally:
        os.close(fd)
    return path


def export(checkpoint: str, out: str, fmt: str = "safetensors", model: str | None = None,
           input_size: int | None = None) -> Model:
    """Write the checkpoint's weights to `out`; return the network they belong to."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    net, meta = load_for_export(checkpoint, model, input_size)
    writer = write_safetensors if fmt == "safetensors" else write_torch
    # written beside OUT, then renamed over it: a write that fails part-way (a full disk)
    # left an existing OUT truncated (a device or a pipe is written as it is)
    partial = out
    try:
        if os.path.isfile(out) or not os.path.exists(out):
            partial = _beside(out)
        writer(partial, state_dict(net), meta)
        if partial != out:
            os.replace(partial, out)
    except OSError as e:
        if partial != out:
            with contextlib.suppress(OSError):
                os.unlink(partial)
        raise ExportError(f"cannot write {out}: {e.strerror or e}") from None
    return net
