"""training.warmup.load_kernels, which streamnet-worker runs at start (--preload),
loads every kernel signature that a unit's rounds, the sync bolt's combine and an
evaluation then call: after it, training compiles or loads nothing more. Checked
in a fresh process (this one has loaded kernels for other tests already)."""
import json
import os
import subprocess
import sys

PROBE = r"""
import json, numpy as np
from numba.core.registry import CPUDispatcher
from streamnet import kernels as K
from streamnet.data import load_dataset
from streamnet.training import lenet5_mixbp
from streamnet.training.bp import Aggregator, ComputeUnit, plan_for
from streamnet.training.config import AlgorithmConfig
from streamnet.training.evaluate import evaluate
from streamnet.training.schedule import make_model
from streamnet.training.warmup import load_kernels

def loaded():
    return {name: len(d.overloads) for name, d in vars(K).items() if isinstance(d, CPUDispatcher)}

load_kernels()
after_warm_up = loaded()
ds = load_dataset("synthetic", train_size=300, test_size=40, seed=1)
cfg = lenet5_mixbp(units=2)
for alg in (cfg.algorithm, AlgorithmConfig(name="cumulative", batch=32, sync_period=1)):
    plan = plan_for(alg)
    units = [ComputeUnit(k, make_model(cfg), plan) for k in range(2)]
    agg = Aggregator(units[0].model.params, plan)
    steps = alg.sync_period
    cs = [u.run_round((ds.batch(ds.train, np.arange(i * 32, i * 32 + 32), 28) for i in range(steps)), 0.7)
          for u in units]
    for u in units:
        u.receive(agg.combine(cs, 0.7))
    K.all_finite(cs[0].vector)
evaluate(units[0].model, ds, ds.test)
print(json.dumps({"warm_up": after_warm_up, "training": loaded()}))
"""


def test_after_the_warm_up_training_loads_no_kernel():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert any(seen["warm_up"].values()), "the warm-up loaded no kernel at all"
    missed = {k: (seen["warm_up"][k], n) for k, n in seen["training"].items() if n != seen["warm_up"][k]}
    assert not missed, f"kernels training loaded after the warm-up (warm-up, training overloads): {missed}"
