"""Quarantine: samples that must never be trained on or scored.

A sample is quarantined when an image value is NaN or infinite (float IDX files)
or its label is outside [0, num_classes). Quarantined samples are removed from the
split before any shard is cut, so every unit and every replay sees the same clean
data; `Dataset.quarantined` says how many and which (indices into the file).
"""
from __future__ import annotations

import logging

import numpy as np

from .datasets import Dataset, Split

log = logging.getLogger(__name__)
SHOWN = 20   # indices listed per split and reason


def bad_samples(split: Split, num_classes: int) -> dict[str, np.ndarray]:
    """{reason: sorted indices} of the samples to quarantine."""
    out = {}
    if split.images.dtype.kind == "f":
        flat = split.images.reshape(len(split.images), -1)
        out["non-finite"] = np.flatnonzero(~np.isfinite(flat).all(axis=1))
    out["label out of range"] = np.flatnonzero((split.labels < 0) | (split.labels >= num_classes))
    return {k: v for k, v in out.items() if v.size}


def quarantine(ds: Dataset) -> Dataset:
    """The dataset without its bad samples, with a report in `quarantined`."""
    report, splits = {}, {}
    for name in ("train", "test"):
        split = getattr(ds, name)
        bad = bad_samples(split, ds.num_classes)
        if not bad:
            splits[name] = split
            continue
        drop = np.unique(np.concatenate(list(bad.values())))
        keep = np.setdiff1d(np.arange(len(split)), drop)
        splits[name] = Split(split.images[keep], split.labels[keep])
        report[name] = {"count": int(drop.size),
                        **{reason: {"count": int(idx.size), "first": idx[:SHOWN].tolist()} for reason, idx in bad.items()}}
        log.warning("%s %s: quarantined %d of %d samples (%s); they are never trained on or scored",
                    ds.name, name, drop.size, len(split),
                    ", ".join(f"{r}: {v['count']}" for r, v in report[name].items() if r != "count"))
    if not report:
        return ds
    return Dataset(ds.name, splits["train"], splits["test"], ds.num_classes, ds.mean, ds.std, report)
