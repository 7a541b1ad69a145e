"""What a worker measures about its load, for the leader's balancing policy
(control/balance.py).

- per task: seconds per work item, the median over a moving window of what the task
  reports (`Context.report_work`: a training unit reports samples and compute seconds
  each round), the relative standard error of that median, and the work share it was
  measured under: a new share starts a new window (a unit's speed may depend on its
  batch), so the leader never takes a speed measured under one share for the speed
  under another. One round's speed is noisy (a LeNet-5 unit alone on an idle core of
  a 2-core VM: 16-30 % coefficient of variation between rounds, with bursts), so the
  window is long (WINDOW reports), a speed is given once it holds MIN_REPORTS, and
  the leader weighs a difference of speeds against their errors (balance.py). A step
  change (a co-tenant comes or goes) is not averaged away: when the median of the last
  RECENT reports is more than STEP from the window's, the older reports go;
- the host: cores this process may run on, how many of them other processes keep
  busy (CPU time of the cores in our affinity mask minus our own, from /proc/stat
  and the process's CPU clock), steal time where the kernel reports it, the 1-minute
  load average;
- the compute pool's busy fraction.

`LoadMeter.sample()` turns these into one plain record (`record()` again with the
last host figures, when a task reported work); `news()` says whether (and how urgently) a new record
differs enough from the last one published to be worth a coordinator write, and
`due()` bounds the rate of writes (a burst of BURST, then one per MIN_PUBLISH_S), so
that hundreds of workers do not flood ZooKeeper with unchanged numbers while a real
change still reaches the leader within a round or two.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque

WINDOW = 25             # reports per task in the speed window (its median: odd reports are not news)
MIN_REPORTS = 5         # a window gives a speed once it holds this many
RECENT = 7              # the last this many reports ...
STEP = 0.3              # ... whose median is this far from the window's: the speed changed
WARMUP = 2              # a task's first reports are left out (compiling, caches, other tasks starting)
CHANGE = 0.10           # a figure that moved by more than this fraction is news
MIN_PUBLISH_S = 1.0     # on average at most one write per this many seconds ...
BURST = 4               # ... after a burst of this many (a change, and the figures settling)
RESERVE = 2             # writes of the budget that only urgent news may spend (news()): a step, then
                        # the first speed under the share the leader gave for it
HEARTBEAT_S = 30.0      # an unchanged record is still written this often
FOREIGN_STEP = 0.25     # cores busy with other processes: a change by more than this is news
UNSURE = 0.1            # a speed's error above this holds the leader back (balance.NOISE x it > a
                        # share's CHANGE): its halving is urgent news


class SpeedWindow:
    """Seconds per item of one task: the median of its last `window` reports, once
    there are `needs` of them, so that odd reports (a pause, a collection) do not count;
    a step change shows in full after RECENT // 2 + 1 reports (the older reports go).
    The first `skip` reports are left out: a task's first ones hold its warm-up (numba
    compiling, caches filling), not its speed; the first under a new share straddled
    the change."""

    def __init__(self, window: int = WINDOW, share: float = 1.0, skip: int = 1, needs: int = MIN_REPORTS):
        self.reports: deque[float] = deque(maxlen=window)       # seconds per item, one per report
        self.skip = skip
        self.needs = min(needs, window)
        self.share = share        # the work share these reports were measured under
        self.spread_floor = 0.0   # after a step: the relative spread of the reports before it

    def add(self, items: float, seconds: float) -> None:
        # a report of no time is no speed (its median of 0 s an item has no error to
        # give, which stopped the worker's load loop), nor one of infinite or NaN figures
        if not (0 < items < math.inf and 0 < seconds < math.inf):
            return
        if self.skip > 0:
            self.skip -= 1
            return
        self.reports.append(float(seconds) / float(items))
        if len(self.reports) > RECENT:
            recent = list(self.reports)[-RECENT:]
            new, old = statistics.median(recent), statistics.median(self.reports)
            if _moved(new, old, STEP):
                kept = _since_step(recent, new, old)
                before = list(self.reports)[:len(self.reports) - len(kept)]
                if len(before) >= MIN_REPORTS:
                    self.spread_floor = max(self.spread_floor, _spread(before, statistics.median(before)))
                self.reports = deque(kept, maxlen=self.reports.maxlen)
                self.needs = min(self.needs, RECENT // 2 + 1)
            elif len(self.reports) >= WINDOW // 2:
                self.spread_floor = 0.0

    def seconds_per_item(self) -> float | None:
        if len(self.reports) < self.needs:
            return None
        return statistics.median(self.reports)

    def error(self) -> float | None:
        """The median's relative standard error: 1.25 x the reports' spread (1.4826 x
        their median absolute deviation, a standard deviation that bursts do not
        inflate) / its value / sqrt(reports). After a step, until the window holds
        WINDOW // 2 reports again, the spread is at least the one before the step: the
        spread of a few reports is itself noise, and may be small by chance."""
        med = self.seconds_per_item()
        if not med:
            return None
        spread = max(_spread(self.reports, med), self.spread_floor)
        return 1.25 * 1.4826 * spread / len(self.reports) ** 0.5


def _spread(reports, med: float) -> float:
    """The reports' median absolute deviation from `med`, relative to it."""
    return statistics.median(abs(r - med) for r in reports) / med


def _since_step(recent: list[float], new: float, old: float) -> list[float]:
    """The reports of `recent` since a step from level `old` to `new`: the last ones
    nearer (by ratio) to the new level than to the old - so that the speed and its
    error after a step are those of the new level alone, not of a mix of both."""
    kept = []
    for r in reversed(recent):
        if abs(math.log(r / new)) > abs(math.log(r / old)):
            break
        kept.append(r)
    return kept[::-1]


def _cpu_times(cpus: set[int], path: str = "/proc/stat") -> tuple[float, float, float] | None:
    """(busy, steal, total) jiffies summed over `cpus`, or None where /proc/stat is absent."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return None
    busy = steal = total = 0.0
    for line in lines:
        name, *vals = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [float(x) for x in vals] + [0.0] * 8
        user, nice, system, idle, iowait, irq, softirq, st = v[:8]
        busy += user + nice + system + irq + softirq
        steal += st
        total += user + nice + system + idle + iowait + irq + softirq + st
    return busy, steal, total


def cpuset(cpus) -> str:
    """CPU numbers as ranges, the kernel's way: {0, 1, 2, 5} -> "0-2,5"."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


class HostSampler:
    """Cores busy with other processes' work, between two calls of `sample()`."""

    def __init__(self):
        self.cpus = (set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else set(range(os.cpu_count() or 1)))
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()

    def _read(self):
        t = os.times()
        return time.monotonic(), t.user + t.system, _cpu_times(self.cpus)

    def sample(self) -> dict:
        now = self._read()
        (t0, own0, cpu0), (t1, own1, cpu1) = self._last, now
        self._last = now
        wall = max(t1 - t0, 1e-6)
        own = (own1 - own0) / wall                 # cores this process kept busy
        out = {"cores": len(self.cpus), "cpuset": cpuset(self.cpus), "own_busy": round(own, 3)}
        if cpu0 and cpu1 and cpu1[2] > cpu0[2]:
            span = cpu1[2] - cpu0[2]
            busy = (cpu1[0] - cpu0[0]) / span * len(self.cpus)
            out["foreign_busy"] = round(max(0.0, busy - own), 3)
            out["steal"] = round((cpu1[1] - cpu0[1]) / span, 4)
        try:
            out["loadavg"] = os.getloadavg()[0]
        except OSError:
            pass
        return out


class LoadMeter:
    """One worker's measurements (the worker owns one; tasks report into it)."""

    def __init__(self, host: HostSampler | None = None):
        self.host = host or HostSampler()
        self.tasks: dict[tuple[str, int], SpeedWindow] = {}     # (topology, task) -> window
        self.published: dict | None = None
        self.published_at = 0.0
        self.tokens, self.refilled_at = float(BURST), None     # the write budget (due())
        self.host_rec: dict = {}          # the last host sample

    def report_work(self, topology: str, task: int, items: float, seconds: float, share: float = 1.0) -> None:
        """A task's report, done under work `share`. A new share starts a new window
        whose first report (the round that straddled the change) is left out, as a new
        task's first WARMUP are."""
        w = self.tasks.get((topology, task))
        if w is None or w.share != share:
            w = self.tasks[(topology, task)] = SpeedWindow(share=share, skip=WARMUP if w is None else 1)
        w.add(items, seconds)

    def forget(self, topology: str, task: int | None = None) -> None:
        """A task moved away (or the topology ended): its speed is no longer ours to report."""
        for key in [k for k in self.tasks if k[0] == topology and (task is None or k[1] == task)]:
            del self.tasks[key]

    def sample(self, busy_fraction: float, threads: int, threads_auto: bool) -> dict:
        """A new host sample, and the record with it."""
        self.host_rec = self.host.sample()
        return self.record(busy_fraction, threads, threads_auto)

    def record(self, busy_fraction: float, threads: int, threads_auto: bool) -> dict:
        """The record from the last host sample and the tasks' current speeds."""
        rec = dict(self.host_rec)
        rec.update(busy=round(busy_fraction, 3), threads=threads, threads_auto=threads_auto)
        speeds: dict[str, dict[str, float]] = {}
        shares: dict[str, dict[str, float]] = {}
        errors: dict[str, dict[str, float]] = {}
        for (topology, task), w in sorted(self.tasks.items()):
            spi = w.seconds_per_item()
            if spi is not None:
                speeds.setdefault(topology, {})[str(task)] = spi
                shares.setdefault(topology, {})[str(task)] = w.share
                errors.setdefault(topology, {})[str(task)] = round(w.error(), 4)
        rec["seconds_per_item"] = speeds
        rec["work_share"] = shares        # the share each speed was measured under
        rec["speed_error"] = errors       # each speed's relative standard error
        return rec

    def due(self, rec: dict, now: float) -> bool:
        """Whether `rec` is worth writing now (and, if so, remember it as written): it
        moved (or the heartbeat is due) and the write budget allows one more. Ordinary
        news (a speed settling, an error shrinking) leaves RESERVE writes in the budget
        for urgent news (a step in a speed, a first speed under a new share), which
        otherwise - on a noisy host ordinary news spends the budget as fast as it
        refills - would wait up to MIN_PUBLISH_S, tens of rounds, to reach the leader."""
        if self.refilled_at is not None:
            self.tokens = min(float(BURST), self.tokens + (now - self.refilled_at) / MIN_PUBLISH_S)
        self.refilled_at = now
        if self.tokens < 1.0:
            return False
        level = URGENT if self.published is None else news(self.published, rec)
        if level == NONE and now - self.published_at < HEARTBEAT_S:
            return False
        if level < URGENT and self.tokens < 1.0 + RESERVE:
            return False
        self.tokens -= 1.0
        self.published, self.published_at = rec, now
        return True


def _moved(a: float, b: float, frac: float) -> bool:
    return abs(a - b) > frac * max(abs(a), abs(b))


NONE, ORDINARY, URGENT = 0, 1, 2     # how much a new record is news (news())


def news(old: dict, new: dict, frac: float = CHANGE) -> int:
    """How much `new` is news against `old`: URGENT where the threads or cores changed,
    a speed moved by more than STEP (a co-tenant came or went), is the first under
    a new share (the leader waits for it to go on balancing) or its error halved from
    above UNSURE (the first reports after a step may be too spread for the leader to
    act on: it waits for the next record); ORDINARY where a speed
    moved by more than `frac` or its error halved (the leader may now act on less),
    or the cores other processes keep busy moved by more than FOREIGN_STEP (idle
    noise is not news); else NONE. A speed that is gone (a task measured afresh under
    a new share, not yet warm) is not news: the next one is."""
    if old.get("threads") != new.get("threads") or old.get("cores") != new.get("cores"):
        return URGENT
    level = ORDINARY if abs(old.get("foreign_busy", 0.0) - new.get("foreign_busy", 0.0)) > FOREIGN_STEP else NONE
    a, b = old.get("seconds_per_item", {}), new.get("seconds_per_item", {})
    sa, sb = old.get("work_share", {}), new.get("work_share", {})
    ea, eb = old.get("speed_error", {}), new.get("speed_error", {})
    for topology, speeds in b.items():
        for t, s in speeds.items():
            if (t not in a.get(topology, {}) or _moved(a[topology][t], s, STEP)
                    or sa.get(topology, {}).get(t) != sb.get(topology, {}).get(t)):
                return URGENT
            old_error = ea.get(topology, {}).get(t)
            sharper = _sharper(old_error, eb.get(topology, {}).get(t))
            if sharper and old_error > UNSURE:
                return URGENT
            if sharper or _moved(a[topology][t], s, frac):
                level = ORDINARY
    return level


def _sharper(old: float | None, new: float | None) -> bool:
    """Whether a speed's error halved since it was published (the leader may now act
    on a smaller difference: balance.py)."""
    return old is not None and new is not None and new < old / 2
