"""Load-aware allocation: the leader's policy. Pure - the topology, its assignment,
the workers' load records (runtime/load.py) and a small memory in; a decision out -
so it is tested on plain data (tests/unit/test_balance.py) and any leader can take
over with a fresh memory.

For a topology whose config says `balance: load`:

- **work shares**: each task of a component whose tasks all report their speed
  (seconds per work item) gets a share of the component's work proportional to its
  speed, as a weight with mean 1.0, so that all of them finish a round together
  while the total stays the same (the consumer - a training spout - turns weights
  into batches). A speed counts only if it was measured under the task's current
  share (a unit's speed may depend on its batch). Shares change only when one moves by
  more than CHANGE and by more than NOISE times the largest relative error of the
  speeds (a worker measures a speed as a median of its last rounds and reports the
  median's standard error with it: a big change, a co-tenant taking half a core, is
  acted on after a few rounds, a small one only once enough rounds measured it for it
  not to be noise; on a noisy host two equal units otherwise look 10-20 % apart in a
  window of 5 rounds), and a change that turns back (a task whose share last rose now
  falls, or the reverse) not sooner than MIN_INTERVAL_S after the last change. Where
  the policy saw, within SEEN_S, what the speeds are at the shares it would turn back
  to and they would send it here again (a unit measured slower at its larger batch, or
  faster at its smaller one beside a co-tenant), it goes instead to between the two -
  where the line through both crosses share = speed - if that is more than AIM_CHANGE
  away, once while those memories last, and then stays (the shares would otherwise turn
  back and forth each interval). What it saw is
  forgotten when the speeds at the same shares move by more than WORLD_CHANGE: other
  load came or went. Noise does not make it flap; a change that goes on the same way
  (the speeds still settling) is made at once.
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

CHANGE = 0.10          # a share moves only by more than this fraction ...
NOISE = 2.0            # ... and by more than this many times the speeds' largest relative error
MIN_INTERVAL_S = 1.0   # between two changes of a component's shares (or a worker's threads)
SEEN_S = 10.0          # the speeds a component showed at its recent shares are remembered this long ...
WORLD_CHANGE = 0.2     # ... unless a task's relative speed at the same shares moves by more than this
SAME = 0.01            # shares this close are the same shares
AIM_CHANGE = 0.05      # a move to between two shares seen (_between) needs only this
MIN_SHARE = 0.1        # no task's share falls below this (it keeps a little work, and its speed is seen)
THREAD_MARGIN = 0.75   # free cores must differ from the threads by this much before threads change
SLOW = 0.5             # a task this far below its component's median speed is a candidate to move
MOVE_AFTER = 5         # ... after this many passes in a row
MOVE_HOLD_S = 60.0     # and a moved task stays put this long
HISTORY = 20           # decisions kept for status
CONTINUE_S = 2.0       # within this long after a change, one that goes on the same way ...
NOISE_CONTINUE = 1.0   # ... needs a move of only this many times the speeds' error, and is aimed
FIT_SPAN = 0.2         # with a fixed cost per round fitted where 1/share moved by this much or more
MAX_FIXED = 0.5        # (at most this part of a task's time at its share)


@dataclass
class Memory:
    """What the policy remembers between passes (the leader keeps one per topology)."""
    changed_at: dict[str, float] = field(default_factory=dict)     # component or "threads:<w>" -> time
    direction: dict[int, int] = field(default_factory=dict)        # task -> +1/-1: its share's last move
                                                                   # (0 after a move to between)
    # component -> [(time, shares, relative speeds last seen there, those first seen there)]
    seen: dict[str, list] = field(default_factory=dict)
    slow_passes: dict[int, int] = field(default_factory=dict)      # task -> passes in a row slow
    moved_at: dict[int, float] = field(default_factory=dict)       # task -> time it was moved
    history: list[dict] = field(default_factory=list)              # the last HISTORY decisions
    aimed_at: dict[str, float] = field(default_factory=dict)       # component -> its last move to between
    # component -> (time, {task: (share, seconds per item)}): what its last change was decided on
    basis: dict[str, tuple] = field(default_factory=dict)


@dataclass
class Decision:
    shares: dict[int, float] | None = None    # the new shares (all balanced tasks), or None: unchanged
    threads: dict[str, int] | None = None     # workers whose threads change
    moves: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # a change held only by MIN_INTERVAL_S may be taken at this time (the `now` clock): the
    # leader decides again then, not at its next pass or the next record published
    recheck_at: float | None = None

    @property
    def changed(self) -> bool:
        return self.shares is not None or bool(self.threads) or bool(self.moves)


def _load_of(task: int, assignment: Assignment, workers: dict) -> dict:
    """The load record of the worker that hosts `task` ({} where there is none)."""
    return workers.get(assignment.tasks.get(task), {}).get("load") or {}


def _speeds(topology: Topology, name: str, assignment: Assignment, workers: dict) -> dict[str, dict[int, float]]:
    """Per component, task -> items per second, for components whose tasks all report a
    speed measured under their current share."""
    out: dict[str, dict[int, float]] = {}
    for c in topology.components:
        speeds = {}
        for t in topology.tasks(c["id"]):
            rec = _load_of(t, assignment, workers)
            spi = rec.get("seconds_per_item", {}).get(name, {}).get(str(t))
            if not spi or spi <= 0 or not math.isfinite(spi):
                break
            under = rec.get("work_share", {}).get(name, {}).get(str(t))
            if under is not None and abs(under - assignment.shares.get(t, 1.0)) > 1e-6:
                break                     # measured under a share it no longer has: wait for a fresh one
            speeds[t] = 1.0 / spi
        else:
            if len(speeds) > 1:
                out[c["id"]] = speeds
    return out


def _noise(name: str, tasks, assignment: Assignment, workers: dict) -> float:
    """The largest relative standard error of the speeds of `tasks` (0 where a worker
    does not report one)."""
    errors = [_load_of(t, assignment, workers).get("speed_error", {}).get(name, {}).get(str(t)) or 0.0
              for t in tasks]
    return max(errors, default=0.0)


def _gap(a: dict[int, float], b: dict[int, float]) -> float:
    """The largest relative difference between two sets of shares."""
    return max(abs(a[t] - b[t]) / b[t] for t in b)


def _moved(a: dict[int, float], b: dict[int, float]) -> float:
    """How far a set of relative speeds moved: the largest ratio between a task's two
    values, less one - the same for a rise as for a fall (`_gap`, relative to the
    second, counts a slow unit's recovery from 0.66 to 0.92 as 0.28, its slowing from
    0.92 to 0.66 as 0.39)."""
    return max(max(a[t], b[t]) / max(min(a[t], b[t]), 1e-12) for t in b) - 1.0


def _remember(memory: Memory, cid: str, shares: dict[int, float], rel: dict[int, float], now: float) -> list:
    """Note the relative speeds seen at `shares`; forget everything seen when they moved
    at the same shares (other load came or went: what was seen elsewhere is stale too).
    They are compared with the speeds first seen at these shares, not the last: a
    co-tenant that leaves makes the published speeds (medians of a window) climb in
    steps smaller than WORLD_CHANGE, and a comparison with the last pass only would
    let what was seen under the co-tenant hold the shares there for SEEN_S."""
    seen = [e for e in memory.seen.get(cid, []) if now - e[0] < SEEN_S and set(e[1]) == set(shares)]
    same = [e for e in seen if _gap(e[1], shares) < SAME]
    first = same[0][3] if same else dict(rel)
    if _moved(first, rel) > WORLD_CHANGE:
        seen, first = [], dict(rel)
        memory.aimed_at.pop(cid, None)     # a new world: its own move to between
    seen = [e for e in seen if e not in same] + [(now, dict(shares), dict(rel), first)]
    memory.seen[cid] = seen
    return seen


def _sent_back_from(seen: list, current: dict[int, float], target: dict[int, float]) -> tuple | None:
    """What was last seen at (about) the `target` shares - (shares, relative speeds) - if
    those speeds would send the shares back toward `current` rather than keep them at
    target; else None."""
    there = [e for e in seen if _gap(e[1], target) <= CHANGE and _gap(e[1], current) > SAME]
    if not there:
        return None
    again = _normalise(there[-1][2])
    return (there[-1][1], again) if _gap(again, current) < _gap(again, target) else None


def _between(there: tuple, current: dict[int, float], rel: dict[int, float]) -> dict[int, float]:
    """Shares between two that each send the shares toward the other: for each task, where
    the line through (share, relative speed) at both crosses share = speed (regula falsi
    on speed - share), kept between the two shares. A unit's speed may fall as its share
    grows: beside a co-tenant, a unit given less waits at the barrier longer and the
    kernel then gives it the core first (host5: 0.72 of the mean at a share of 0.64, 0.64
    at 0.72); shares set to the speeds then turn back and forth between two points, and
    the balance lies between them."""
    shares_there, rel_there = there
    out = {}
    for t, here in current.items():
        a, b = shares_there[t], here
        fa, fb = rel_there[t] - a, rel[t] - b
        x = a + fa * (b - a) / (fa - fb) if fa != fb else (a + b) / 2
        out[t] = min(max(x, min(a, b)), max(a, b))
    return _normalise(out)


def _normalise(weights: dict[int, float]) -> dict[int, float]:
    floor = {t: max(w, MIN_SHARE) for t, w in weights.items()}
    mean = sum(floor.values()) / len(floor)
    return {t: round(w / mean, 3) for t, w in floor.items()}


def _affine_target(basis: tuple | None, sp: dict[int, float], current: dict[int, float],
                   now: float) -> dict[int, float] | None:
    """Shares that make the tasks finish together if each task's time per round is a
    fixed cost plus a cost per item - fitted from its speeds at its current share and at
    the share before the last change - or None where there is no such pair of
    measurements (no change within CONTINUE_S, or a task's share moved too little to fit).

    A unit's speed per item depends on its share: with work of its own each round (its
    worker's event loop taking the interpreter from its compute thread, batch assembly),
    a unit given less is slower per item, one given more faster. Shares proportional to
    the speeds measured at the old shares then fall short (a co-tenant taking half a
    core: 0.71 where they settle at 0.63), and the rest of the way took seconds, since a
    move that small waits until enough rounds measured it."""
    if not basis or now - basis[0] > CONTINUE_S or set(basis[1]) != set(sp):
        return None
    fixed, per_item = {}, {}
    for t, speed in sp.items():
        n0, spi0 = basis[1][t]
        n1, spi1 = current[t], 1.0 / speed
        span = 1.0 / n1 - 1.0 / n0
        if abs(span) < FIT_SPAN:
            return None
        c = min(max((spi1 - spi0) / span, 0.0), MAX_FIXED * spi1 * n1)   # time per round: b x share + c
        fixed[t], per_item[t] = c, spi1 - c / n1
    rate = sum(1.0 / b for b in per_item.values())
    finish = (len(sp) + sum(fixed[t] / per_item[t] for t in sp)) / rate
    return _normalise({t: max((finish - fixed[t]) / per_item[t], 0.0) for t in sp})


def decide(name: str, topology: Topology, assignment: Assignment, workers: dict, memory: Memory,
           now: float) -> Decision:
    d = Decision()
    if topology.config.get("balance") != "load" or assignment.draining:
        return d
    speeds = _speeds(topology, name, assignment, workers)
    shares = dict(assignment.shares)
    for cid, sp in speeds.items():
        mean = sum(sp.values()) / len(sp)
        rel = {t: s / mean for t, s in sp.items()}
        current = {t: shares.get(t, 1.0) for t in sp}
        seen = _remember(memory, cid, current, rel, now)
        fitted = _affine_target(memory.basis.get(cid), sp, current, now)
        target = fitted if fitted and not _turns(memory, _moves_of(current, fitted)) else _normalise(rel)
        moves = _moves_of(current, target)
        turns = _turns(memory, moves)
        there = _sent_back_from(seen, current, target) if turns else None
        if there:                      # what was seen there sends the shares back here: go between,
            # once while those memories last (a speed with a step at some share and no balance
            # would otherwise be bisected move after move); then stay
            target = _between(there, current, rel) if now - memory.aimed_at.get(cid, -math.inf) >= SEEN_S \
                else current
            moves = _moves_of(current, target)
        since = now - memory.changed_at.get(cid, -math.inf)
        # a change that goes on as the last one went, soon after it: the speeds settling
        # at the shares it made (a co-tenant's effect growing, a unit slower per item at
        # its smaller share), not noise - noise would have to turn the shares back
        noise = (NOISE_CONTINUE if not turns and since < CONTINUE_S else NOISE) * _noise(name, sp, assignment, workers)
        wanted = _gap(target, current) > max(AIM_CHANGE if there else CHANGE, noise)
        if wanted and turns and since < MIN_INTERVAL_S:       # held by the interval alone: decide again then
            d.recheck_at = min(d.recheck_at or math.inf, now + MIN_INTERVAL_S - since)
        elif wanted:
            shares.update(target)
            memory.changed_at[cid] = now
            # a move to between two shares is a bracket: any move after it is a turn
            memory.direction.update({t: 0 if there else m for t, m in moves.items() if m})
            # a fitted change is not fitted on again: a second fit extrapolates the noise of the first
            if there:
                memory.aimed_at[cid] = now
            memory.basis[cid] = None if target is fitted or there else (now, {t: (current[t], 1.0 / sp[t]) for t in sp})
            med = statistics.median(sp.values())
            d.notes.append(f"{cid} shares " + ", ".join(
                f"task {t} ({assignment.tasks.get(t)}) {current[t]:.2f} -> {target[t]:.2f}: "
                f"{sp[t] / med:.2f}x the median speed ({sp[t]:,.0f} items/s)" for t in sorted(sp))
                + (" - to between these shares and " + ", ".join(f"{there[0][t]:.2f}" for t in sorted(sp))
                   + ", whose speeds sent them back here" if there else ""))
        d.moves.update(_moves(cid, sp, assignment, workers, topology, memory, now, d.notes))
    if shares != dict(assignment.shares):
        d.shares = shares
    d.threads = _threads(assignment, workers, memory, now, d.notes) or None
    for note in d.notes:
        memory.history.append({"time": now, "topology": name, "decision": note})
    del memory.history[:-HISTORY]
    return d


def _moves_of(current: dict[int, float], target: dict[int, float]) -> dict[int, int]:
    """Each task's move from `current` to `target` shares: +1 up, -1 down, 0 none."""
    return {t: (target[t] > current[t]) - (target[t] < current[t]) for t in target}


def _turns(memory: Memory, moves: dict[int, int]) -> bool:
    """Whether `moves` turn a task's share back (up after its last move down, or down
    after up)."""
    return any(m and memory.direction.get(t, m) != m for t, m in moves.items())


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
