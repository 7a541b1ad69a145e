"""Train-step throughput: streamnet's numba kernels against PyTorch, same network,
weights, batch and thread count, measured in paired alternating blocks in one
process. Also achieved GFLOP/s against a single-precision matmul peak measured
in the same run.

    python perf/kernels.py [--quick] [--threads 1] [--models lenet5,alexnet64]

Writes perf/results/kernels.json and perf/results/kernels.png.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, median, pin_blas_threads, png_path, write_json  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer, shorter blocks (under a minute)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default="lenet5,alexnet64")
    p.add_argument("--blocks", type=int, help="paired blocks per model")
    p.add_argument("--block-seconds", type=float, help="target length of one block")
    return p.parse_args()


def train_flops(spec: dict) -> float:
    """Multiply-adds of one sample's forward pass x 2 FLOPs x 3 (forward, dx, dw)."""
    c, h, w = spec["input_shape"]
    macs = 0
    for layer in spec["layers"]:
        t = layer["type"]
        if t == "conv2d":
            k, s, p = layer["kernel"], layer["stride"], layer["padding"]
            h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            c_out = layer["out_channels"]
            macs += c_out * c * k * k * h * w
            c = c_out
        elif t in ("maxpool", "avgpool"):
            h, w = (h - layer["kernel"]) // layer["stride"] + 1, (w - layer["kernel"]) // layer["stride"] + 1
        elif t == "dense":
            macs += layer["in_features"] * layer["out_features"]
    return 6.0 * macs


def matmul_peak(seconds: float) -> float:
    import numpy as np
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    b = a.copy()
    np.dot(a, b)
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        np.dot(a, b)
        best = max(best, 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9)
    return best


def main() -> int:
    a = parse()
    pin_blas_threads(a.threads)
    import numpy as np
    import torch
    from streamnet import kernels as K
    from streamnet import nn
    from streamnet.nn import reference

    torch.set_num_threads(a.threads)
    blocks = a.blocks or (3 if a.quick else 7)
    block_s = a.block_seconds or (1.5 if a.quick else 4.0)
    cases = {
        "lenet5": (lambda: nn.lenet5(seed=0), 28, 64),
        "alexnet64": (lambda: nn.alexnet(64, dropout=0.0, seed=0), 64, 64),
    }
    peak = matmul_peak(1.0 if a.quick else 3.0)
    print(f"matmul peak ({a.threads} thread{'s' if a.threads > 1 else ''}): {peak:.1f} GFLOP/s")
    results = {"machine": machine(), "threads": a.threads, "matmul_peak_gflops": peak, "models": {}}

    for name in a.models.split(","):
        build, size, batch = cases[name]
        model = build()
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, 1, size, size)).astype(np.float32)
        y = rng.integers(0, 10, batch)
        velocity = np.zeros_like(model.params)
        seq = reference.torch_module(model)
        opt = torch.optim.SGD(seq.parameters(), lr=1e-3, momentum=0.9)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def ours():
            _, g = model.loss_and_grad(x, y)
            K.sgd_step(model.params, g, velocity, 1e-3, 0.9, 0.0, False)

        def theirs():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(seq(tx), ty).backward()
            opt.step()

        for fn in (ours, theirs):  # warm up: numba compile / load, torch allocator
            fn(); fn()
        t = time.perf_counter(); ours(); step_s = time.perf_counter() - t
        steps = max(2, int(block_s / max(step_s, 1e-4)))

        def block(fn):
            t = time.perf_counter()
            for _ in range(steps):
                fn()
            return steps * batch / (time.perf_counter() - t)

        ours_s, theirs_s, ratios = [], [], []
        for i in range(blocks):
            # alternate which goes first so drift on a shared machine hits both alike
            pair = (block(ours), block(theirs)) if i % 2 == 0 else tuple(reversed((block(theirs), block(ours))))
            ours_s.append(pair[0]); theirs_s.append(pair[1]); ratios.append(pair[0] / pair[1])
        flops = train_flops(model.spec())
        r = {
            "batch": batch, "steps_per_block": steps, "blocks": blocks,
            "numba_samples_per_s": median(ours_s), "torch_samples_per_s": median(theirs_s),
            "median_ratio": median(ratios), "ratios": ratios,
            "train_gflop_per_sample": flops / 1e9,
            "numba_gflops": median(ours_s) * flops / 1e9, "torch_gflops": median(theirs_s) * flops / 1e9,
        }
        r["numba_fraction_of_peak"] = r["numba_gflops"] / peak
        results["models"][name] = r
        print(f"{name:10s} batch {batch}: numba {r['numba_samples_per_s']:8.1f}/s  torch "
              f"{r['torch_samples_per_s']:8.1f}/s  ratio {r['median_ratio']:.2f}x  "
              f"({r['numba_gflops']:.1f} GFLOP/s = {r['numba_fraction_of_peak']:.0%} of peak)")

    path = write_json("kernels.json", results)
    print(f"wrote {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        names = list(results["models"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = np.arange(len(names))
        ax.bar(xs - 0.2, [results["models"][n]["numba_samples_per_s"] for n in names], 0.4, label="streamnet (numba)")
        ax.bar(xs + 0.2, [results["models"][n]["torch_samples_per_s"] for n in names], 0.4, label="PyTorch")
        for i, n in enumerate(names):
            ax.annotate(f"{results['models'][n]['median_ratio']:.2f}x", (i, results["models"][n]["numba_samples_per_s"]),
                        ha="center", va="bottom")
        ax.set_xticks(xs, names); ax.set_yscale("log"); ax.set_ylabel("train samples/s")
        ax.set_title(f"train step, {a.threads} thread(s)"); ax.legend()
        fig.tight_layout(); fig.savefig(png_path("kernels.png"), dpi=100)
        print(f"wrote {png_path('kernels.png')}")
    except ImportError:
        print("matplotlib not installed: no PNG (pip install -e '.[perf]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
