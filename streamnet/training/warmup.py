"""Load the compiled kernels before the first round needs them.

numba keeps the kernels compiled on disk (`cache=True`), but each process loads
them on their first call: 0.4-0.5 s that a new worker's first round would spend
(perf/engine.py, LeNet-5). `streamnet-worker` runs `load_kernels` on its compute
threads when it starts (`--preload`), before it registers, so the first round of
the first topology assigned to it runs at full speed.

The warm-up goes through the code paths training uses - a unit's round, the
sync bolt's combine, an evaluation - on a few synthetic samples, so it loads the
very kernel signatures those paths call, whatever they are.
"""
from __future__ import annotations

import numpy as np

from .. import kernels as K
from ..data import Dataset, Split
from ..nn import build_model
from .bp import Aggregator, ComputeUnit, Contribution, plan_for
from .config import AlgorithmConfig
from .evaluate import evaluate

#: the models a worker gets ready for: the zoo's at their default options
MODELS = ("lenet5",)
SAMPLES = 4


def load_kernels(models: tuple[str, ...] = MODELS) -> None:
    """One tiny round, combine and evaluation of each model, to load their kernels."""
    for name in models:
        model = build_model(name)
        size = model.input_shape[-1]
        split = Split(np.zeros((SAMPLES, size, size), np.uint8), np.arange(SAMPLES, dtype=np.int64) % 10)
        ds = Dataset("warm-up", split, split, 10, 0.5, 0.25)
        for alg in ("mixbp", "cumulative"):      # with an inner optimiser and without one
            plan = plan_for(AlgorithmConfig(name=alg, batch=2, sync_period=2 if alg == "mixbp" else 1))
            unit = ComputeUnit(0, model, plan)
            batches = [np.arange(2), np.arange(2, 4)][:1 if plan.inner is None else 2]
            c = unit.run_round(ds.batch(split, idx, size) for idx in batches)
            K.all_finite(c.vector)
            agg = Aggregator(model.params, plan)
            agg.combine([c, Contribution(1, c.samples, c.steps, c.loss_sum, c.vector, True)])
            unit.receive(agg.params)
        evaluate(model, ds, split)
