"""Datasets: images kept as uint8 in memory, made into float32 batches on demand.

Normalising and resizing happen per batch, not up front: Fashion-MNIST resized
to 224x224 would need 12 GB as float32, a batch of it a few MB.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from .idx import read_idx

log = logging.getLogger(__name__)

DEFAULT_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}
FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
# per-dataset pixel mean and std (of x / 255) over the training set
STATS = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}
CLASSES = {"fashion-mnist": 10, "mnist": 10}
# The most classes the generic idx dataset may infer (as its largest label + 1).
# The class count sizes the model's last layer, so one corrupt label (2**31 - 1 in
# an int32 file) must not set it: labels at or above this are not counted, and
# data.quarantine removes them as out of range, as it does a named dataset's labels
# beyond its known class count. (65,536 classes behind LeNet-5's 84 features are a
# 5.5M-parameter layer; no IDX dataset this trainer serves comes near.)
MAX_CLASSES = 65_536
# The largest images and the most samples an IDX split may hold. A file is read whole
# (idx.MAX_BYTES), and what is made of it is larger: labels as int64 (8 bytes each),
# and a batch of images as float32 at their own size before they are resized for the
# network (which takes at most 512 x 512): one 65,535 x 65,535 image was 16 GiB there.
MAX_SIDE = 2048
MAX_SAMPLES = 1 << 26
_STATS_CHUNK = 1 << 22      # pixels the mean and std are summed over at a time (float64)


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # (N, H, W) uint8 (or float32 from float IDX files), values 0..255
    labels: np.ndarray  # (N,) int64

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Split
    test: Split
    num_classes: int
    mean: float
    std: float
    quarantined: dict = field(default_factory=dict)   # see data.quarantine

    def batch(self, split: Split, indices: np.ndarray, size: int | None = None):
        """(x float32 (n, 1, S, S), y int64) for the given sample indices."""
        return to_input(split.images[indices], self.mean, self.std, size), split.labels[indices]


def to_input(images: np.ndarray, mean: float, std: float, size: int | None = None) -> np.ndarray:
    x = images.astype(np.float32)
    x *= np.float32(1.0 / (255.0 * std))
    x -= np.float32(mean / std)
    if size is not None and size != x.shape[-1]:
        x = resize(x, size)
    return x[:, None, :, :]


def _resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Bilinear interpolation as an (n_out, n_in) matrix (PyTorch's align_corners=False)."""
    scale = n_in / n_out
    src = np.clip((np.arange(n_out) + 0.5) * scale - 0.5, 0, n_in - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = (src - lo).astype(np.float32)
    m = np.zeros((n_out, n_in), np.float32)
    m[np.arange(n_out), lo] += 1 - frac
    m[np.arange(n_out), hi] += frac
    return m


def resize(x: np.ndarray, size: int) -> np.ndarray:
    """Resize (N, H, W) square images to (N, size, size) as two matrix products."""
    r = _resize_matrix(x.shape[-1], size)
    return np.ascontiguousarray(r @ x @ r.T)


def resolve_dir(name: str, data_dir: str | None) -> str:
    d = data_dir or os.environ.get("STREAMNET_DATA") or DEFAULT_DIRS.get(name)
    if d is None:
        raise DataError(f"dataset {name!r} has no default location; pass --data DIR")
    if not os.path.isdir(d):
        hint = (" (install it with: sudo apt-get install dataset-fashion-mnist)"
                if d == DEFAULT_DIRS.get("fashion-mnist") else "")
        raise DataError(f"dataset directory {d} does not exist{hint}")
    return d


def _find(directory: str, stem: str) -> str:
    for name in (stem, stem + ".gz"):
        p = os.path.join(directory, name)
        if os.path.exists(p):
            return p
    raise DataError(f"{directory}: missing {stem} (or {stem}.gz)")


def _read_split(directory: str, xkey: str, ykey: str) -> Split:
    xpath, ypath = _find(directory, FILES[xkey]), _find(directory, FILES[ykey])
    images, labels = read_idx(xpath), read_idx(ypath)
    if images.ndim != 3 or images.dtype.kind not in "uif":
        raise DataError(f"{xpath}: expected images of 3 dimensions, got {images.dtype} {images.shape}")
    if images.dtype != np.uint8:
        images = images.astype(np.float32)  # float files may hold NaN/Inf: quarantined later
    if images.shape[1] != images.shape[2] or not images.shape[1]:
        raise DataError(f"{xpath}: images must be square, with pixels; got {images.shape[1]}x{images.shape[2]}")
    if images.shape[1] > MAX_SIDE:
        raise DataError(f"{xpath}: images of {images.shape[1]}x{images.shape[2]} pixels; at most {MAX_SIDE}x"
                        f"{MAX_SIDE} (the networks take at most 512x512: resize them first)")
    if len(images) > MAX_SAMPLES:
        raise DataError(f"{xpath}: {len(images):,} images; at most {MAX_SAMPLES:,} in one file")
    if labels.ndim != 1:
        raise DataError(f"{ypath}: expected a 1-dimensional label file, got shape {labels.shape}")
    if len(labels) != len(images):
        raise DataError(f"{ypath}: {len(labels)} labels for {len(images)} images in {xpath}")
    if labels.dtype.kind == "f":           # a float label file: each label must be a whole number (not 3.7, not NaN)
        bad = np.flatnonzero(~(np.isfinite(labels) & (labels == np.round(labels))))
        if bad.size:
            raise DataError(f"{ypath}: {bad.size} labels are not whole numbers (the first, at index {bad[0]}: "
                            f"{float(labels[bad[0]]):g}); a label is a class number")
    return Split(images, labels.astype(np.int64))


def _count_classes(directory: str, train: Split, test: Split) -> int:
    """Largest label + 1 over both splits, counting only labels below MAX_CLASSES;
    the others are named here (file, count, largest) and quarantined later."""
    top = 0
    for key, split in (("train_y", train), ("test_y", test)):
        over = split.labels >= MAX_CLASSES
        if over.any():
            log.warning("%s: %d labels at or above %d (largest %d) are not counted as classes; "
                        "they are quarantined as out of range", _find(directory, FILES[key]),
                        int(over.sum()), MAX_CLASSES, int(split.labels.max()))
        top = max(top, int(split.labels[~over].max(initial=0)))
    return top + 1


def load_idx_dir(directory: str, name: str = "idx") -> Dataset:
    train = _read_split(directory, "train_x", "train_y")
    test = _read_split(directory, "test_x", "test_y")
    # labels out of range (and NaN/Inf pixels) are quarantined, not trained on: see data.quarantine
    classes = CLASSES.get(name) or _count_classes(directory, train, test)
    if train.images.shape[1:] != test.images.shape[1:]:
        raise DataError(f"{directory}: train images {train.images.shape[1:]} and test images "
                        f"{test.images.shape[1:]} differ in size")
    mean, std = STATS[name] if name in STATS else pixel_stats(train.images)
    return Dataset(name, train, test, classes, mean, std)


def pixel_stats(images: np.ndarray) -> tuple[float, float]:
    """(mean, std) of the finite pixels / 255, summed in float64 a chunk at a time: one
    pass and no copy of the whole set (numpy's std of a uint8 set made a float64
    temporary 8 times its size), and finite for any float32 pixels (summed in float32,
    pixels of 1e20 made the std infinite, near 3e38 the mean). The std is 1.0 for
    constant images; (0, 1) when no pixel is finite (no sample to train on: load_data
    says so)."""
    flat = images.reshape(-1)
    total = squares = 0.0
    count = 0
    for lo in range(0, flat.size, _STATS_CHUNK):
        part = flat[lo:lo + _STATS_CHUNK].astype(np.float64)
        if images.dtype.kind == "f":
            part = part[np.isfinite(part)]
        total += float(part.sum())
        squares += float(np.dot(part, part))
        count += part.size
    if not count:
        return 0.0, 1.0
    mean = total / count
    # E[x^2] - mean^2 cancels where the spread is tiny against the mean: pixels are not
    # such data, and a constant set's 0 (or the rounding's slightly negative) gives 1.0
    var = max(squares / count - mean * mean, 0.0)
    return mean / 255, (var ** 0.5) / 255 or 1.0


def synthetic(train_size: int = 2048, test_size: int = 512, image_size: int = 28,
              num_classes: int = 10, seed: int = 0) -> Dataset:
    """Seeded, learnable data: one smooth random prototype per class plus noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 1, (num_classes, 7, 7)).astype(np.float32)
    protos = resize(coarse, image_size)

    def make(n):
        labels = rng.integers(0, num_classes, n)
        noisy = protos[labels] + rng.normal(0, 0.25, (n, image_size, image_size))
        return Split(np.clip(noisy * 255, 0, 255).astype(np.uint8), labels.astype(np.int64))

    train, test = make(train_size), make(test_size)
    return Dataset("synthetic", train, test, num_classes, 0.5, 0.3)


def load_dataset(name: str, data_dir: str | None = None, **synthetic_options) -> Dataset:
    if name == "synthetic":
        return synthetic(**synthetic_options)
    if name not in ("fashion-mnist", "mnist", "idx"):
        raise DataError(f"unknown dataset {name!r}; known: fashion-mnist, mnist, idx, synthetic")
    return load_idx_dir(resolve_dir(name, data_dir), name)
