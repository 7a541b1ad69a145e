"""The peer for perf/scaling.py: PyTorch DDP over gloo, launched by torchrun, on the
same data (streamnet's loader), model (LeNet-5 with the same initial weights),
per-process batch, optimiser and learning-rate schedule.

    torchrun --nproc_per_node=2 perf/ddp_peer.py --out FILE [--epochs 10] [--batch 32] [--target 0.89]

`samples_per_s` is over the training loops alone (as the in-process trainer's; before
2026-12-06 it also held rank 0's evaluations after each epoch, during which rank 1
waits); `time_to_target_s` is the wall time from the first step to the evaluation
that reached the target, evaluations included, as a user waits for it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import torch
import torch.distributed as dist


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--target", type=float, default=0.89)
    p.add_argument("--train-limit", type=int)
    p.add_argument("--test-limit", type=int)
    p.add_argument("--dataset", default="fashion-mnist")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from streamnet import nn
    from streamnet.data import epoch_order, shard_indices
    from streamnet.nn.reference import torch_module
    from streamnet.training import DataConfig, load_data
    ds = load_data(DataConfig(dataset=a.dataset, train_limit=a.train_limit, test_limit=a.test_limit))
    model = torch.nn.parallel.DistributedDataParallel(torch_module(nn.lenet5(seed=0)))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    shard = shard_indices(len(ds.train), world, rank, seed=0)
    steps_per_epoch = math.ceil(len(shard) / a.batch)
    total = steps_per_epoch * a.epochs
    test_x, test_y = ds.batch(ds.test, np.arange(len(ds.test)))
    t0 = time.time()
    history, step, samples, reached = [], 0, 0, None
    train_s = 0.0       # the training loops alone, as the in-process trainer's: rank 0's evaluations are not in it
    for epoch in range(a.epochs):
        e0 = time.time()
        order = epoch_order(shard, 0, epoch, rank)
        model.train()
        for i in range(0, steps_per_epoch * a.batch, a.batch):
            idx = order[i:i + a.batch]
            if len(idx) == 0:   # equal step counts on every rank: DDP needs them
                idx = order[:a.batch]
            x, y = ds.batch(ds.train, idx)
            for g in opt.param_groups:
                g["lr"] = a.lr * 0.5 * (1 + math.cos(math.pi * step / total))
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
            opt.step()
            step += 1
            samples += len(idx)
        train_s += time.time() - e0
        acc = None
        if rank == 0:
            model.eval()
            with torch.no_grad():
                acc = float((model.module(torch.from_numpy(test_x)).argmax(1).numpy() == test_y).mean())
            history.append({"epoch": epoch + 1, "test_accuracy": acc, "time_s": time.time() - t0})
            if reached is None and acc >= a.target:
                reached = time.time() - t0
        flag = torch.tensor([1 if reached is not None else 0])
        dist.broadcast(flag, 0)
        if flag.item():
            break
    total_samples = torch.tensor([samples])
    dist.all_reduce(total_samples)
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        # ring all-reduce: each process sends 2 (K-1)/K of the gradient per step
        per_step = 2 * (world - 1) / world * n_params * 4 * world
        with open(a.out, "w") as f:
            json.dump({"processes": world, "history": history, "time_to_target_s": reached,
                       "samples_per_s": int(total_samples.item()) / train_s, "wall_s": time.time() - t0,
                       "bytes_per_sample": per_step * step / max(int(total_samples.item()), 1)}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
