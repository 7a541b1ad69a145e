"""What each page shows, as plain data: a snapshot of the cluster in, JSON out.

Pure functions (no I/O), so they are tested with plain dicts. A snapshot is what
the sampler (server.py) read in one pass: the worker records in the coordinator,
each worker's /status, and per topology its spec, status, assignment and results.
Every figure here comes from /status or the results, and so is also on /metrics.
"""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field

from ..runtime.control.cluster_state import FAILED, REFUSED
from ..training.run_stats import EVAL_HISTORY, PROGRESS, STRAGGLERS

log = logging.getLogger(__name__)

DECISIONS = 12       # scheduler decisions shown on the cluster page
SUMMED = {"training_sync_received_bytes_total", "training_sync_sent_bytes_total"}   # over the sync tasks


@dataclass
class Snapshot:
    taken: float                                   # time.time()
    workers: dict[str, dict]                       # id -> coordinator record (host, port, started, ...)
    statuses: dict[str, dict]                      # id -> /status (absent if it did not answer)
    unreachable: dict[str, str]                    # id -> why its /status did not answer
    topologies: dict[str, dict]                    # name -> {"spec", "status", "assignment", "results"}
    coordinator_error: str | None = None
    loss_curves: dict[str, list] = field(default_factory=dict)   # name -> [[round, loss], ...]
    before: "Snapshot | None" = None               # the pass before, for rates (capacity)


def _tasks(snap: Snapshot, name: str):
    """(worker, task id, task status) of a topology's tasks, over every worker."""
    for w, s in snap.statuses.items():
        for task, m in s.get("topologies", {}).get(name, {}).get("tasks", {}).items():
            yield w, int(task), m


def figures(m: dict) -> dict[tuple, float]:
    """A task's Context.figure numbers: (name, labels...) -> value."""
    return {(f["name"], *sorted(f["labels"].items())): f["value"] for f in m.get("figures", ())}


def cluster_view(snap: Snapshot) -> dict:
    rows = []
    for w, rec in sorted(snap.workers.items()):
        s = snap.statuses.get(w)
        rows.append({
            "id": w, "host": rec.get("host"), "port": rec.get("port"),
            "threads": s["threads"] if s else rec.get("threads"),
            "busy_ratio": s["busy_fraction"] if s else None,
            "tasks": sum(len(t["tasks"]) for t in s["topologies"].values()) if s else None,
            "uptime_s": max(0.0, snap.taken - rec["started"]) if rec.get("started") else None,
            "leader": bool(s and s.get("leader")),
            "error": snap.unreachable.get(w),
        })
    leader = next((r["id"] for r in rows if r["leader"]), None)
    # the leader's recent load-balancing decisions, with their numbers (newest first)
    balance = (snap.statuses.get(leader) or {}).get("balance") or {} if leader else {}
    decisions = sorted((e for history in balance.values() for e in history), key=lambda e: -e["time"])[:DECISIONS]
    return {"workers": rows, "leader": leader, "coordinator_error": snap.coordinator_error, "taken": snap.taken,
            "decisions": decisions}


def graph(spec: dict) -> dict:
    """Nodes (components with kind and parallelism) in layers by distance from the
    spouts, and one labelled edge per subscription (cycles allowed: training's
    sync -> compute edges point back)."""
    comps = spec.get("components", [])
    depth = {c["id"]: 0 for c in comps if c["kind"] == "spout"}
    frontier = list(depth)
    while frontier:                       # breadth first: an edge back to an earlier layer stays there
        nxt = []
        for src in frontier:
            for c in comps:
                if c["id"] not in depth and any(i["component"] == src for i in c.get("inputs", ())):
                    depth[c["id"]] = depth[src] + 1
                    nxt.append(c["id"])
        frontier = nxt
    nodes = [{"id": c["id"], "kind": c["kind"], "parallelism": c["parallelism"],
              "class": c["class"].rpartition(":")[2], "layer": depth.get(c["id"], 0)} for c in comps]
    edges = []
    for c in comps:
        for i in c.get("inputs", ()):
            g = i["grouping"]
            label = g["type"] + (f"({','.join(g['fields'])})" if g.get("fields") else "")
            if i.get("stream", "default") != "default":
                label += f" [{i['stream']}]"
            edges.append({"from": i["component"], "to": c["id"], "label": label})
    return {"nodes": nodes, "edges": edges}


def _capacity(snap: Snapshot, name: str) -> dict[int, float]:
    """Storm's capacity per task: the fraction of the last interval it spent executing
    (the rate of streamnet_task_execute_seconds_sum). Absent for a task new since then."""
    b = snap.before
    if b is None or snap.taken <= b.taken:
        return {}
    then = {(w, task): m.get("execute_s_total", 0.0) for w, task, m in _tasks(b, name)}
    return {task: max(0.0, m.get("execute_s_total", 0.0) - then[(w, task)]) / (snap.taken - b.taken)
            for w, task, m in _tasks(snap, name) if (w, task) in then}


def failures(results: dict) -> list[dict]:
    """Why a topology cannot run: a task that failed to start (failed.<task>: its
    prepare() or open() raised) and a worker that refused the spec (refused.<worker>),
    as the client's wait_done reports them."""
    out = []
    for key in sorted(results):
        for prefix, what in ((FAILED, "task"), (REFUSED, "worker")):
            if key.startswith(prefix):
                out.append({"kind": prefix.rstrip("."), "where": f"{what} {key[len(prefix):]}",
                            "error": str(results[key])})
    return out


def each(view, snap: Snapshot, names) -> list[dict]:
    """view(snap, name) for each name, leaving out (and logging) one whose stored spec or
    results it cannot read, so that one such topology does not take the whole page with it."""
    out = []
    for name in names:
        try:
            out.append(view(snap, name))
        except Exception as e:  # noqa: BLE001 - what clients stored: the other topologies are shown
            log.warning("ui: topology %s left out of %s: %s: %s", name, view.__name__, type(e).__name__, e)
    return out


def topology_view(snap: Snapshot, name: str) -> dict:
    t = snap.topologies[name]
    spec, assignment = t["spec"], t.get("assignment") or {}
    per = defaultdict(lambda: {"tasks": 0, "executed": 0, "emitted": 0, "acked": 0, "failed": 0,
                               "execute_s": 0.0, "execute_p99_s": 0.0, "workers": {}, "capacity": None})
    capacity = _capacity(snap, name)
    for w, task, m in _tasks(snap, name):
        c = per[m["component"]]
        if task in capacity:         # a component is as busy as its busiest task
            c["capacity"] = max(c["capacity"] or 0.0, capacity[task])
        c["tasks"] += 1
        for k in ("executed", "emitted", "acked", "failed"):
            c[k] += m.get(k, 0)
        c["execute_s"] += m.get("execute_s_total", 0.0)
        c["execute_p99_s"] = max(c["execute_p99_s"], m.get("execute_ms_p99", 0.0) / 1e3)
        c["workers"][str(task)] = w
    components = {}
    for cid, c in per.items():
        components[cid] = {**{k: c[k] for k in ("tasks", "executed", "emitted", "acked", "failed", "execute_p99_s",
                                                "workers", "capacity")},
                           "execute_avg_s": c["execute_s"] / c["executed"] if c["executed"] else 0.0}
    return {"name": name, "status": t.get("status"), "failures": failures(t.get("results") or {}),
            "graph": graph(spec), "components": components,
            "task_workers": {str(k): v for k, v in assignment.get("tasks", {}).items()},
            "workers": sorted(snap.workers)}


def is_training(snap: Snapshot, name: str) -> bool:
    """A topology whose tasks report training figures, or that published training progress."""
    results = snap.topologies[name].get("results", {})
    return PROGRESS in results or EVAL_HISTORY in results or any(
        key[0].startswith("training_") for _w, _t, m in _tasks(snap, name) for key in figures(m))


def training_view(snap: Snapshot, name: str) -> dict:
    t = snap.topologies[name]
    results = t.get("results", {})
    history = results.get(EVAL_HISTORY) or []
    accuracy = sorted([h["epoch"], h["test_accuracy"]] for h in history)
    run: dict[str, float] = {}
    units: dict[str, dict] = {}
    for w, _task, m in _tasks(snap, name):
        for key, v in figures(m).items():
            fname, labels = key[0], dict(key[1:])
            if "unit" in labels:
                u = units.setdefault(labels["unit"], {"unit": int(labels["unit"]), "worker": None, "compute_s": 0.0,
                                                      "round_trip_s": 0.0, "barrier_s": 0.0})
                if fname == "training_compute_seconds_total":
                    u["compute_s"], u["worker"] = v, w
                elif fname == "training_round_trip_seconds_total":
                    u["round_trip_s"] = v
                elif fname == "training_barrier_wait_seconds_total":
                    # one per sync task: the most of any slice, as the run's summary takes it
                    # (the last one read, a slice that changed with the workers' order, before)
                    u["barrier_s"] = max(u["barrier_s"], v)
            elif fname in SUMMED:           # one per sync task (each has its slice)
                run[fname] = run.get(fname, 0.0) + v
            else:
                run[fname] = v
    per_unit = []
    for u in sorted(units.values(), key=lambda u: u["unit"]):
        per_unit.append({"unit": u["unit"], "worker": u["worker"], "compute_s": u["compute_s"],
                         "communication_s": max(u["round_trip_s"] - u["barrier_s"], 0.0),
                         "wait_s": u["barrier_s"]})
    progress = results.get(PROGRESS) or {}
    return {"name": name, "status": t.get("status"), "loss": snap.loss_curves.get(name, []), "accuracy": accuracy,
            "epoch": run.get("training_epoch", progress.get("epoch")),
            "samples_per_s": run.get("training_samples_per_second", progress.get("samples_per_s")),
            "sync_rounds": run.get("training_sync_rounds_total", progress.get("rounds")),
            "samples": run.get("training_samples_total", progress.get("samples")),
            "replayed_samples": run.get("training_replayed_samples_total", 0),
            "bytes_moved": run.get("training_sync_received_bytes_total", 0) + run.get("training_sync_sent_bytes_total", 0),
            "recoveries": run.get("training_recoveries_total", 0),
            "per_unit": per_unit, "stragglers": results.get(STRAGGLERS)}


def record_loss(snap: Snapshot, previous: dict[str, list], keep: int = 5000) -> None:
    """Extend each training topology's loss curve with the sync task's latest round
    (the sampler calls this after each pass; curves of topologies gone are dropped)."""
    for name, t in snap.topologies.items():
        curve = list(previous.get(name, []))
        for _w, _task, m in _tasks(snap, name):
            f = figures(m)
            rounds, loss = f.get(("training_sync_rounds_total",)), f.get(("training_loss",))
            finite = isinstance(loss, (int, float)) and math.isfinite(loss)    # a diverged run's is not drawn
            if rounds is not None and finite and (not curve or rounds > curve[-1][0]):
                curve.append([rounds, loss])
        if curve:
            snap.loss_curves[name] = curve[-keep:]
