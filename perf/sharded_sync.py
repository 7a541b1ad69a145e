"""Sharded synchronisation: bytes in + out per round of one sync task, S sync tasks
against one, in the same run (issue 12's target: AlexNet-64, 4 units, S=4 / S=1 <= 0.3x).

A short run per S on the embedded cluster (synthetic data, a few rounds; the bytes
of a round do not depend on the data or the batch): each sync task's counters
(`sync.<s>.stats`: contribution bytes received, parameter bytes sent) divided by its
rounds. The busiest sync task is the one that limits the round. Writes
perf/results/sharded_sync.json.

    python perf/sharded_sync.py                 # AlexNet-64, 4 units, S = 1 and 4
    python perf/sharded_sync.py --model lenet5 --units 2 --sync-tasks 2
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, out_option, pin_blas_threads, write_json  # noqa: E402


def per_task_bytes(results: dict) -> list[dict]:
    """Each sync task's bytes in, out and per round."""
    from streamnet.training.run_stats import sync_stats_of
    out = []
    for s, st in enumerate(sync_stats_of(results)):
        out.append({"slice": s, "rounds": st.sync_rounds, "bytes_in": st.bytes_received, "bytes_out": st.bytes_sent,
                    "bytes_per_round": st.bytes_total / max(st.sync_rounds, 1)})
    return out


def measure(model: str, units: int, sync_tasks: int, rounds: int) -> dict:
    from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
    from streamnet.training.cluster_run import train_on_local_cluster
    batch = 2
    options = {"input_size": 64} if model == "alexnet" else {}
    cfg = RunConfig(model=ModelConfig(name=model, options=options),
                    data=DataConfig(dataset="synthetic", synthetic_train=units * batch * rounds, synthetic_test=8),
                    algorithm=AlgorithmConfig(name="mixbp", batch=batch, sync_period=1, lr=0.01),
                    units=units, threads=units, epochs=1, sync_tasks=sync_tasks)
    summary, results = train_on_local_cluster(cfg, workers=units)
    tasks = per_task_bytes(results)
    return {"sync_tasks": sync_tasks, "num_params": summary.num_params, "rounds": summary.sync_rounds,
            "tasks": tasks, "busiest_bytes_per_round": max(t["bytes_per_round"] for t in tasks),
            "train_s": summary.train_s}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("alexnet", "lenet5"), default="alexnet")
    p.add_argument("--units", type=int, default=4)
    p.add_argument("--sync-tasks", type=int, default=None, help="S to compare with S=1 (default: --units)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3)")
    out_option(p, "sharded_sync.json", png=False)
    a = p.parse_args()
    pin_blas_threads(1)
    s = a.sync_tasks or a.units
    base, sharded = measure(a.model, a.units, 1, a.rounds), measure(a.model, a.units, s, a.rounds)
    ratio = sharded["busiest_bytes_per_round"] / base["busiest_bytes_per_round"]
    for r in (base, sharded):
        print(f"S={r['sync_tasks']}: {a.model} ({r['num_params']:,} parameters), {a.units} units, "
              f"{r['rounds']} rounds; bytes in + out per round per sync task: "
              + ", ".join(f"{t['bytes_per_round'] / 1e6:.1f} MB" for t in r["tasks"]))
    print(f"busiest sync task's bytes per round, S={s} / S=1: {ratio:.3f}x (target <= 0.3x)")
    path = write_json(a.out, {"machine": machine(), "model": a.model, "units": a.units,
                                            "runs": [base, sharded], "ratio": ratio})
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
