"""Load-aware allocation: the leader's policy. Pure - the topology, its assignment,
the workers' load records (runtime/load.py) and a small memory in; a decision out -
so it is tested on plain data (tests/unit/test_balance.py) and any leader can take
over with a fresh memory.

For a topology whose config says `balance: load`:

- **work shares**: each task of a component whose tasks all report their speed
  (seconds per work item) gets a share of the component's work proportional to its
  speed, as a weight with mean 1.0, so that all of them finish a round together
  while the total stays the same (the consumer - a training spout - turns weights
  into batch sizes). Shares change only when one moves by more than CHANGE, and a
  change that turns back (a task whose share last rose now falls, or the reverse) not
  sooner than MIN_INTERVAL_S after the last change, doubled for every turn of the last
  TURN_MEMORY_S (at most MAX_HOLD_S): noise does not make it flap, nor does a speed
  that depends on the share itself (a unit measured slower at a larger batch, which
  would turn the shares back and forth each interval), while a change that goes on the
  same way (the speeds still settling) is made at once.
- **threads**: a worker started with `--threads auto` gets as many compute threads as
  its host has cores not kept busy by other processes, divided among the workers that
  share those cores (at least 1, never more than the cores it may run on), with a
  margin so that a fraction of a core does not flap.
- **moves**: a task that stays slower than SLOW x its component's median for
  MOVE_AFTER passes moves to a worker with a free core and room under its fair share
  of tasks; one move per task per MOVE_HOLD_S.

Every change comes with a note that gives its numbers.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..assignment import Assignment
from ..topology import Topology

CHANGE = 0.15          # a share moves only by more than this fraction
MIN_INTERVAL_S = 1.0   # between two changes of a component's shares (or a worker's threads)
MAX_HOLD_S = 16.0      # the longest a turn of the shares waits (MIN_INTERVAL_S doubled per recent turn)
TURN_MEMORY_S = 120.0  # turns this recent lengthen the wait of the next one
MIN_SHARE = 0.1        # no task's share falls below this (it keeps a little work, and its speed is seen)
THREAD_MARGIN = 0.75   # free cores must differ from the threads by this much before threads change
SLOW = 0.5             # a task this far below its component's median speed is a candidate to move
MOVE_AFTER = 5         # ... after this many passes in a row
MOVE_HOLD_S = 60.0     # and a moved task stays put this long
HISTORY = 20           # decisions kept for status


@dataclass
class Memory:
    """What the policy remembers between passes (the leader keeps one per topology)."""
    changed_at: dict[str, float] = field(default_factory=dict)     # component or "threads:<w>" -> time
    direction: dict[int, int] = field(default_factory=dict)        # task -> +1/-1: its share's last move
    turns: dict[str, list[float]] = field(default_factory=dict)     # component -> times its shares turned back
    slow_passes: dict[int, int] = field(default_factory=dict)      # task -> passes in a row slow
    moved_at: dict[int, float] = field(default_factory=dict)       # task -> time it was moved
    history: list[dict] = field(default_factory=list)              # the last HISTORY decisions


@dataclass
class Decision:
    shares: dict[int, float] | None = None    # the new shares (all balanced tasks), or None: unchanged
    threads: dict[str, int] | None = None     # workers whose threads change
    moves: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.shares is not None or bool(self.threads) or bool(self.moves)


def _speeds(topology: Topology, name: str, assignment: Assignment, workers: dict) -> dict[str, dict[int, float]]:
    """Per component, task -> items per second, for components whose tasks all report."""
    out: dict[str, dict[int, float]] = {}
    for c in topology.components:
        speeds = {}
        for t in topology.tasks(c["id"]):
            rec = workers.get(assignment.tasks.get(t), {}).get("load") or {}
            spi = rec.get("seconds_per_item", {}).get(name, {}).get(str(t))
            if not spi or spi <= 0 or not math.isfinite(spi):
                break
            speeds[t] = 1.0 / spi
        else:
            if len(speeds) > 1:
                out[c["id"]] = speeds
    return out


def _normalise(weights: dict[int, float]) -> dict[int, float]:
    floor = {t: max(w, MIN_SHARE) for t, w in weights.items()}
    mean = sum(floor.values()) / len(floor)
    return {t: round(w / mean, 3) for t, w in floor.items()}


def decide(name: str, topology: Topology, assignment: Assignment, workers: dict, memory: Memory,
           now: float) -> Decision:
    d = Decision()
    if topology.config.get("balance") != "load" or assignment.draining:
        return d
    speeds = _speeds(topology, name, assignment, workers)
    shares = dict(assignment.shares)
    for cid, sp in speeds.items():
        mean = sum(sp.values()) / len(sp)
        target = _normalise({t: s / mean for t, s in sp.items()})
        current = {t: shares.get(t, 1.0) for t in sp}
        worst = max(abs(target[t] - current[t]) / current[t] for t in sp)
        moves = {t: (target[t] > current[t]) - (target[t] < current[t]) for t in sp}
        turns = any(m and memory.direction.get(t, m) != m for t, m in moves.items())
        recent = [at for at in memory.turns.get(cid, []) if now - at < TURN_MEMORY_S]
        hold = min(MAX_HOLD_S, MIN_INTERVAL_S * 2 ** len(recent))
        if worst > CHANGE and (not turns or now - memory.changed_at.get(cid, -math.inf) >= hold):
            shares.update(target)
            memory.changed_at[cid] = now
            memory.turns[cid] = recent + [now] if turns else recent
            memory.direction.update({t: m for t, m in moves.items() if m})
            med = statistics.median(sp.values())
            d.notes.append(f"{cid} shares " + ", ".join(
                f"task {t} ({assignment.tasks.get(t)}) {current[t]:.2f} -> {target[t]:.2f}: "
                f"{sp[t] / med:.2f}x the median speed ({sp[t]:,.0f} items/s)" for t in sorted(sp)))
        d.moves.update(_moves(cid, sp, assignment, workers, topology, memory, now, d.notes))
    if shares != dict(assignment.shares):
        d.shares = shares
    d.threads = _threads(assignment, workers, memory, now, d.notes) or None
    for note in d.notes:
        memory.history.append({"time": now, "topology": name, "decision": note})
    del memory.history[:-HISTORY]
    return d


def _threads(assignment: Assignment, workers: dict, memory: Memory, now: float, notes: list) -> dict[str, int]:
    """Threads of `--threads auto` workers: the free cores of their host, divided among the
    workers that share those cores (same host, same CPU set: several workers on one
    machine, or the embedded cluster's workers in one process)."""
    def cores_of(w: str):
        info = workers.get(w, {})
        key = (info.get("host"), (info.get("load") or {}).get("cpuset"))
        return key if None not in key else w          # unknown: not shared
    sharing: dict = {}
    for w in workers:
        sharing[cores_of(w)] = sharing.get(cores_of(w), 0) + 1
    out = {}
    for w in sorted(assignment.workers):
        info = workers.get(w, {})
        rec = info.get("load") or {}
        if not rec.get("threads_auto") or "foreign_busy" not in rec:
            continue
        cores = int(rec.get("cores", 1))
        current = int(assignment.threads.get(w, rec.get("threads", cores)))
        free = (cores - rec["foreign_busy"]) / sharing[cores_of(w)]
        want = max(1, min(cores, round(free)))
        key = f"threads:{w}"
        if want != current and abs(free - current) >= THREAD_MARGIN \
                and now - memory.changed_at.get(key, -math.inf) >= MIN_INTERVAL_S:
            out[w] = want
            memory.changed_at[key] = now
            notes.append(f"worker {w} compute threads {current} -> {want}: {rec['foreign_busy']:.2f} of its "
                         f"{cores} cores busy with other processes")
    return out


def _moves(cid: str, speeds: dict[int, float], assignment: Assignment, workers: dict, topology: Topology,
           memory: Memory, now: float, notes: list) -> dict[int, str]:
    med = statistics.median(speeds.values())
    out: dict[int, str] = {}
    for t, s in sorted(speeds.items()):
        memory.slow_passes[t] = memory.slow_passes.get(t, 0) + 1 if s < SLOW * med else 0
        if memory.slow_passes[t] < MOVE_AFTER or now - memory.moved_at.get(t, -math.inf) < MOVE_HOLD_S:
            continue
        src = assignment.tasks.get(t)
        target = _room(src, assignment, workers, topology, out)
        if target is None:
            continue
        out[t] = target
        memory.moved_at[t], memory.slow_passes[t] = now, 0
        notes.append(f"{cid} task {t} moves {src} -> {target}: {s / med:.2f}x the median speed for "
                     f"{MOVE_AFTER} passes, and {target} has a free core")
    return out


def _room(src: str | None, assignment: Assignment, workers: dict, topology: Topology,
          planned: dict[int, str]) -> str | None:
    """The worker with the most free cores (at least one) that can take one more task
    within its fair share (placement.assign's rule), or None."""
    total_threads = sum(max(1, int(i.get("threads", 1))) for i in workers.values()) or 1
    count: dict[str, int] = {}
    for t, w in {**assignment.tasks, **planned}.items():
        count[w] = count.get(w, 0) + 1
    best, best_free = None, 1.0
    for w, info in sorted(workers.items()):
        rec = info.get("load") or {}
        if w == src or "foreign_busy" not in rec:
            continue
        free = rec.get("cores", 1) - rec["foreign_busy"] - rec.get("own_busy", 0.0)
        fair = math.ceil(topology.num_tasks * max(1, int(info.get("threads", 1))) / total_threads)
        if free >= best_free and count.get(w, 0) + 1 <= fair:
            best, best_free = w, free
    return best
