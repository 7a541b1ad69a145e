"""Training options shared by `train` and (later) `submit`: a named setup, then a few overrides."""
from __future__ import annotations

import argparse
from dataclasses import replace

from ..training.config import (ALGORITHMS, DATASETS, MODELS, SETUPS, AlgorithmConfig, DataConfig,
                               ModelConfig, RunConfig)


def add_training_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=MODELS, default="lenet5")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="mixbp")
    p.add_argument("--dataset", choices=DATASETS, default="fashion-mnist")
    p.add_argument("--data", metavar="DIR", help="IDX directory (default: the dataset's installed location "
                   "or $STREAMNET_DATA)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--workers", type=int, help="compute units (model replicas)")
    p.add_argument("--threads", type=int, help="compute threads (default: one per unit)")
    p.add_argument("--batch", type=int, help="local batch b per unit")
    p.add_argument("--sync-period", type=int, help="H: local steps between synchronisations (mixbp)")
    p.add_argument("--lr", type=float)
    p.add_argument("--momentum", type=float)
    p.add_argument("--outer-momentum", type=float, help="Nesterov momentum on the averaged change (mixbp)")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"))
    p.add_argument("--input-size", type=int, help="AlexNet input size: 64 or 224")
    p.add_argument("--train-limit", type=int, help="use only the first N training samples")
    p.add_argument("--test-limit", type=int, help="evaluate on only the first N test samples")
    p.add_argument("--seed", type=int, default=0)


def config_from_args(a: argparse.Namespace) -> RunConfig:
    name = f"{a.model}-{a.algorithm}"
    base = SETUPS[name]() if name in SETUPS else RunConfig(
        model=ModelConfig(name=a.model), algorithm=AlgorithmConfig(name=a.algorithm,
                                                                     sync_period=1 if a.algorithm != "mixbp" else 8))
    model = base.model
    if a.input_size is not None:
        model = ModelConfig(name=model.name, options={**model.options, "input_size": a.input_size})
    alg_over = {k: v for k, v in {
        "batch": a.batch, "sync_period": a.sync_period, "lr": a.lr, "momentum": a.momentum,
        "outer_momentum": a.outer_momentum, "lr_schedule": a.lr_schedule}.items() if v is not None}
    alg = replace(base.algorithm, **alg_over)
    data = DataConfig(dataset=a.dataset, data_dir=a.data, train_limit=a.train_limit, test_limit=a.test_limit)
    units = a.workers if a.workers is not None else base.units
    return replace(base, model=model, algorithm=alg, data=data, units=units,
                   threads=a.threads if a.threads is not None else units,
                   epochs=a.epochs if a.epochs is not None else base.epochs, seed=a.seed)
