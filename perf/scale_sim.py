"""Scale simulation: many streamnet-worker processes on one ZooKeeper, one topology with a
task per worker, one worker SIGKILLed.

Measures, for N workers (64 by default) on this machine: the time for all to register,
the time from submit until every worker has applied the first placement, the time
from SIGKILL of a follower until the leader has moved its tasks (fast detection by
refused connections and a probe, or the session timeout), the time until every
survivor applied the new assignment, and the ZooKeeper nodes the cluster keeps. The
workers run a word count with one task per worker; their compute threads sit idle -
what is measured is the control plane.

    python perf/scale_sim.py [--workers 64] [--session-timeout 10]

Writes perf/results/scale_sim.json. The plan behind it is docs/scale.md.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, out_option, started_zookeeper, write_json  # noqa: E402

from streamnet.examples import wordcount  # noqa: E402
from streamnet.runtime import wait_for  # noqa: E402
from streamnet.testing import Cluster, placement  # noqa: E402


def count_nodes(coord, path: str) -> int:
    kids = coord.children(path)
    return 1 + sum(count_nodes(coord, f"{path}/{k}") for k in kids)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--session-timeout", type=float, default=10.0)
    out_option(p, "scale_sim.json", png=False)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n = a.workers
    out: dict = {"machine": machine(), "workers": n, "session_timeout_s": a.session_timeout}
    zk = started_zookeeper()
    c = state = None
    try:
        t0 = time.monotonic()
        c = Cluster(zk.hosts, workers=n, threads=1, session_timeout=a.session_timeout)
        state = c.state()
        wait_for(lambda: len(state.workers()) == n, 600, f"{n} workers to register", interval=0.5)
        out["register_s"] = round(time.monotonic() - t0, 2)
        print(f"{n} workers registered in {out['register_s']:.1f} s", flush=True)

        # one task per worker: a spout, n/2 splitters and the rest counters; slow enough
        # to run through the kill
        topo = wordcount.topology(name="scale", count=100_000, split=n // 2, counters=n - 1 - n // 2,
                                  delay_s=0.01, max_spout_pending=4 * n, message_timeout_s=60)
        t1 = time.monotonic()
        state.submit_topology(topo.name, topo.to_dict())
        wait_for(lambda: len(placement(state, topo.name)) == topo.num_tasks, 120, "the placement", interval=0.1)
        out["placed_s"] = round(time.monotonic() - t1, 2)
        version = state.assignment(topo.name)[1]
        wait_for(lambda: len(state.applied_workers(topo.name, version)) >= n, 300, "every worker to apply it",
                 interval=0.2)
        out["applied_s"] = round(time.monotonic() - t1, 2)
        tasks = placement(state, topo.name)
        out["workers_with_tasks"] = len(set(tasks.values()))
        print(f"{topo.num_tasks} tasks placed in {out['placed_s']:.2f} s on {out['workers_with_tasks']} workers, "
              f"applied everywhere after {out['applied_s']:.1f} s", flush=True)
        out["zk_nodes_running"] = count_nodes(state.coord, state.base)

        leader = next((w for w in sorted(state.workers()) if (c.status(state, w) or {}).get("leader")), None)
        victim = next(w for w in sorted(tasks.values(), key=lambda w: int(w[1:])) if w != leader)
        moved = [t for t, w in tasks.items() if w == victim]
        t_kill = time.monotonic()
        c.kill9(victim)
        wait_for(lambda: victim not in placement(state, topo.name).values(), 120, "the victim's tasks to move",
                 interval=0.05)
        out["reassigned_s"] = round(time.monotonic() - t_kill, 2)
        version = state.assignment(topo.name)[1]
        wait_for(lambda: len(state.applied_workers(topo.name, version)) >= n - 1, 300,
                 "the survivors to apply it", interval=0.1)
        out["reapplied_s"] = round(time.monotonic() - t_kill, 2)
        out.update(leader=leader, victim=victim, victim_tasks=moved)
        print(f"SIGKILL of {victim} (tasks {moved}): tasks moved after {out['reassigned_s']:.2f} s, "
              f"applied by the {n - 1} survivors after {out['reapplied_s']:.2f} s", flush=True)
        out["target_met"] = out["reassigned_s"] <= 5.0
        path = write_json(a.out, out)
        print(f"wrote {path}")
    finally:
        if state is not None:
            state.coord.close()
        if c is not None:
            c.close()
        zk.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
