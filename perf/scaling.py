"""Scaling curves for NN-S against PyTorch DDP, with workers as users run them.

For 1 and 2 workers (more with --workers): samples/s and wall time to the target
test accuracy (89 % by default) for cumulative BP, online BP and MixBP with
H in {1, 4, 8, 16} (and cumulative, H=1 and H=8 with --overlap: `<mode>-overlap`,
each unit's next round running while its last is combined); the same for PyTorch
DDP over gloo (torchrun) on the same data, model, per-process batch and schedule;
communication bytes per sample; and, as the base an engine is judged by, the
in-process trainer with one unit of each mode (`<mode>/inproc`: the same BP
arithmetic without the engine, pinned to one core). It prints issue 12's ratios: N worker processes / that base, per mode; and
beside them the machine's ceiling for N (`<mode>/inproc xN`: N of those trainers at
once, one per core as the workers are pinned, their samples/s summed): what N
independent units get from these cores, which share caches, memory bandwidth and,
on a VM, perhaps physical cores - so a shortfall of N workers is split into the
machine's and the engine's.

The engine's samples/s are over its whole run, in which every evaluation but the
last runs beside the next epoch on the units' workers; the in-process trainer's are
over its training loops alone (it evaluates between them). Each ratio over the base
or the ceiling is therefore also given with the in-process trainers' evaluations
timed too, all but the last (`... both with their evaluations`): the same work on
both sides.

--engine processes (the default) runs each worker as its own `streamnet-worker`
process on a real ZooKeeper, pinned to core i mod cores; --engine local runs them as
threads of this process (LocalCluster: one interpreter lock, not how users run it).

    python perf/scaling.py [--quick] [--engine processes|local] [--workers 1,2] [--modes ...] [--balance static|load]

--quick trains on 12,000 samples for at most 3 epochs to 85 %: minutes, not an hour.

--pairs N (N > 1) measures each mode's base, ceiling and workers N times, alternating
their order (base first in even pairs, workers first in odd ones), and prints each
ratio as the median of the N pairs' ratios with its quartiles: on a host whose speed
drifts by tens of percent within an hour, one run of each says little.
Writes perf/results/scaling.json and perf/results/scaling.png (--out NAME.json or a
path: the PNG goes beside it).
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (machine, on_one_core, out_option, pin_blas_threads, png_beside, spread, started_zookeeper,  # noqa: E402
                    train_on_worker_processes, write_json, zookeeper_pid)

MODES = {
    "cumulative": dict(name="cumulative", batch=32, sync_period=1, lr=0.05),
    "online": dict(name="online", batch=1, sync_period=1, lr=0.01, momentum=0.0),
    "mixbp-H1": dict(name="mixbp", batch=32, sync_period=1, lr=0.05),
    "mixbp-H4": dict(name="mixbp", batch=32, sync_period=4, lr=0.05),
    "mixbp-H8": dict(name="mixbp", batch=32, sync_period=8, lr=0.05),
    "mixbp-H16": dict(name="mixbp", batch=32, sync_period=16, lr=0.05),
}
# the same with overlap (--overlap: each unit's next round runs while its last is combined)
MODES.update({f"{m}-overlap": dict(MODES[m], overlap=True) for m in ("cumulative", "mixbp-H1", "mixbp-H8")})


def _config(mode: str, workers: int, a):
    from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
    return RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(train_limit=a.train_limit),
                     algorithm=AlgorithmConfig(**MODES[mode]), units=workers, threads=workers,
                     epochs=a.max_epochs, balance=a.balance, sync_tasks=min(a.sync_tasks, workers))


def epoch_rate(history) -> float | None:
    """samples/s over the epochs' own time after the first: for the in-process trainer
    its training loops (its evaluations, run between epochs, are not in them), for the
    engine each epoch's span from the end of the one before to its last round (an
    evaluation running beside the next epoch is in it, the last evaluation is not) - the
    like-for-like rate, where samples_per_s takes the engine over the sync task's whole
    life against the in-process trainer's loops alone. The engine's first epoch starts
    at the run's start (its start-up and first parameters are in it), so the first epoch
    is left out on both sides where a later one was timed."""
    spans = [(h.samples, h.seconds) for h in history if h.seconds and h.samples]
    if len(spans) > 1 and history[0].seconds and history[0].samples:
        spans = spans[1:]
    return sum(n for n, _ in spans) / sum(t for _, t in spans) if spans else None


def evaluating_rate(s) -> float | None:
    """samples/s of an in-process run with its evaluations timed too, all but the last:
    the work the engine's samples_per_s covers (its evaluations run beside the next
    epoch, and its time ends at its last combine)."""
    evals = s.extra.get("eval_s")
    spent = s.train_s + sum(evals[:-1]) if evals is not None else None
    return s.samples_processed / spent if spent else None


def run_streamnet(mode: str, workers: int, a) -> dict:
    cfg = _config(mode, workers, a)
    reached = {}

    def stop(p):
        if p.get("test_accuracy", 0) >= a.target and "t" not in reached:
            reached["t"] = p["elapsed_s"]
        return "t" in reached or p["elapsed_s"] > a.budget_s
    t0 = time.time()
    if a.engine == "local":
        from streamnet.training.cluster_run import train_on_local_cluster
        s, _ = train_on_local_cluster(cfg, workers=workers, threads=1, stop_when=stop)
    else:
        s = train_on_worker_processes(cfg, workers, a.zk_hosts, stop, thread_cpu=True, zk_pid=a.zk_pid)
    hit = [t for t, acc in s.extra["accuracy_at_s"] if acc >= a.target]
    return {"samples_per_s": s.samples_per_s, "epoch_samples_per_s": epoch_rate(s.history),
            "time_to_target_s": hit[0] if hit else None,
            "best_accuracy": max((h.test_accuracy for h in s.history if h.test_accuracy is not None), default=None),
            "epochs_run": len(s.history), "bytes_per_sample": s.extra["bytes_per_sample"],
            "sync_rounds": s.sync_rounds, "wall_s": time.time() - t0, "per_worker": s.extra["per_worker"],
            "thread_cpu": s.extra.get("thread_cpu")}


def run_in_process(mode: str, a) -> dict:
    """One unit of `mode`, no engine, on one core: the base the engine's N workers are
    measured against (issue 12: the honest base, since one unit on the engine is the
    slow case)."""
    from streamnet.training import train_local
    from streamnet.training.warmup import load_kernels
    with on_one_core():
        load_kernels()      # as a worker does at its start (--preload): not in the first epoch's time
        s = train_local(_config(mode, 1, a)).summary
    hit = [h for h in s.history if h.test_accuracy is not None and h.test_accuracy >= a.target]
    return {"samples_per_s": s.samples_per_s, "epoch_samples_per_s": epoch_rate(s.history),
            "samples_per_s_evaluating": evaluating_rate(s),
            "time_to_target_s": None, "epochs_to_target": hit[0].epoch if hit else None,
            "best_accuracy": max((h.test_accuracy for h in s.history if h.test_accuracy is not None), default=None),
            "epochs_run": len(s.history), "bytes_per_sample": 0.0, "wall_s": s.wall_s}


def _trainer_on_core(mode: str, args: dict, core: int, barrier, results) -> None:
    """A child of run_in_process_together: one in-process trainer pinned to `core`."""
    os.sched_setaffinity(0, {core})
    pin_blas_threads(1)
    from streamnet.training import train_local
    from streamnet.training.warmup import load_kernels
    cfg = _config(mode, 1, argparse.Namespace(**args))
    load_kernels()          # as run_in_process and the workers: 0.4-0.5 s out of the first epoch's time
    barrier.wait()  # start training together: a trainer running alone would count the other core's share
    s = train_local(cfg).summary
    results.put({"core": core, "samples_per_s": s.samples_per_s, "epoch_samples_per_s": epoch_rate(s.history),
                 "samples_per_s_evaluating": evaluating_rate(s)})


def run_in_process_together(mode: str, k: int, a) -> dict:
    """k in-process trainers of one unit each at once, as processes pinned to cores
    0..k-1 (mod the cores), like perf's k worker processes: their summed samples/s.
    Over run_in_process's one alone, the ceiling for k workers on this machine (an
    estimate from above: a trainer that finishes first leaves the other its core's
    neighbourhood to itself)."""
    ctx = multiprocessing.get_context("spawn")
    cores = sorted(os.sched_getaffinity(0))
    args = {"train_limit": a.train_limit, "max_epochs": a.max_epochs, "balance": a.balance, "sync_tasks": 1}
    barrier, results = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=_trainer_on_core, args=(mode, args, cores[i % len(cores)], barrier, results))
             for i in range(k)]
    for p in procs:
        p.start()
    try:
        each = [results.get(timeout=a.budget_s + 300) for _ in procs]
    except Exception as e:  # noqa: BLE001 - a child died or hung: reported, not fatal to the other runs
        return {"error": f"in-process trainers together: {type(e).__name__} {e}"}
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    rates = [r["epoch_samples_per_s"] for r in each]
    evaluating = [r["samples_per_s_evaluating"] for r in each]
    return {"samples_per_s": sum(r["samples_per_s"] for r in each),
            "epoch_samples_per_s": sum(rates) if all(rates) else None,
            "samples_per_s_evaluating": sum(evaluating) if all(evaluating) else None, "each": each}


def run_ddp(workers: int, a) -> dict:
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={workers}", "--master_port",
           str(29500 + workers), os.path.join(os.path.dirname(__file__), "ddp_peer.py"), "--out", out,
           "--epochs", str(a.max_epochs), "--target", str(a.target)]
    if a.train_limit:
        cmd += ["--train-limit", str(a.train_limit)]
    if getattr(a, "test_limit", None):           # perf/report.py's profiles: the data the engine's runs had
        cmd += ["--test-limit", str(a.test_limit)]
    if getattr(a, "dataset", None):
        cmd += ["--dataset", a.dataset]
    # in a session of its own: on a timeout the ranks torchrun started go too, not only torchrun
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=a.budget_s * 3 + 300)
        if p.returncode != 0:
            return {"error": err[-2000:]}
        with open(out) as f:
            d = json.load(f)
    except subprocess.TimeoutExpired:
        return {"error": f"DDP did not finish within {a.budget_s * 3 + 300:.0f} s"}
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        os.unlink(out)
    d["best_accuracy"] = max(h["test_accuracy"] for h in d["history"])
    return d


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--modes", default=",".join(list(MODES) + ["ddp"]))
    p.add_argument("--max-epochs", type=int)
    p.add_argument("--target", type=float)
    p.add_argument("--train-limit", type=int)
    p.add_argument("--budget-s", type=float, default=900.0, help="give up on a run after this long")
    out_option(p, "scaling.json")
    p.add_argument("--balance", choices=("static", "load"), default="static",
                   help="the engine's --balance (default static here; load, the commands' default: shares follow "
                        "the units' speeds, and the data spout saves its position every 8 rounds)")
    p.add_argument("--sync-tasks", type=int, default=1,
                   help="S, the sync bolt's parallelism (default 1 here; submit's default is one per worker hosting "
                        "a unit; capped at the units)")
    p.add_argument("--pairs", type=int, default=1,
                   help="measure each mode's base, ceiling and workers this many times, alternating, and give the "
                        "ratios' medians and quartiles over them (default 1: one run of each)")
    p.add_argument("--engine", choices=("processes", "local"), default="processes",
                   help="workers as streamnet-worker processes on ZooKeeper (as users run them), or as threads")
    a = p.parse_args()
    a.max_epochs = a.max_epochs or (3 if a.quick else 10)
    a.target = a.target or (0.85 if a.quick else 0.89)
    a.train_limit = a.train_limit or (12000 if a.quick else None)
    if a.quick:
        a.budget_s = min(a.budget_s, 240.0)
    pin_blas_threads(1)
    logging.basicConfig(level=logging.WARNING)
    workers = [int(w) for w in a.workers.split(",")]
    out = {"machine": machine(), "engine": a.engine, "target_accuracy": a.target, "max_epochs": a.max_epochs,
           "train_limit": a.train_limit, "runs": {}}
    zk = None
    if a.engine == "processes":
        zk = started_zookeeper()
        a.zk_hosts, a.zk_pid = zk.hosts, zookeeper_pid(zk)
    try:
        return _measure(a, workers, out)
    finally:
        if zk is not None:
            zk.stop()


def _ok(run) -> bool:
    return bool(run) and "error" not in run


def mode_ratios(runs: dict, workers: list[int]) -> dict:
    """One mode's ratios from its runs ("inproc": the in-process trainer, "inproc xK": K
    of them at once, "K": K workers), named without the mode: the single runs' and each
    pair's of --pairs are the same figures."""
    ratios, base = {}, runs.get("inproc")
    for k in workers:
        r, together = runs.get(str(k)), runs.get(f"inproc x{k}")
        if _ok(base) and _ok(r):
            ratios[f"{k} worker(s) / in-process 1 unit (samples/s)"] = r["samples_per_s"] / base["samples_per_s"]
            if r.get("epoch_samples_per_s") and base.get("epoch_samples_per_s"):
                ratios[f"{k} worker(s) / in-process 1 unit (epochs' own time)"] = \
                    r["epoch_samples_per_s"] / base["epoch_samples_per_s"]
        if _ok(base) and _ok(r) and base.get("samples_per_s_evaluating"):
            ratios[f"{k} worker(s) / in-process 1 unit, both with their evaluations (samples/s)"] = \
                r["samples_per_s"] / base["samples_per_s_evaluating"]
        if _ok(base) and _ok(together):
            ratios[f"{k} in-process trainers at once / 1 (the machine's ceiling)"] = \
                together["samples_per_s"] / base["samples_per_s"]
            if _ok(r):
                ratios[f"{k} worker(s) / that ceiling"] = r["samples_per_s"] / together["samples_per_s"]
                if together.get("samples_per_s_evaluating"):
                    ratios[f"{k} worker(s) / that ceiling, both with their evaluations"] = \
                        r["samples_per_s"] / together["samples_per_s_evaluating"]
    return ratios


def _paired(mode: str, workers: list[int], a, out: dict) -> None:
    """--pairs: the base, the ceilings and the workers of `mode`, a.pairs times in
    alternating order; each pair's ratios, and their medians and quartiles in out["ratios"]
    (the first pair's runs stand in out["runs"] as a single run's would)."""
    pairs = out.setdefault("pairs", {}).setdefault(mode, [])
    for i in range(a.pairs):
        runs = {}

        def base():
            runs["inproc"] = run_in_process(mode, a)
            for k in workers:
                if k > 1:
                    runs[f"inproc x{k}"] = run_in_process_together(mode, k, a)

        def engine():
            for k in workers:
                runs[str(k)] = run_streamnet(mode, k, a)
        for step in ((base, engine) if i % 2 == 0 else (engine, base)):
            step()
        ratios = mode_ratios(runs, workers)
        pairs.append({"runs": runs, "ratios": ratios})
        print(f"{mode} pair {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()), flush=True)
        if i == 0:
            out["runs"].update({f"{mode}/{k}": v for k, v in runs.items()})
        write_json(a.out, out)
    for name in sorted({n for p in pairs for n in p["ratios"]}):
        values = [p["ratios"][name] for p in pairs if name in p["ratios"]]
        out.setdefault("paired_ratios", {})[f"{mode} {name}"] = {**spread(values), "values": values}


def _measure(a, workers, out) -> int:
    for mode in a.modes.split(","):
        if mode != "ddp" and a.pairs > 1:
            _paired(mode, workers, a, out)
            continue
        if mode != "ddp":
            key = f"{mode}/inproc"
            r = out["runs"][key] = run_in_process(mode, a)
            print(f"{key:<16s}  {r['samples_per_s']:8,.0f} samples/s (in-process trainer, 1 unit, no engine)"
                  + (f"; {r['samples_per_s_evaluating']:,.0f} with its evaluations timed"
                     if r.get("samples_per_s_evaluating") else ""))
            for k in workers:
                if k > 1:
                    key = f"{mode}/inproc x{k}"
                    r = out["runs"][key] = run_in_process_together(mode, k, a)
                    print(f"{key:<16s}  " + (f"failed: {r['error']}" if "error" in r else
                          f"{r['samples_per_s']:8,.0f} samples/s ({k} of them at once, one per core: the ceiling)"))
        for k in workers:
            key = f"{mode}/{k}"
            print(f"{key:<16s} ...", end="", flush=True)
            r = run_ddp(k, a) if mode == "ddp" else run_streamnet(mode, k, a)
            out["runs"][key] = r
            if "error" in r:
                print(f" failed: {r['error'][-300:]}")
                continue
            ttt = r["time_to_target_s"]
            print(f" {r['samples_per_s']:8,.0f} samples/s  to {a.target:.0%}: "
                  f"{'%.1f s' % ttt if ttt else 'not reached'} (best {r['best_accuracy']:.2%})  "
                  f"{r['bytes_per_sample']:,.0f} B/sample")
            for w, acc in sorted((r.get("thread_cpu") or {}).items()):
                if acc:
                    print(f"    {w}: its compute thread had {acc['compute_s'] / acc['window_s']:.0%} of a core while "
                          f"training; per compute second the event loop took {acc['loop_per_compute']:.3f} s, its "
                          f"other threads {acc['other_per_compute']:.3f} s" +
                          (f", the ZooKeeper server {acc['zookeeper_per_compute']:.3f} s"
                           if "zookeeper_per_compute" in acc else ""))
            write_json(a.out, out)
    ratios = {}
    for mode in a.modes.split(","):
        r1, r2 = out["runs"].get(f"{mode}/1"), out["runs"].get(f"{mode}/2")
        if _ok(r1) and _ok(r2):
            ratios[f"{mode} speed-up 2 vs 1 workers"] = r2["samples_per_s"] / r1["samples_per_s"]
    for mode in a.modes.split(","):
        runs = {k.partition("/")[2]: v for k, v in out["runs"].items() if k.partition("/")[0] == mode}
        ratios.update({f"{mode} {name}": v for name, v in mode_ratios(runs, workers).items()})
    mix, ddp = out["runs"].get("mixbp-H8/2"), out["runs"].get("ddp/2")
    if mix and ddp and mix.get("time_to_target_s") and ddp.get("time_to_target_s"):
        ratios["mixbp-H8 time-to-target / ddp (2 workers)"] = mix["time_to_target_s"] / ddp["time_to_target_s"]
    out["ratios"] = ratios
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}" + (" (pair 1)" if a.pairs > 1 and not k.endswith("(2 workers)") else ""))
    for k, v in out.get("paired_ratios", {}).items():
        print(f"{k}, {v['n']} pairs: median {v['median']:.2f} [{v['q1']:.2f}, {v['q3']:.2f}]")
    print(f"wrote {write_json(a.out, out)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for mode in a.modes.split(","):
            xs = [k for k in workers if "error" not in out["runs"].get(f"{mode}/{k}", {"error": 1})]
            axes[0].plot(xs, [out["runs"][f"{mode}/{k}"]["samples_per_s"] for k in xs], "o-", label=mode)
            t = [(k, out["runs"][f"{mode}/{k}"]["time_to_target_s"]) for k in xs
                 if out["runs"][f"{mode}/{k}"]["time_to_target_s"]]
            if t:
                axes[1].plot([k for k, _ in t], [v for _, v in t], "o-", label=mode)
        axes[0].set_xlabel("workers"); axes[0].set_ylabel("samples/s"); axes[0].set_yscale("log"); axes[0].legend()
        axes[1].set_xlabel("workers"); axes[1].set_ylabel(f"seconds to {a.target:.0%}")
        if axes[1].lines:
            axes[1].legend()
        else:
            axes[1].text(0.5, 0.5, f"no run reached {a.target:.0%}", ha="center", transform=axes[1].transAxes)
        for ax in axes:
            ax.set_xticks(workers)
        fig.suptitle("LeNet-5 on Fashion-MNIST: streamnet BP modes vs PyTorch DDP (gloo)")
        png = png_beside(a.out)
        fig.tight_layout(); fig.savefig(png, dpi=100)
        print(f"wrote {png}")
    except ImportError:
        print("matplotlib not installed: no PNG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
