"""What the engine costs one unit: the same training on one `streamnet-worker` process
(one compute thread, pinned to one core, a real ZooKeeper) against the in-process
trainer (no engine) pinned to the same core - paired, alternating, in one run.

The ratio is issue 12's first figure: 1 unit on the engine / the in-process trainer,
same model, batch, H and threads (target >= 0.9x), over the whole run (the first
round included; the worker loads the compiled kernels when it starts, before it
registers - `streamnet-worker --preload` - as the in-process side has them loaded by
its warm-up run) and in the steady state (the epochs after the first). Each pair runs back to back, their order
alternating, so a drift of the machine hits both sides alike; the script prints every
pair and the medians with their ranges, and the engine's own account of its time
(compute, communication, barrier wait).

    python perf/engine.py [--pairs 5] [--train-limit 30000] [--epochs 3] [--balance static|load] [--sync-period 8]

Writes perf/results/engine.json (--out NAME.json or a path for another). Needs ZooKeeper
(Debian's zookeeper) and the dataset.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (machine, median, on_one_core, out_option, pin_blas_threads, started_zookeeper,  # noqa: E402
                    train_on_worker_processes, write_json)

pin_blas_threads(1)


def config(a):
    from streamnet.training import DataConfig, lenet5_mixbp
    cfg = lenet5_mixbp(units=1, epochs=a.epochs, balance=a.balance,
                       data=DataConfig(train_limit=a.train_limit, test_limit=a.test_limit))
    return replace(cfg, threads=1, sync_tasks=1, algorithm=replace(cfg.algorithm, sync_period=a.sync_period))


def in_process(cfg):
    """The in-process trainer's summary, run on core 0 (where the worker process is pinned)."""
    from streamnet.training import train_local
    with on_one_core():
        return train_local(cfg).summary


def steady(summary) -> float:
    """samples/s over the epochs after the first."""
    later = summary.history[1:]
    return sum(h.samples for h in later) / sum(h.seconds for h in later) if later else float("nan")


def per_round(summary) -> dict:
    """The engine's round, from its own account: wall time per round, the part of it the
    unit did not compute (communication, hops, the barrier), and the part of that the
    sync task waited for ZooKeeper to confirm the round's saved counters (its fencing
    check, before the parameters go out)."""
    rounds = max(summary.sync_rounds, 1)
    compute = sum(w["compute_s"] for w in summary.extra["per_worker"].values())
    return {"round_ms": round(summary.train_s / rounds * 1e3, 3),
            "outside_compute_ms": round((summary.train_s - compute) / rounds * 1e3, 3),
            "save_wait_ms": round(summary.extra["sync_save_wait_s"] / rounds * 1e3, 3)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--train-limit", type=int, default=30000)
    p.add_argument("--test-limit", type=int, default=500)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--balance", choices=("static", "load"), default="static",
                   help="the engine side's --balance (load: shares follow the unit's speed; the data spout "
                        "saves its position every 8 rounds)")
    p.add_argument("--sync-period", type=int, default=8,
                   help="MixBP's H, local steps per round (1: a round per step, where the engine's per-round "
                        "cost weighs most)")
    p.add_argument("--zk-hosts", help="a running ZooKeeper (default: start one)")
    out_option(p, "engine.json", png=False)
    a = p.parse_args()
    cfg = config(a)
    zk = None
    if not a.zk_hosts:
        zk = started_zookeeper()
        a.zk_hosts = zk.hosts
    pairs = []
    try:
        in_process(replace(cfg, epochs=1))                   # warm-up: kernel cache, page cache
        for i in range(a.pairs):
            load = os.getloadavg()[0]
            runs = {}
            for side in (("engine", "inproc") if i % 2 == 0 else ("inproc", "engine")):
                runs[side] = in_process(cfg) if side == "inproc" else train_on_worker_processes(cfg, 1, a.zk_hosts,
                                                                                                  thread_cpu=True)
            e, n = runs["engine"], runs["inproc"]
            cpu = next(iter(e.extra["thread_cpu"].values()), None) or {}
            pairs.append({"engine": round(e.samples_per_s, 1), "inproc": round(n.samples_per_s, 1),
                          "ratio": round(e.samples_per_s / n.samples_per_s, 3),
                          "steady_engine": round(steady(e), 1), "steady_inproc": round(steady(n), 1),
                          "steady_ratio": round(steady(e) / steady(n), 3), "load": round(load, 2),
                          "engine_time": e.extra.get("per_worker"), "thread_cpu": cpu, **per_round(e)})
            print(f"pair {i + 1}: engine {e.samples_per_s:,.0f} samples/s, in-process {n.samples_per_s:,.0f}: "
                  f"{pairs[-1]['ratio']:.3f}x; after the first epoch {steady(e):,.0f} vs {steady(n):,.0f}: "
                  f"{pairs[-1]['steady_ratio']:.3f}x (load {load:.2f}); a round on the engine "
                  f"{pairs[-1]['round_ms']:.1f} ms, {pairs[-1]['outside_compute_ms']:.2f} ms of it not computing, "
                  f"{pairs[-1]['save_wait_ms']:.2f} ms waiting for the coordinator's save; per compute second the "
                  f"event loop took {cpu.get('loop_per_compute', float('nan')):.4f} s of CPU and the other threads "
                  f"{cpu.get('other_per_compute', float('nan')):.4f} s", flush=True)
    finally:
        if zk is not None:
            zk.stop()
    ratios, steadies = [r["ratio"] for r in pairs], [r["steady_ratio"] for r in pairs]
    out = {"machine": machine(), "config": {"train_limit": a.train_limit, "epochs": a.epochs, "batch": 32,
                                            "H": a.sync_period, "balance": a.balance},
           "pairs": pairs, "ratio_median": round(median(ratios), 3), "ratio_range": [min(ratios), max(ratios)],
           "steady_ratio_median": round(median(steadies), 3), "steady_ratio_range": [min(steadies), max(steadies)],
           **{f"{k}_median": round(median([r[k] for r in pairs]), 3)
              for k in ("round_ms", "outside_compute_ms", "save_wait_ms")},
           **{f"{k}_median": round(median([r["thread_cpu"][k] for r in pairs if r["thread_cpu"]]), 4)
              for k in ("loop_per_compute", "other_per_compute")},
           "load_end": round(os.getloadavg()[0], 2), "time": time.strftime("%Y-%m-%d %H:%M")}
    print(f"1 unit on the engine / the in-process trainer: {out['ratio_median']:.3f}x over the whole run (range "
          f"{min(ratios):.3f}-{max(ratios):.3f}), {out['steady_ratio_median']:.3f}x after the first epoch (range "
          f"{min(steadies):.3f}-{max(steadies):.3f}); {len(pairs)} pairs; target >= 0.9x")
    print(f"a round on the engine: {out['round_ms_median']:.1f} ms, {out['outside_compute_ms_median']:.2f} ms of it "
          f"not computing, {out['save_wait_ms_median']:.2f} ms waiting for the coordinator's save; the engine's "
          f"own CPU per compute second: event loop {out['loop_per_compute_median']:.4f} s, other threads "
          f"{out['other_per_compute_median']:.4f} s (medians)")
    print("wrote", write_json(a.out, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
