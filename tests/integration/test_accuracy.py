"""Training on the real Fashion-MNIST (the Debian package dataset-fashion-mnist)."""
import os

import numpy as np
import pytest

from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, train_local

FASHION = "/usr/share/datasets/fashion-mnist"
needs_fashion = pytest.mark.skipif(not os.path.isdir(FASHION),
                                   reason="install dataset-fashion-mnist (make test does)")


@needs_fashion
@pytest.mark.slow
def test_lenet5_reaches_89_percent_in_one_process():
    cfg = RunConfig(model=ModelConfig(name="lenet5"),
                    algorithm=AlgorithmConfig(name="cumulative", batch=64, sync_period=1, lr=0.05),
                    units=1, epochs=10)
    s = train_local(cfg).summary
    print(f"LeNet-5 one process: {[h.test_accuracy for h in s.history]}, {s.samples_per_s:.0f} samples/s")
    assert s.test_accuracy >= 0.89


@needs_fashion
@pytest.mark.slow      # 81 s on two shared cores; the fast part keeps AlexNet's smoke tests on synthetic data
def test_alexnet64_loss_falls_on_resized_fashion_mnist():
    cfg = RunConfig(model=ModelConfig(name="alexnet", options={"input_size": 64}),
                    data=DataConfig(train_limit=1024, test_limit=256),
                    algorithm=AlgorithmConfig(name="cumulative", batch=32, sync_period=1, lr=0.05,
                                              lr_schedule="constant"),
                    units=1, epochs=3)
    s = train_local(cfg).summary
    losses = [h.train_loss for h in s.history]
    assert np.isfinite(losses).all() and losses[-1] < losses[0] * 0.9, losses
