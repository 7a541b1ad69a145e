"""Chaos trials: LeNet-5 MixBP on 3 streamnet-worker processes and a real ZooKeeper;
each trial SIGKILLs a random worker (the leader included) at a random time.

Reports completed/trials, final accuracy against a fault-free run, detection time
(kill -> the dead worker's tasks reassigned), resume time (kill -> the next
synchronisation round completes), recovery time (kill -> throughput over a 2 s
window is back to >= 95 % of the survivors' steady rate, measured over the later half
of the time from detection + 2 s to the end) and that steady rate against the rate of
the 5 s before the kill - recovery to a steady rate says nothing of how fast that rate
is, this ratio does - and draws throughput over time around each kill.

    python perf/chaos.py [--trials 20] [--quick]

Writes perf/results/chaos.json and perf/results/chaos.png.
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import every_sample_once, machine, out_option, png_beside, spread, started_zookeeper, write_json  # noqa: E402

from streamnet.runtime import wait_for  # noqa: E402
from streamnet.runtime.control import is_done  # noqa: E402
from streamnet.testing import finish, placement, running_cluster  # noqa: E402
from streamnet.training import DataConfig, lenet5_mixbp  # noqa: E402
from streamnet.training.nsmap import build_topology  # noqa: E402
from streamnet.training.summary_from_results import summarise  # noqa: E402


def rounds_at(timeline: list, t: float) -> float:
    """Rounds done at time t, interpolated between progress samples."""
    prev = (0.0, 0)
    for x, n in timeline:
        if x >= t:
            if x == prev[0]:
                return n
            return prev[1] + (n - prev[1]) * (t - prev[0]) / (x - prev[0])
        prev = (x, n)
    return prev[1]


def rate_before(timeline: list, kill_s: float, span: float = 5.0) -> float | None:
    """Rounds/s over the `span` seconds of progress before the kill."""
    before = [x for x in timeline if kill_s - span <= x[0] <= kill_s]
    if len(before) < 2 or before[-1][0] <= before[0][0]:
        return None
    return (before[-1][1] - before[0][1]) / (before[-1][0] - before[0][0])


def recovery(timeline: list, kill_s: float, detection_s: float, window: float = 2.0) -> dict:
    """The survivors' steady rate (rounds/s over the later half of the time from detection
    + 2 s to the end: a slow ramp back does not lower it), the first time after the kill
    at which a `window`-second rate reaches 95 % of it, and that steady rate over the rate
    before the kill (a rate that fell for good is 'recovered' to at once: this ratio says so)."""
    end = timeline[-1][0]
    start = kill_s + detection_s + 2.0
    before = rate_before(timeline, kill_s)
    out = {"capacity_rps": None, "recovered_s": None, "rate_before_rps": before, "steady_over_before": None}
    if end - start < 3.0:
        return out
    mid = (start + end) / 2
    capacity = out["capacity_rps"] = (rounds_at(timeline, end) - rounds_at(timeline, mid)) / (end - mid)
    if before:
        out["steady_over_before"] = capacity / before
    t = kill_s
    while t + window <= end:
        if (rounds_at(timeline, t + window) - rounds_at(timeline, t)) / window >= 0.95 * capacity:
            out["recovered_s"] = t - kill_s
            break
        t += 0.1
    return out


def trial(zk_hosts: str, cfg, rng: random.Random, kill_at: float | None, name: str) -> dict:
    topo = build_topology(cfg, name=name)
    out = {"killed": None, "completed": False}
    with running_cluster(zk_hosts, workers=3) as (c, state):
        t_submit = time.monotonic()
        state.submit_topology(topo.name, topo.to_dict())
        timeline = []   # (seconds since submit, sync rounds)

        def sample():
            p = state.results(topo.name).get("sync.0.progress")
            if p:
                timeline.append((time.monotonic() - t_submit, p["rounds"]))
            return p
        wait_for(lambda: (sample() or {}).get("rounds", 0) >= 1, 120, "training to start", interval=0.1)
        out["start_s"] = time.monotonic() - t_submit
        if kill_at is not None:
            deadline = t_submit + out["start_s"] + kill_at
            wait_for(lambda: sample() is not None and time.monotonic() >= deadline, kill_at + 60, "the kill time",
                     interval=0.1)
            if is_done(state, topo.name):
                raise RuntimeError("training ended before the kill time; the trial tested nothing")
            victim = rng.choice(sorted(state.workers()))
            out["killed"] = {"worker": victim, "was_leader": victim == c.leader(state),
                             "tasks": sorted(c.status(state, victim)["topologies"].get(topo.name, {}).get("tasks", {}))}
            rounds_at_kill = timeline[-1][1]
            t_kill = time.monotonic()
            c.kill9(victim)
            out["kill_at_s"] = t_kill - t_submit
            wait_for(lambda: victim not in placement(state, topo.name).values(), 60,
                     "reassignment", interval=0.05)
            out["detection_s"] = time.monotonic() - t_kill
            # progress is published at most every 0.5 s, so a kill during the last rounds may be
            # followed by the end of training with no newer progress record: count that as resumed
            wait_for(lambda: (sample() or {}).get("rounds", 0) > rounds_at_kill or is_done(state, topo.name), 120,
                     "the next round (or the end)", interval=0.05)
            out["resume_s"] = time.monotonic() - t_kill
        spouts = set(topo.tasks("data"))
        wait_for(lambda: sample() is not None and spouts <= state.done_tasks(topo.name), 900, "the end",
                 interval=0.2)
        results = finish(state, topo.name, 60)
    s = summarise(cfg, results, workers=3)
    out["train_s"] = s.train_s      # the run's start to its last combine: not the teardown after it
    if kill_at is not None:
        out.update(recovery(timeline, out["kill_at_s"], out["detection_s"]))
    out.update({"completed": True, "test_accuracy": s.test_accuracy,
                "each_sample_counted_once": every_sample_once(cfg, s),
                "samples_replayed": s.extra["samples_replayed"], "sync_recoveries": s.extra["sync_recoveries"],
                "timeline": timeline})
    return out


def _s(v) -> str:
    return "n/a" if v is None else f"{v:.1f} s"


def _spread_of(values: list) -> dict | None:
    known = [v for v in values if v is not None]
    return spread(known) if known else None


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="5 short trials")
    p.add_argument("--seed", type=int, default=0)
    out_option(p, "chaos.json")
    a = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    trials = 5 if a.quick and a.trials == 20 else a.trials
    limit = 6000 if a.quick else 24000
    # long enough (about 15 s of training here) that the throughput after a kill can be measured
    cfg = lenet5_mixbp(units=2, epochs=3, data=DataConfig(train_limit=limit, test_limit=2000))
    rng = random.Random(a.seed)
    zk = started_zookeeper()
    out = {"machine": machine(), "trials": trials, "train_limit": limit, "epochs": cfg.epochs, "runs": []}
    try:
        base = trial(zk.hosts, cfg, rng, kill_at=None, name="chaos-base")
        out["fault_free"] = {k: v for k, v in base.items() if k != "timeline"}
        print(f"fault-free: accuracy {base['test_accuracy']:.2%}, {base['train_s']:.1f} s of training, "
              f"{base['timeline'][-1][1]} rounds")
        for i in range(trials):
            try:
                # somewhere in the middle of the run, so the kill lands while it trains
                r = trial(zk.hosts, cfg, rng, kill_at=rng.uniform(0.1, 0.5) * base["train_s"], name=f"chaos-{i}")
            except Exception as e:  # noqa: BLE001 - a failed trial is a result, not a crash
                r = {"completed": False, "error": f"{type(e).__name__}: {e}", "killed": None}
            out["runs"].append(r)
            k = r.get("killed") or {}
            print(f"trial {i + 1:2d}: killed {k.get('worker')}{' (leader)' if k.get('was_leader') else ''} "
                  f"tasks {k.get('tasks')}: " + (f"detected {r['detection_s']:.1f} s, resumed {r['resume_s']:.1f} s, "
                                                 f"recovered {_s(r.get('recovered_s'))} to "
                                                 f"{_x(r.get('steady_over_before'))} the rate before the kill, "
                                                 f"accuracy {r['test_accuracy']:.2%}, counted once "
                                                 f"{r['each_sample_counted_once']}" if r["completed"] else r["error"]))
            write_json(a.out, out)
    finally:
        zk.stop()
    done = [r for r in out["runs"] if r["completed"]]
    out["summary"] = {
        "completed": f"{len(done)}/{trials}",
        "accuracy_gap_pp_max": max((abs(r["test_accuracy"] - base["test_accuracy"]) * 100 for r in done), default=None),
        "detection_s_max": max((r["detection_s"] for r in done), default=None),
        "resume_s_max": max((r["resume_s"] for r in done), default=None),
        "recovered_s_max": max((r["recovered_s"] for r in done if r.get("recovered_s") is not None), default=None),
        "recovered_within_detection_plus_2s": sum(1 for r in done if r.get("recovered_s") is not None
                                                  and r["recovered_s"] <= r["detection_s"] + 2.0),
        "recovery_not_measurable": sum(1 for r in done if r.get("recovered_s") is None),
        # what "recovered" recovered to: the survivors' steady rate over the rate before the kill
        "steady_over_before": _spread_of([r.get("steady_over_before") for r in done]),
        "all_counted_once": all(r["each_sample_counted_once"] for r in done) if done else None,
    }
    print(out["summary"])
    print(f"wrote {write_json(a.out, out)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4))
        for r in done[:8]:
            tl = r["timeline"]
            ts = [tl[0][0] + 0.5 * i for i in range(int((tl[-1][0] - tl[0][0] - 2) / 0.5))]
            rate = [(rounds_at(tl, x + 2) - rounds_at(tl, x)) / 2 for x in ts]
            ax.plot([x - r["kill_at_s"] for x in ts], rate,
                    label=f"{r['killed']['worker']}{' (leader)' if r['killed']['was_leader'] else ''}")
        ax.axvline(0, c="k", ls="--")
        ax.set_xlabel("seconds from the SIGKILL"); ax.set_ylabel("sync rounds/s (2 s window)")
        ax.set_title("throughput around a worker kill"); ax.legend(fontsize=7)
        fig.tight_layout(); fig.savefig(png_beside(a.out), dpi=100)
        print(f"wrote {png_beside(a.out)}")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
