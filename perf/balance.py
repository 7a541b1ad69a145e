"""Load-aware allocation, measured: the thesis' thread-allocation experiment and a
co-tenant slowing one node, with --balance static against --balance load.

(a) threads: LeNet-5 MixBP on streamnet-worker processes with 1 or 2 workers, 1 or
    2 compute threads each, and 1 or 2 units: samples/s of each allocation.
(b) co-tenant: 2 worker processes pinned to their own cores (taskset); halfway
    through epoch 1 a CPU-bound process is started on the core of the worker that
    hosts unit 1 and stopped halfway through the last epoch (3 epochs) or the one
    before it (4 or more, the default: the shares get the rest of the run to come
    back). The same run with
    static and with load balancing: each epoch's time, rounds/s and each unit's
    batch share over time, accuracy at the end; how many rounds the shares took to
    follow the co-tenant and to come back: the data spout's step when the co-tenant
    started or stopped (read from its worker's /metrics at that moment) against the
    step at which it began cutting rounds with the settled shares (its published
    share log: each change's step and time); and the issue's own figure, the rounds
    until the shares matched the speeds the workers then measured under them (within
    10 %), with the part of the co-tenant's time they matched (speeds_response).

    python perf/balance.py                # 30,000 samples x 4 epochs, 3 pairs
    python perf/balance.py --quick        # 9,000 samples
    (--train-limit 60000 --pairs 5 took 6 min 14 s on 2 idle cores of fc-v1045)

The co-tenant experiment runs --pairs static/load pairs (default 3, alternating which
goes first); the ratios come with their median and interquartile range, and the first
pair's time series make the plot.

Writes perf/results/balance.json and balance.png: throughput and shares vs time, the
co-tenant's start and stop marked (--out NAME.json or a path: the PNG goes beside it).
Needs ZooKeeper (Debian's zookeeper) and >= 2 cores.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from perf.common import (machine, out_option, pin_blas_threads, png_beside, spread, started_zookeeper,  # noqa: E402
                         write_json)

pin_blas_threads(1)


def _cfg(units: int, epochs: int, train: int, test: int, balance: str):
    from streamnet.training import DataConfig, lenet5_mixbp
    return lenet5_mixbp(units=units, epochs=epochs, balance=balance,
                        data=DataConfig(train_limit=train, test_limit=test))


def _run(zk_hosts, cfg, workers: int, threads: int, pin: bool, on_progress=None):
    """Train on worker processes; (summary, time series of progress polls, topology)."""
    from streamnet.testing import running_cluster, spout_step
    from streamnet.training.cluster_run import follow
    from streamnet.training.nsmap import build_topology
    from streamnet.training.summary_from_results import summarise
    topo = build_topology(cfg, name=f"balance-{time.time_ns() % 10**9}")
    series = []
    with running_cluster(zk_hosts, workers=workers, threads=threads, session_timeout=10.0, pin_cores=pin) as (_, st):
        st.submit_topology(topo.name, topo.to_dict())
        t0, t0_wall = time.monotonic(), time.time()

        log: list = []

        def progress(p):
            a = st.assignment(topo.name)[0]
            loads = {w: (i.get("load") or {}) for w, i in st.workers().items()}
            row = {"t": time.monotonic() - t0, "rounds": p["rounds"], "samples": p["samples"],
                   "shares": [a.shares.get(t, 1.0) if a else 1.0 for t in topo.tasks("compute")],
                   "placement": {str(t): a.tasks.get(t) for t in topo.tasks("compute")} if a else {},
                   # what the workers last published: each unit's speed (items/s) and others' load
                   "speeds": {t: round(1 / spi) for rec in loads.values()
                              for t, spi in rec.get("seconds_per_item", {}).get(topo.name, {}).items()},
                   # each speed's relative error as published: the balancer's noise threshold
                   "errors": {t: e for rec in loads.values()
                              for t, e in rec.get("speed_error", {}).get(topo.name, {}).items()},
                   # the share each speed was measured under (the balancer uses only those
                   # measured under the share in force)
                   "measured_under": {t: w for rec in loads.values()
                                      for t, w in rec.get("work_share", {}).get(topo.name, {}).items()},
                   "foreign_busy": {w: rec.get("foreign_busy") for w, rec in loads.items()}}
            series.append(row)
            log[:] = st.balance_log(topo.name)          # kept: the topology's nodes go when it ends
            if on_progress:
                on_progress(row, lambda: spout_step(st, topo.name, topo.tasks("data")[0]))
        results, wall = follow(st, topo, cfg, progress=progress, poll_s=0.2)
    share_log = results.get("data.0.shares", [])
    for entry in share_log:
        entry["t"] = entry["time"] - t0_wall
    return summarise(cfg, results, workers=workers, wall_s=wall), series, log, share_log


def threads_table(zk_hosts, train: int) -> list[dict]:
    rows = []
    for workers, threads, units in ((1, 1, 1), (1, 2, 1), (1, 2, 2), (2, 1, 2)):
        cfg = _cfg(units, 1, train, 1000, "static")
        s, *_ = _run(zk_hosts, cfg, workers, threads, pin=workers > 1)
        rows.append({"workers": workers, "threads_per_worker": threads, "units": units,
                     "samples_per_s": round(s.samples_per_s), "wall_s": round(s.wall_s, 1)})
        print(f"  {workers} worker(s) x {threads} thread(s), {units} unit(s): {s.samples_per_s:,.0f} samples/s",
              flush=True)
    return rows


class CoTenant:
    """A CPU-bound process on one core, started and stopped by sample counts."""

    def __init__(self, train: int, epochs: int):
        # on halfway through epoch 1; off halfway through the last epoch (3 epochs), or through
        # the one before it (4 or more: the shares have the rest of the run to come back)
        self.start_at = train // 2
        self.stop_at = (epochs - (1 if epochs <= 3 else 2)) * train + train // 2
        self.proc = None
        self.on = self.off = None        # (t, rounds, the spout's step) when it started / stopped

    def __call__(self, row, step):
        if self.on is None and row["samples"] >= self.start_at:
            self.proc = subprocess.Popen(["taskset", "-c", str(self._core(row)), sys.executable, "-c",
                                          "while True: pass"])
            self.on = (row["t"], row["rounds"], step())
        elif self.on is not None and self.off is None and row["samples"] >= self.stop_at:
            self.kill()
            self.off = (row["t"], row["rounds"], step())

    @staticmethod
    def _core(row) -> int:
        unit1 = sorted(row["placement"], key=int)[1]         # the worker that hosts unit 1
        return int(row["placement"][unit1][1:]) % len(os.sched_getaffinity(0))    # Cluster pins w<i> to core i

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _first_entry(share_log, since, test):
    """The first entry of the share log at or after the co-tenant event `since` (t,
    rounds, step) whose shares pass test(shares), or None."""
    if since is None or since[2] is None:
        return None
    return next((e for e in share_log if e["t"] >= since[0] and test(e["shares"])), None)


def _after(entry, since):
    """(rounds, seconds) from the event `since` to a share-log entry, or Nones. Rounds: the
    spout's step at that change minus its step at the event."""
    return (entry["step"] - since[2], round(entry["t"] - since[0], 2)) if entry else (None, None)


def _first_change(share_log, since, test):
    """(rounds, seconds) from the co-tenant event `since` to the first change of shares
    after which test(shares) holds, or Nones."""
    return _after(_first_entry(share_log, since, test), since)


def busy_epochs(epochs: int) -> range:
    """The epochs wholly under the co-tenant (CoTenant: on halfway through the first,
    off halfway through the last or the one before it): none in a run of 1 or 2 epochs
    (it gave them all, each only half under it)."""
    return range(1, epochs - (1 if epochs <= 3 else 2)) if epochs > 2 else range(0)


LOADED = 1       # the co-tenant runs on the core of the worker that hosts unit 1 (CoTenant._core)
NEAR = 0.1       # shares within this fraction of each other are "there"


def _in_force(share_log: list, t: float) -> list | None:
    """The shares the spout cut rounds with at time t (None before its first change)."""
    shares = None
    for e in share_log:
        if e["t"] <= t:
            shares = e["shares"]
    return shares


def share_response(share_log: list, on, off) -> dict:
    """How the balancer's shares answered the co-tenant, from the data spout's share log
    (each change's step, time t since the start, and the shares it cut rounds with) and
    the co-tenant's start and stop (t, rounds, step).

    settled_shares: those in force when the co-tenant stopped (or at the end). The shares
    followed if they then gave the loaded unit at least NEAR less than it had when the
    co-tenant started; rounds_to_follow is the spout's steps from the start to the first
    change within NEAR of the settled shares, epoch_followed the epoch it came in.
    rounds_to_return: from the stop to the first change back within NEAR of where they
    were before, or of equal shares."""
    if on is None or not share_log:
        return {"settled_shares": None, "rounds_to_first_change": None, "seconds_to_first_change": None,
                "rounds_to_follow": None, "seconds_to_follow": None, "epoch_followed": None,
                "rounds_to_return": None, "seconds_to_return": None, "median_shares": None,
                "rounds_to_median": None, "seconds_to_median": None}
    n = len(share_log[0]["shares"])
    before = _in_force(share_log, on[0]) or [1.0] * n
    settled = _in_force(share_log, off[0] if off else float("inf")) or before

    def near(shares, goal):
        return all(abs(a - b) <= NEAR * b for a, b in zip(shares, goal))
    out = {"settled_shares": settled}
    out["rounds_to_first_change"], out["seconds_to_first_change"] = _first_change(
        share_log, on, lambda sh: sh != before)
    moved = settled[LOADED] < (1 - NEAR) * before[LOADED]
    follow = _first_entry(share_log, on, lambda sh: near(sh, settled)) if moved else None
    out["rounds_to_follow"], out["seconds_to_follow"] = _after(follow, on)
    out["epoch_followed"] = follow.get("epoch") if follow else None
    out["rounds_to_return"], out["seconds_to_return"] = _first_change(
        share_log, off, lambda sh: near(sh, before) or near(sh, [1.0] * n))
    # the shares in force at the stop may be a change of a moment before it (the co-tenant's
    # effect varies: 0.56 for 8 s, then 0.62 just before the stop); the median share over
    # the co-tenant's time is where they mostly were
    held = _held_median(share_log, on[0], off[0] if off else share_log[-1]["t"])
    out["median_shares"] = held
    mostly = (_first_entry(share_log, on, lambda sh: near(sh, held))
              if held and held[LOADED] < (1 - NEAR) * before[LOADED] else None)
    out["rounds_to_median"], out["seconds_to_median"] = _after(mostly, on)
    return out


def speeds_response(share_log: list, series: list, on, off) -> dict:
    """How soon the shares matched the speeds measured under them, the issue's own figure
    ("shares within 10 % of the measured speeds"), from the share log and the progress
    polls' published speeds (`series`: each unit's speed and the share it was measured
    under).

    Each change of shares in the co-tenant's time is judged by the speeds the workers
    later published as measured under those shares while they held (the median of each
    unit's speed relative to the mean over those records): the shares match when each
    is within NEAR of its unit's relative speed - the units then finish a round within
    about NEAR of each other. rounds_to_speeds: spout steps from the co-tenant's start to
    the first change that moved work off the loaded unit (its share at least NEAR below
    where it was) and matched; share_time_matched: the part of the co-tenant's time held
    by shares that matched (shares without a record measured under them count as not, and
    so do those in force when it started: until the first change the co-tenant's effect is
    not answered)."""
    out = {"rounds_to_speeds": None, "seconds_to_speeds": None, "share_time_matched": None,
           "matched_changes": None}
    if on is None or not share_log:
        return out
    end = off[0] if off else series[-1]["t"] if series else share_log[-1]["t"]
    keys = sorted({k for r in series for k in r.get("speeds", {})}, key=int)
    n = len(share_log[0]["shares"])
    before = _in_force(share_log, on[0]) or [1.0] * n
    spans = [({"t": on[0], "step": on[2], "shares": before}, None)]      # (entry, until)
    for e in share_log:
        if on[0] < e["t"] < end:
            spans[-1] = (spans[-1][0], e["t"])
            spans.append((e, None))
    spans[-1] = (spans[-1][0], end)
    matched_s, verdicts = 0.0, []
    for e, until in spans:
        seen, rels = set(), []
        for r in series:
            if not e["t"] <= r["t"] < until or len(r.get("speeds", {})) != n:
                continue
            under = r.get("measured_under", {})
            if any(abs(under.get(k, -1.0) - sh) > 1e-6 for k, sh in zip(keys, e["shares"])):
                continue                    # measured (partly) under other shares
            rec = tuple(r["speeds"][k] for k in keys)
            if rec in seen:                 # the same record, polled again
                continue
            seen.add(rec)
            mean = sum(rec) / n
            rels.append([v / mean for v in rec])
        rel = [statistics.median(col) for col in zip(*rels)] if rels else None
        ok = rel is not None and all(abs(sh - v) <= NEAR * v for sh, v in zip(e["shares"], rel))
        verdicts.append({"step": e["step"], "shares": e["shares"], "relative_speeds":
                         [round(v, 3) for v in rel] if rel else None, "records": len(rels), "matched": ok})
        if ok and e["t"] > on[0]:         # the shares in force at the start are the reaction time
            matched_s += until - e["t"]
            if out["rounds_to_speeds"] is None and e["shares"][LOADED] <= (1 - NEAR) * before[LOADED]:
                out["rounds_to_speeds"], out["seconds_to_speeds"] = _after(e, on)
    out["share_time_matched"] = round(matched_s / (end - on[0]), 3) if end > on[0] else None
    out["matched_changes"] = verdicts
    return out


def _held_median(share_log: list, start: float, end: float) -> list | None:
    """The shares held for the median of the time from `start` to `end` (by the loaded
    unit's share), from a share log with at least one entry."""
    spans = []
    for i, e in enumerate(share_log):
        lo = max(e["t"], start)
        hi = min(share_log[i + 1]["t"] if i + 1 < len(share_log) else end, end)
        if hi > lo:
            spans.append((e["shares"], hi - lo))
    if share_log[0]["t"] > start:            # equal shares until the first change
        spans.append(([1.0] * len(share_log[0]["shares"]), min(share_log[0]["t"], end) - start))
    spans.sort(key=lambda s: s[0][LOADED])
    total, acc = sum(d for _, d in spans), 0.0
    for shares, d in spans:
        acc += d
        if acc >= total / 2:
            return shares
    return None


def cotenant(zk_hosts, train: int, epochs: int, order=("static", "load")) -> dict:
    out = {}
    for balance in order:
        hog = CoTenant(train, epochs)
        try:
            s, series, log, share_log = _run(zk_hosts, _cfg(2, epochs, train, 2000, balance), 2, 1, True, hog)
        finally:
            hog.kill()
        run = {"epoch_s": [round(e.seconds, 2) for e in s.history], "test_accuracy": s.test_accuracy,
               "samples_per_s": round(s.samples_per_s), "each_sample_counted_once":
                   s.extra["each_sample_counted_once"], "cotenant_on": hog.on, "cotenant_off": hog.off,
               "series": series, "decisions": log, "share_log": share_log,
               # where each worker's time went, and who held the rounds (the engine's own account)
               "per_worker": s.extra.get("per_worker"), "stragglers": s.extra.get("stragglers")}
        if balance == "load":
            run.update(share_response(share_log, hog.on, hog.off))
            run.update(speeds_response(share_log, series, hog.on, hog.off))
        out[balance] = run
        print(f"  {balance}: epochs {run['epoch_s']} s, accuracy {s.test_accuracy:.2%}, co-tenant "
              f"{hog.on} -> {hog.off}" + (f", shares followed in {run['rounds_to_follow']} rounds, back in "
                                         f"{run['rounds_to_return']} (first change after "
                                         f"{run['rounds_to_first_change']}, matched the speeds measured "
                                         f"under them after {run['rounds_to_speeds']})"
                                         if balance == "load" else ""), flush=True)
    st, ld = out["static"]["epoch_s"], out["load"]["epoch_s"]
    out["ratios"] = {"epoch_time_load_over_static": [round(ld[e] / st[e], 3) for e in busy_epochs(len(st))],
                     "accuracy_load_minus_static_pp": round(100 * (out["load"]["test_accuracy"] -
                                                                   out["static"]["test_accuracy"]), 2)}
    return out


def pair_summary(co: dict) -> dict:
    """What one static/load pair of cotenant() says, without its time series."""
    load = co["load"]
    return {"epoch_time_load_over_static": co["ratios"]["epoch_time_load_over_static"],
            "accuracy_load_minus_static_pp": co["ratios"]["accuracy_load_minus_static_pp"],
            **{k: load.get(k) for k in ("rounds_to_first_change", "rounds_to_follow", "rounds_to_median",
                                        "rounds_to_speeds", "share_time_matched", "matched_changes",
                                        "rounds_to_return", "settled_shares", "median_shares")},
            "static_epoch_s": co["static"]["epoch_s"], "load_epoch_s": load["epoch_s"],
            # what the rounds-to figures were read from (small: one entry per change)
            "cotenant_on": load["cotenant_on"], "cotenant_off": load["cotenant_off"],
            "share_log": [{k: e[k] for k in ("step", "t", "shares")} for e in load["share_log"]],
            "decisions": load["decisions"],
            # what the workers had published at each progress poll: the speeds the decisions saw
            "series": [{k: r[k] for k in ("t", "rounds", "shares", "speeds", "errors", "measured_under",
                                          "foreign_busy")}
                       for r in load["series"]]}


def spread_of_pairs(values) -> dict | None:
    """Median and interquartile range of the values that are there (None where none are)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    s = spread(vals, method="inclusive")
    return {**{k: round(s[k], 3) for k in ("median", "q1", "q3")}, "n": s["n"], "of": len(values)}


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    co = result["cotenant"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for balance, style in (("static", "--"), ("load", "-")):
        s = co[balance]["series"]
        # over the last second at least: the rounds count comes in steps (the sync task publishes
        # its progress every few polls), so shorter spans saw-tooth
        pts = []
        for b in s:
            a = next((a for a in reversed(s) if a["t"] <= b["t"] - 1.0), None)
            if a is not None:
                pts.append((b["t"], (b["rounds"] - a["rounds"]) / (b["t"] - a["t"])))
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"--balance {balance}")
        for key, colour in (("cotenant_on", "red"), ("cotenant_off", "green")):
            if co[balance][key]:
                ax1.axvline(co[balance][key][0], color=colour, linestyle=style, alpha=0.5)
    ax1.set_ylabel("rounds/s")
    ax1.legend()
    ax1.set_title("LeNet-5 MixBP, 2 worker processes on their own cores; co-tenant on unit 1's core "
                  "(red: start, green: stop)", fontsize=8)
    s = co["load"]["series"]
    for k in range(2):
        ax2.plot([r["t"] for r in s], [r["shares"][k] for r in s], label=f"unit {k} share (load)")
    for key, colour in (("cotenant_on", "red"), ("cotenant_off", "green")):
        if co["load"][key]:
            ax2.axvline(co["load"][key][0], color=colour, alpha=0.5)
    ax2.set_ylabel("batch share (mean 1)")
    ax2.set_xlabel("seconds")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller data (about 2 minutes)")
    p.add_argument("--train-limit", type=int, help="training samples per epoch (default 30,000; quick 9,000)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--skip-threads", action="store_true", help="only the co-tenant experiment")
    p.add_argument("--pairs", type=int, default=3,
                   help="static/load pairs of the co-tenant experiment, in alternating order (default 3)")
    p.add_argument("--zk-hosts", help="a running ZooKeeper (default: start one)")
    out_option(p, "balance.json")
    a = p.parse_args()
    if a.epochs < 3:
        p.error(f"--epochs: at least 3, so that an epoch runs wholly under the co-tenant; got {a.epochs}")
    if len(os.sched_getaffinity(0)) < 2:
        print("perf/balance.py needs at least 2 cores", file=sys.stderr)
        return 2
    train = a.train_limit or (9000 if a.quick else 30000)
    zk = None
    if not a.zk_hosts:
        zk = started_zookeeper()
        a.zk_hosts = zk.hosts
    try:
        result = {"machine": machine(), "train_limit": train, "epochs": a.epochs}
        if not a.skip_threads:
            print("(a) thread allocation", flush=True)
            result["threads"] = threads_table(a.zk_hosts, train)
        print(f"(b) co-tenant, static vs load, {a.pairs} pair(s)", flush=True)
        pairs = []
        for i in range(a.pairs):
            co = cotenant(a.zk_hosts, train, a.epochs, ("static", "load") if i % 2 == 0 else ("load", "static"))
            if i == 0:
                result["cotenant"] = co              # the first pair in full: the plot's time series
            pairs.append(pair_summary(co))
            print(f"  pair {i + 1}: load / static epoch time {co['ratios']['epoch_time_load_over_static']}",
                  flush=True)
        result["cotenant_pairs"] = pairs
        result["cotenant_spread"] = {
            "epoch_time_load_over_static": spread_of_pairs(
                [r for p in pairs for r in p["epoch_time_load_over_static"]]),
            **{k: spread_of_pairs([p[k] for p in pairs])
               for k in ("accuracy_load_minus_static_pp", "rounds_to_first_change", "rounds_to_follow",
                         "rounds_to_median", "rounds_to_speeds", "share_time_matched", "rounds_to_return")}}
    finally:
        if zk is not None:
            zk.stop()
    for k, v in result["cotenant_spread"].items():
        print(f"{k}: " + (f"median {v['median']} (IQR {v['q1']}-{v['q3']}, {v['n']} of {v['of']} pairs had one)"
                          if v else "none"))
    path = png_beside(a.out)
    plot(result, path)
    print("wrote", write_json(a.out, result), "and", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
