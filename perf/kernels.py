"""Train-step throughput: streamnet's numba kernels against PyTorch, same network,
weights, batch and thread count, measured in paired alternating blocks in one
process, plus a per-layer table and the 2-thread / 1-thread step speed-up.

    python perf/kernels.py [--quick] [--parts layers,steps,threads] [--pairs 15] [--out NAME.json]
    python perf/kernels.py --final    # the closing check on a quiet machine, < 4 min

Method (a shared 2-core machine, so every figure is a ratio of paired blocks):
- 1-thread figures run with this process pinned to one core (sched_setaffinity),
  BLAS and torch at one thread; each pair times a block of streamnet and a block
  of PyTorch back to back, alternating which goes first; the report is the median
  and interquartile range of the per-pair ratio (> 1: streamnet is faster).
- The per-layer table times each layer's forward and backward the same way for
  both: the layer alone, on the activations the network really feeds it; a fused
  compute step (nn/model.py compute_order, e.g. conv1+maxpool+relu) against the
  same PyTorch modules in sequence.
- The matmul peak (1024^3 sgemm, one core) is measured in the same run, before
  and after the step figures; the higher is the one a step's share is taken of
  (one idle 16-core VM gave 161 and 186 GFLOP/s minutes apart).
- The thread figure pairs `ParallelStep(threads=2)` against one thread on the same
  batch: the calling thread pinned to one core, the step's second thread to another
  core on a different physical core where the machine says which (SMT siblings
  share one core's units); the load average is recorded with every figure. In the
  same loop of alternating blocks, a whole SGD step on 2 threads against PyTorch's
  on 2 threads (torch.set_num_threads(2), its threads free on both cores). Before
  them, the host's wake-up round trip between the two cores (a threading.Event
  there and back): each step pays it to start and join its second thread, and a
  thread that finds the interpreter lock held pays it to be woken, so it is what
  the 2-thread figure of a small model depends on from one host to the next.
- `--final`: only the figures the closing note needs (FINAL_CASES: 1-thread steps
  against PyTorch with their share of the matmul peak, and 2-thread / 1-thread),
  15 pairs each, pinned as above; 156 s on an idle 16-core machine (python 3.12,
  empty numba cache, so its compile included). Writes perf/results/kernels-final.json.

Writes perf/results/kernels.json and perf/results/kernels.png (the per-layer table; with --out,
the PNG goes beside the JSON).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, median, pin_blas_threads, png_beside, spread, write_json  # noqa: E402

STEP_CASES = [("lenet5", 32), ("lenet5", 64), ("alexnet64", 32), ("alexnet64", 64), ("alexnet224", 16)]
LAYER_CASES = [("lenet5", 64), ("alexnet64", 32)]
THREAD_CASES = [("lenet5", 64), ("alexnet64", 64)]
FINAL_CASES = [("lenet5", 64), ("alexnet64", 32), ("alexnet64", 64)]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer, shorter blocks (a smoke run)")
    p.add_argument("--parts", default="layers,steps,threads")
    p.add_argument("--models", help="only these networks (comma-separated), e.g. lenet5")
    p.add_argument("--pairs", type=int, help="paired blocks per figure (default 15)")
    p.add_argument("--block-seconds", type=float, help="target length of one block")
    p.add_argument("--core", type=int, help="core for 1-thread figures (default: picked, see pick_cores)")
    p.add_argument("--out", help="results file name under perf/results (default kernels.json, "
                                 "kernels-final.json with --final); a partial run can go beside the full one")
    p.add_argument("--final", action="store_true",
                   help="the closing check: steps and threads for LeNet-5 b64 and AlexNet-64 b32/b64 "
                        "(15 pairs each, under 4 minutes on an idle machine); writes kernels-final.json")
    return p.parse_args()


def physical_core(cpu: int) -> tuple:
    """(package, core) of a logical CPU, from sysfs; the CPU itself where it is not there."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as f, open(base + "core_id") as g:
            return int(f.read()), int(g.read())
    except (OSError, ValueError):
        return (-1, cpu)


def pick_cores(allowed: set[int], n: int) -> list[int]:
    """n CPUs of the allowed set (e.g. what `taskset` left this process), each on a
    different physical core while there are enough, CPU 0 (interrupts) last."""
    order = sorted(allowed, key=lambda c: (c == 0, c))
    chosen, seen = [], set()
    for c in order:
        if physical_core(c) not in seen:
            chosen.append(c)
            seen.add(physical_core(c))
    chosen += [c for c in order if c not in chosen]
    return chosen[:n]


def build(name: str):
    from streamnet import nn
    if name == "lenet5":
        return nn.lenet5(seed=0)
    return nn.alexnet(int(name[len("alexnet"):]), dropout=0.0, seed=0)


def batch_for(model, batch: int):
    import numpy as np
    rng = np.random.default_rng(0)
    size = model.input_shape[1]
    return rng.standard_normal((batch, 1, size, size)).astype(np.float32), rng.integers(0, 10, batch)


def layer_macs(spec: dict) -> list[float]:
    """Multiply-adds of each layer's forward pass, per sample."""
    c, h, w = spec["input_shape"]
    out = []
    for layer in spec["layers"]:
        t, macs = layer["type"], 0.0
        if t == "conv2d":
            k, s, p = layer["kernel"], layer["stride"], layer["padding"]
            h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            macs = layer["out_channels"] * c * k * k * h * w
            c = layer["out_channels"]
        elif t in ("maxpool", "avgpool"):
            h, w = (h - layer["kernel"]) // layer["stride"] + 1, (w - layer["kernel"]) // layer["stride"] + 1
        elif t == "dense":
            macs = layer["in_features"] * layer["out_features"]
        out.append(float(macs))
    return out


def train_flops(spec: dict) -> float:
    """Forward multiply-adds x 2 FLOPs x 3 (forward, dx, dw) per sample."""
    return 6.0 * sum(layer_macs(spec))


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


def load() -> float:
    return os.getloadavg()[0]


def paired(a, b, pairs: int) -> tuple[list[float], list[float]]:
    """Seconds per call of a and b, timed in alternating order, one pair per entry."""
    ta, tb = [], []
    for i in range(pairs):
        if i % 2 == 0:
            ta.append(a()); tb.append(b())
        else:
            tb.append(b()); ta.append(a())
    return ta, tb


def reps_for(fn, block_s: float) -> int:
    t = time.perf_counter(); fn(); dt = time.perf_counter() - t
    return max(1, int(block_s / max(dt, 1e-5)))


def timed_block(fn, reps: int):
    def run():
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t) / reps
    return run


# -- whole steps ---------------------------------------------------------------

def step_pair(name: str, batch: int):
    """(ours, theirs): one SGD step each, same weights, batch and optimiser."""
    import numpy as np
    import torch
    from streamnet import kernels as K
    from streamnet.nn import reference
    model = build(name)
    x, y = batch_for(model, batch)
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
    return model, ours, theirs


def measure_steps(cases, pairs, block_s, peak) -> dict:
    out = {}
    for name, batch in cases:
        model, ours, theirs = step_pair(name, batch)
        for fn in (ours, theirs):  # numba compile / cache load, torch allocator
            fn(); fn()
        reps = reps_for(ours, block_s)
        load0 = load()
        to, tt = paired(timed_block(ours, reps), timed_block(theirs, reps), pairs)
        ratios = [t / o for o, t in zip(to, tt)]
        flops = train_flops(model.spec()) * batch
        r = {"batch": batch, "steps_per_block": reps, "pairs": pairs,
             "numba_ms": spread([v * 1e3 for v in to]), "torch_ms": spread([v * 1e3 for v in tt]),
             "ratio": spread(ratios), "ratios": ratios,
             "numba_samples_per_s": batch / median(to), "torch_samples_per_s": batch / median(tt),
             "numba_gflops": flops / median(to) / 1e9, "torch_gflops": flops / median(tt) / 1e9,
             "load_before": load0, "load_after": load()}
        r["numba_fraction_of_peak"] = r["numba_gflops"] / peak  # of the first peak: see main
        r["torch_fraction_of_peak"] = r["torch_gflops"] / peak
        out[f"{name}_b{batch}"] = r
        s = r["ratio"]
        print(f"step {name:10s} b{batch:<3d} numba {r['numba_ms']['median']:8.2f} ms  torch "
              f"{r['torch_ms']['median']:8.2f} ms  ratio {s['median']:.2f}x (IQR {s['q1']:.2f}-{s['q3']:.2f})  "
              f"{r['numba_gflops']:.1f} GFLOP/s = {r['numba_fraction_of_peak']:.0%} of peak "
              f"(torch {r['torch_fraction_of_peak']:.0%})  load {load0:.2f}->{r['load_after']:.2f}", flush=True)
    return out


# -- the per-layer table ------------------------------------------------------

def measure_layers(name, batch, pairs, block_s) -> list[dict]:
    """Forward and backward of each layer alone, streamnet's against torch's, on the
    activations the network feeds it, in the model's compute order (a ReLU before
    a max pool runs after it, on both sides). A layer's backward needs its
    forward's saved state, so each timed backward follows an untimed forward."""
    import numpy as np
    import torch
    from streamnet.nn import reference
    model = build(name)
    x, _ = batch_for(model, batch)
    seq = reference.torch_module(model)
    macs = dict(zip(map(id, model.layers), layer_macs(model.spec())))
    rows = []
    h = model._check_input(x)
    rng = np.random.default_rng(1)

    def parts(layer):  # the declared layers of a compute step (a fused one has several)
        return getattr(layer, "parts", [layer])

    def module(layer):
        mods = [seq[model.layers.index(p)] for p in parts(layer)]
        return mods[0] if len(mods) == 1 else torch.nn.Sequential(*mods)
    mods = [module(layer) for layer in model._order]
    for i, (layer, mod) in enumerate(zip(model._order, mods)):
        out = layer.forward(h, True)
        dy = rng.standard_normal(out.shape).astype(np.float32)
        need_dx = i > 0
        th = torch.from_numpy(h.copy()).requires_grad_(need_dx)
        tdy = torch.from_numpy(dy)
        params = list(mod.parameters())
        wrt = ([th] if need_dx else []) + params

        def o_fwd(h=h, layer=layer):
            layer.forward(h, True)

        def o_bwd(h=h, layer=layer, dy=dy, need_dx=need_dx):
            layer.forward(h, True)
            t = time.perf_counter()
            layer.backward(dy, need_dx)
            return time.perf_counter() - t

        def t_fwd(mod=mod, th=th):
            with torch.set_grad_enabled(True):
                mod(th)

        def t_bwd(mod=mod, th=th, tdy=tdy, wrt=wrt):
            o = mod(th)
            if not wrt or not o.requires_grad:
                return 0.0
            t = time.perf_counter()
            torch.autograd.grad(o, wrt, tdy)
            return time.perf_counter() - t

        def bwd_block(fn, reps):
            def run():
                return sum(fn() for _ in range(reps)) / reps
            return run

        for fn in (o_fwd, t_fwd, o_bwd, t_bwd):
            fn(); fn()
        reps = reps_for(o_fwd, block_s / 4)
        load0 = load()
        of, tf = paired(timed_block(o_fwd, reps), timed_block(t_fwd, reps), pairs)
        ob, tb = paired(bwd_block(o_bwd, reps), bwd_block(t_bwd, reps), pairs)
        row = {"layer": i, "name": "+".join(p.name or p.type for p in parts(layer)), "type": layer.type,
               "in_shape": list(h.shape), "gflop_fwd": 2 * sum(macs[id(p)] for p in parts(layer)) * batch / 1e9,
               "numba_fwd_ms": median(of) * 1e3, "torch_fwd_ms": median(tf) * 1e3,
               "numba_bwd_ms": median(ob) * 1e3, "torch_bwd_ms": median(tb) * 1e3,
               "fwd_ratio": spread([t / o for o, t in zip(of, tf) if o > 0]),
               "bwd_ratio": spread([t / o for o, t in zip(ob, tb) if o > 0]) if median(tb) > 0 else None,
               "load": load0}
        rows.append(row)
        print(f"  {name} b{batch} {i:2d} {row['name']:8s} fwd {row['numba_fwd_ms']:8.3f} vs "
              f"{row['torch_fwd_ms']:8.3f} ms   bwd {row['numba_bwd_ms']:8.3f} vs {row['torch_bwd_ms']:8.3f} ms",
              flush=True)
        h = out
    tot = {k: sum(r[k] for r in rows) for k in ("numba_fwd_ms", "torch_fwd_ms", "numba_bwd_ms", "torch_bwd_ms")}
    print(f"  {name} b{batch} sum of layers: numba {tot['numba_fwd_ms'] + tot['numba_bwd_ms']:.2f} ms, "
          f"torch {tot['torch_fwd_ms'] + tot['torch_bwd_ms']:.2f} ms", flush=True)
    return rows


# -- one step on 2 threads against 1 ---------------------------------------------

def wake_round_trip(cores: list[int], n: int = 2000) -> dict:
    """Microseconds for a threading.Event hand-off to a thread on cores[1] and back
    (median and 90th percentile of n, 0.5 ms apart so the other thread sleeps each
    time): what a ParallelStep pays to start its second thread and to join it, and
    what a thread that finds the interpreter lock held waits to be woken. It differs
    by host far more than the kernels do (30 us on the VM where LeNet-5's 2-thread
    step reached 1.7x, 100-330 us on one where it stayed near 1.35x), so the thread
    figures are printed with it."""
    import threading
    go, back = threading.Event(), threading.Event()
    stop = []

    def echo():
        if len(cores) > 1:
            os.sched_setaffinity(0, {cores[1]})
        while True:
            go.wait()
            go.clear()
            if stop:
                return
            back.set()
    t = threading.Thread(target=echo, daemon=True)
    t.start()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        go.set()
        back.wait()
        back.clear()
        times.append((time.perf_counter() - t0) * 1e6)
        time.sleep(0.0005)
    stop.append(True)
    go.set()
    t.join()
    times.sort()
    return {"median_us": times[n // 2], "p90_us": times[int(n * 0.9)], "n": n}


def measure_threads(cases, pairs, block_s, cores: list[int]) -> dict:
    """Two figures per case, in one loop of alternating blocks:
    - speed-up: `ParallelStep(threads=2)` against one thread, loss and gradient;
      the calling thread (both) stays on cores[0], the step's second thread runs on
      cores[1] (unpinned when there is only one core);
    - against PyTorch on 2 threads (torch.set_num_threads(2)): a whole SGD step each
      (as measure_steps), PyTorch's block run with the calling thread allowed both
      cores, so its second OpenMP thread (made then, inheriting that mask) has one;
    - the ceiling of the moment: the two halves of the batch free-running, one per
      core, each thread on a replica of its own, no step around them (no start, join
      or sum, neither waits for the other): one thread's batch time over theirs is
      what two cores give this network's step right then, and the 2-thread step over
      it (`split_efficiency`) what the split itself costs - a figure this host's
      drift moves far less than the speed-up (its quiet and busy spells moved LeNet-5's
      speed-up between 1.55x and 1.80x within one run)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch

    from streamnet import kernels as K
    from streamnet.nn import ParallelStep
    out = {}
    wake = wake_round_trip(cores)
    print(f"threads: a wake-up round trip to core {cores[-1]} and back takes {wake['median_us']:.0f} us "
          f"(p90 {wake['p90_us']:.0f} us)", flush=True)
    second = (lambda: os.sched_setaffinity(0, {cores[1]})) if len(cores) > 1 else None
    both = set(cores[:2])

    def torch_threads(fn, n):
        def run():
            os.sched_setaffinity(0, both)
            torch.set_num_threads(n)
            try:
                return fn()
            finally:
                torch.set_num_threads(1)
                os.sched_setaffinity(0, {cores[0]})
        return run

    for name, batch in cases:
        model, _, theirs = step_pair(name, batch)
        x, y = batch_for(model, batch)
        velocity = np.zeros_like(model.params)
        pool = ThreadPoolExecutor(1, initializer=second)
        two = ParallelStep(model, threads=2, executor=pool)
        twin = ThreadPoolExecutor(1, initializer=second)
        half = batch // 2
        labels = model._check_labels(y, batch)
        halves = [(model.replica(grads=np.zeros(model.num_params, np.float32)), x[lo:hi], labels[lo:hi])
                  for lo, hi in ((0, half), (half, batch))]

        def halves_free(reps):
            def run():
                def loop(rep, xs, ys):
                    for _ in range(reps):
                        rep._loss_and_grad(xs, ys)
                t = time.perf_counter()
                other = twin.submit(loop, *halves[1])
                loop(*halves[0])
                other.result()
                return (time.perf_counter() - t) / reps
            return run
        one = lambda: model.loss_and_grad(x, y)  # noqa: E731
        par = lambda: two.loss_and_grad(x, y)  # noqa: E731

        def par_sgd():
            _, g = two.loss_and_grad(x, y)
            K.sgd_step(model.params, g, velocity, 1e-3, 0.9, 0.0, False)
        for fn in (one, par, par_sgd, torch_threads(theirs, 2)):
            fn(); fn()
        reps = reps_for(one, block_s)
        load0 = load()
        halves_free(1)()
        t1, t2, tf, ts, tt = [], [], [], [], []
        blocks = [(t1, timed_block(one, reps)), (t2, timed_block(par, reps)), (tf, halves_free(reps)),
                  (ts, timed_block(par_sgd, reps)), (tt, torch_threads(timed_block(theirs, reps), 2))]
        for i in range(pairs):  # alternating order, as paired()
            for dst, fn in (blocks if i % 2 == 0 else blocks[::-1]):
                dst.append(fn())
        pool.shutdown()
        twin.shutdown()
        ratios = [a / b for a, b in zip(t1, t2)]
        vs_torch = [b / a for a, b in zip(ts, tt)]
        r = {"batch": batch, "pairs": pairs, "cores": cores[:2], "one_thread_ms": spread([v * 1e3 for v in t1]),
             "two_threads_ms": spread([v * 1e3 for v in t2]), "speedup": spread(ratios),
             "speedups": ratios, "two_threads_sgd_ms": spread([v * 1e3 for v in ts]),
             "torch_two_threads_ms": spread([v * 1e3 for v in tt]), "vs_torch_two_threads": spread(vs_torch),
             "halves_free_ms": spread([v * 1e3 for v in tf]),
             "ceiling": spread([a / f for a, f in zip(t1, tf)]),
             "split_efficiency": spread([f / b for f, b in zip(tf, t2)]),
             "load_before": load0, "load_after": load(), "wake_round_trip": wake}
        out[f"{name}_b{batch}"] = r
        s, v, c, e = r["speedup"], r["vs_torch_two_threads"], r["ceiling"], r["split_efficiency"]
        print(f"threads {name:10s} b{batch}: 1 thread {r['one_thread_ms']['median']:.2f} ms, 2 threads "
              f"{r['two_threads_ms']['median']:.2f} ms, speed-up {s['median']:.2f}x (IQR {s['q1']:.2f}-{s['q3']:.2f}); "
              f"the halves free-running {r['halves_free_ms']['median']:.2f} ms: ceiling {c['median']:.2f}x "
              f"(IQR {c['q1']:.2f}-{c['q3']:.2f}), the step at {e['median']:.1%} of it "
              f"(IQR {e['q1']:.1%}-{e['q3']:.1%}); "
              f"SGD step on 2 threads {r['two_threads_sgd_ms']['median']:.2f} ms vs PyTorch 2 threads "
              f"{r['torch_two_threads_ms']['median']:.2f} ms: {v['median']:.2f}x (IQR {v['q1']:.2f}-{v['q3']:.2f})"
              f"  load {load0:.2f}->{r['load_after']:.2f}", flush=True)
    return out


def plot_layers(tables: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(len(tables), 1, figsize=(10, 3.2 * len(tables)), squeeze=False)
    for ax, (key, rows) in zip(axes[:, 0], tables.items()):
        rows = [r for r in rows if r["type"] != "flatten"]
        xs = np.arange(len(rows))
        for off, who, col in ((-0.2, "numba", "tab:blue"), (0.2, "torch", "tab:orange")):
            f = [r[f"{who}_fwd_ms"] for r in rows]
            b = [r[f"{who}_bwd_ms"] for r in rows]
            ax.bar(xs + off, f, 0.38, color=col, label=f"{who} forward")
            ax.bar(xs + off, b, 0.38, bottom=f, color=col, alpha=0.45, label=f"{who} backward")
        ax.set_xticks(xs, [r["name"] for r in rows], rotation=45, fontsize=8)
        ax.set_ylabel("ms per call"); ax.set_title(f"{key}: per-layer forward + backward, 1 thread")
        ax.legend(fontsize=7)
    fig.tight_layout(); fig.savefig(path, dpi=100)


def summary(results: dict) -> None:
    """The issue's target rows, one line each."""
    peak = results["matmul_peak_gflops"]
    both = results.get("matmul_peak_gflops_before_after", [peak])
    print(f"\nsummary (matmul peak {peak:.1f} GFLOP/s on one core, the higher of "
          f"{' and '.join(f'{v:.1f}' for v in both)}; median, IQR in brackets):")
    for key, r in results.get("steps", {}).items():
        s = r["ratio"]
        print(f"  {key:16s} 1 thread: {s['median']:.2f}x PyTorch ({s['q1']:.2f}-{s['q3']:.2f}), "
              f"{r['numba_fraction_of_peak']:.1%} of peak (PyTorch {r['torch_fraction_of_peak']:.1%})")
    for key, r in results.get("thread_scaling", {}).items():
        s, v = r["speedup"], r["vs_torch_two_threads"]
        e = r.get("split_efficiency")
        print(f"  {key:16s} 2 threads / 1: {s['median']:.2f}x ({s['q1']:.2f}-{s['q3']:.2f})"
              + (f", {e['median']:.1%} of the free-running halves' {r['ceiling']['median']:.2f}x" if e else "") + "; "
              f"2 threads vs PyTorch 2 threads: {v['median']:.2f}x ({v['q1']:.2f}-{v['q3']:.2f}) "
              f"on cores {r['cores']}, load {r['load_before']:.2f}"
              + (f"; wake-up round trip {r['wake_round_trip']['median_us']:.0f} us" if "wake_round_trip" in r else ""))


def main() -> int:
    a = parse()
    t_start = time.perf_counter()
    pin_blas_threads(1)
    import torch
    torch.set_num_threads(1)
    pairs = a.pairs or (5 if a.quick else 15)
    block_s = a.block_seconds or (0.3 if a.quick else (0.5 if a.final else 1.0))
    parts = {"steps", "threads"} if a.final else set(a.parts.split(","))
    keep = (lambda n: n in a.models.split(",")) if a.models else (lambda n: True)
    cores = pick_cores(os.sched_getaffinity(0), 2)
    if a.core is not None:
        cores = [a.core] + [c for c in cores if c != a.core][:1]
    os.sched_setaffinity(0, {cores[0]})
    peak = matmul_peak(1.0 if a.quick else 3.0)
    print(f"matmul peak (1 core): {peak:.1f} GFLOP/s, load {load():.2f}; cores {cores}", flush=True)
    results = {"machine": machine(), "threads": 1, "pinned_core": cores[0], "matmul_peak_gflops": peak,
               "method": "median and IQR of per-pair ratios, alternating order; see perf/kernels.py"}
    step_cases = FINAL_CASES if a.final else STEP_CASES
    thread_cases = FINAL_CASES if a.final else THREAD_CASES
    if "layers" in parts:
        results["layers"] = {f"{n}_b{b}": measure_layers(n, b, pairs, block_s)
                             for n, b in LAYER_CASES if keep(n)}
    if "steps" in parts:
        results["steps"] = measure_steps([c for c in step_cases if keep(c[0])], pairs, block_s, peak)
    if "threads" in parts:
        results["thread_scaling"] = measure_threads([c for c in thread_cases if keep(c[0])], pairs, block_s,
                                                    cores)
    if results.get("steps"):
        os.sched_setaffinity(0, {cores[0]})
        again = matmul_peak(1.0 if a.quick else 3.0)
        results["matmul_peak_gflops_before_after"] = [peak, again]
        if again > peak:
            results["matmul_peak_gflops"] = peak = again
            for r in results["steps"].values():
                r["numba_fraction_of_peak"] = r["numba_gflops"] / peak
                r["torch_fraction_of_peak"] = r["torch_gflops"] / peak
    results["elapsed_s"] = time.perf_counter() - t_start
    summary(results)
    path = write_json(a.out or ("kernels-final.json" if a.final else "kernels.json"), results)
    print(f"wrote {path} ({results['elapsed_s']:.0f} s)")
    if results.get("layers"):
        try:
            png = png_beside(path)   # beside the JSON, as --out says
            plot_layers(results["layers"], png)
            print(f"wrote {png}")
        except ImportError:
            print("matplotlib not installed: no PNG (pip install -e '.[perf]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
