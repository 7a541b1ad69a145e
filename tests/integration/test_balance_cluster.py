"""Load-aware allocation on a real cluster: worker processes pinned to their own
cores, and a real co-tenant (a CPU-bound process pinned to one worker's core) that
slows that worker to about half speed. The batch shares move toward the faster
worker while it runs and back when it stops, every sample is still counted once,
and the leader's decisions are kept for `status`. The fault tests with balancing
on are here too (SIGKILL of a compute unit's host)."""
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from streamnet.runtime import wait_for
from streamnet.runtime.control.client import request_stop
from streamnet.testing import finish, placement, running_cluster, spout_step, zookeeper_installed
from streamnet.training import DataConfig, lenet5_mixbp
from streamnet.training.nsmap import build_topology
from streamnet.training.summary_from_results import summarise

FASHION = "/usr/share/datasets/fashion-mnist"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not zookeeper_installed(), reason="needs Debian's zookeeper package"),
              pytest.mark.skipif(not os.path.isdir(FASHION), reason="needs dataset-fashion-mnist"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin workers to")]


def _shares(state, name, topo) -> list[float]:
    """The compute units' shares in the current assignment (1.0 each while none is set)."""
    a = state.assignment(name)[0]
    return [a.shares.get(t, 1.0) if a else 1.0 for t in topo.tasks("compute")]


def _rounds(state, name) -> int:
    p = state.results(name).get("sync.0.progress")
    return p["rounds"] if p else 0


QUIET_S = 3.0
LEVEL_S = 10.0      # the level over this long when no quiet window comes (below)
RETURN = 0.6        # after the co-tenant: the share ratio back this part of the way from its low
TARGET_ROUNDS = 10  # issue 13: the shares move within this many rounds of the co-tenant's start
                    # (perf/balance.py on host5: the first change 5-8 rounds after it, 28 pairs)


def _quiet(state, name) -> bool:
    """No load-balancing decision in the last QUIET_S (the leader's clock is this machine's)."""
    return all(time.time() - e["time"] >= QUIET_S for e in state.balance_log(name))


def _still_level(state, name, ratio, seconds: float = 2.0, timeout: float = 90.0) -> float:
    """The share ratio's level over `seconds` in which the leader decided nothing, after
    QUIET_S without a decision: a decision during the sampling (a moment's noise, in one
    `make test` run 7 rounds before the co-tenant) starts it again, since the balancer's
    answer to the co-tenant is then measured from a window that change had just reset.

    A host whose vCPUs swing in speed (CI once: one worker at 7k-19k items/s, a decision
    every 1-4 s for a minute) may never give such a window: after `timeout` the level is
    the median ratio over the last LEVEL_S, every decision included. The checks after it
    stand either way: the co-tenant must still pull the share well below that level."""
    deadline = time.monotonic() + timeout
    seen: list = []                                    # (monotonic time, ratio) while waiting
    while time.monotonic() < deadline:
        if not _quiet(state, name):
            seen.append((time.monotonic(), ratio()))
            time.sleep(0.2)
            continue
        started = time.time()
        samples = _sampled(ratio, seconds)
        seen.extend((time.monotonic(), r) for r in samples)
        if all(e["time"] < started for e in state.balance_log(name)):
            return statistics.median(samples)
    recent = [r for t, r in seen if t >= time.monotonic() - LEVEL_S]
    level = statistics.median(recent)
    print(f"no {QUIET_S + seconds:.0f} s without a balancing decision in {timeout:.0f} s (the host's speed "
          f"swings): the level before the co-tenant is the median share ratio over the last {LEVEL_S:.0f} s, "
          f"{level:.2f}:1 (from {min(recent):.2f} to {max(recent):.2f})")
    return level


def _sampled(f, seconds: float, interval: float = 0.1) -> list:
    """f() every interval for `seconds`: a level over time, not one moment of it."""
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(f())
        time.sleep(interval)
    return out


def _recorded(seen: list, state, name: str, units: list[int], t0: float) -> bool:
    """Append to `seen` each new set of the units' published speeds (a line with the time
    since t0, monotonic) - what the leader decided on. Always True (a wait_for's side line)."""
    line = []
    for w, info in sorted(state.workers().items()):
        rec = info.get("load") or {}
        for t in units:
            spi = rec.get("seconds_per_item", {}).get(name, {}).get(str(t))
            if spi:
                err = rec.get("speed_error", {}).get(name, {}).get(str(t)) or 0.0
                share = rec.get("work_share", {}).get(name, {}).get(str(t))
                line.append(f"unit {t} on {w}: {spi * 1e6:.1f} us, +-{err:.1%}, share {share}")
    text = "; ".join(line)
    if not seen or not seen[-1].endswith(text):
        seen.append(f"{time.monotonic() - t0:5.1f} {text}")
    return True


def _favoured():
    try:                    # as root: the co-tenant outweighs the worker (and any other load) on its core
        os.setpriority(os.PRIO_PROCESS, 0, -5)
    except OSError:
        pass


def _hog(core: int) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"],
                            preexec_fn=_favoured)


def test_shares_follow_a_co_tenant_and_every_sample_counts_once(zk):
    # more epochs than the test can use: it stops the run cleanly once the shares have followed the
    # co-tenant both ways, and checks the epochs that completed. (100 ran out once: the shares moved
    # back and forth for 25 s before they held still long enough to start, and an idle machine
    # trains this set's 6,000 samples 3-4 times a second; the waits below may take 3 minutes.) The
    # cosine schedule over so many epochs holds the rate near its start: at 0.05, two runs of three
    # diverged after 65-80 epochs of these 6,000 samples (test accuracy 10 %); 0.02 does not
    base = lenet5_mixbp()
    cfg = lenet5_mixbp(units=2, epochs=2000, balance="load", data=DataConfig(train_limit=6000, test_limit=500),
                       algorithm=replace(base.algorithm, lr=0.02))
    topo = build_topology(cfg, name="balance-cotenant")
    hog = None
    with running_cluster(zk, workers=2, pin_cores=True) as (c, state):
        try:
            state.submit_topology(topo.name, topo.to_dict())
            where = wait_for(lambda: placement(state, topo.name), 30, "the assignment")
            units = list(topo.tasks("compute"))
            hosts = [where[t] for t in units]
            assert len(set(hosts)) == 2, f"the units share a worker: {where}"
            wait_for(lambda: _rounds(state, topo.name) >= 10, 120, "training to get going", interval=0.2)
            slow = 1                                             # the unit whose worker gets the co-tenant
            core = int(hosts[slow][1:]) % len(os.sched_getaffinity(0))     # Cluster pins w<i> to core i
            ratio = lambda: _shares(state, topo.name, topo)[slow] / _shares(state, topo.name, topo)[1 - slow]  # noqa
            # warm-up noise (a unit's first reports) and other load on the machine may have moved
            # them already: start once no decision came for QUIET_S, from the level they hold over 2 s
            before = _still_level(state, topo.name, ratio)
            hog, t_on = _hog(core), time.monotonic()
            step_on = spout_step(state, topo.name, topo.tasks("data")[0])
            assert step_on is not None, "the data spout's step is not on its worker's /metrics"
            seen: list = []          # the speeds the leader saw, for the message of a late change
            wait_for(lambda: _recorded(seen, state, topo.name, units, t_on) and ratio() < 0.85 * before, 60,
                     "the slowed unit's share to fall", interval=0.1)
            # counted in rounds, exactly: the spout logs the step at which it began cutting with each
            # change of shares (and publishes the log with its other figures, a moment later)
            moved = wait_for(lambda: [e for e in state.results(topo.name).get("data.0.shares") or []
                                      if e["step"] >= step_on], 30, "the spout's log of the change", interval=0.1)
            assert moved[0]["step"] - step_on <= TARGET_ROUNDS, (
                f"the shares first moved {moved[0]['step'] - step_on} rounds after the co-tenant (step {step_on}), "
                f"{moved}\nthe speeds the workers published since (s after the co-tenant: unit -> "
                f"seconds per item, relative error, under share):\n" + "\n".join(seen)
                + "\nthe leader's decisions:\n" + "\n".join(f"{e['time']:.1f} {e['decision']}"
                                                              for e in state.balance_log(topo.name)))
            print(f"co-tenant on {hosts[slow]}: unit shares {before:.2f}:1 -> {_shares(state, topo.name, topo)} after "
                  f"{time.monotonic() - t_on:.1f} s; the first change {moved[0]['step'] - step_on} rounds after it")
            low = ratio()
            hog.kill()
            hog.wait(10)
            hog, t_off, r_off = None, time.monotonic(), _rounds(state, topo.name)
            # back most of the way: to the level before, or to equal shares if that level was itself a
            # lean toward it. Not all the way: the shares then follow the speeds measured without the
            # co-tenant, and the unit beside the data spout measures up to ~17 % slower on this machine,
            # which the policy rightly keeps (a check at 0.85 of the level before failed on that)
            back = low + RETURN * (min(before, 1.0) - low)
            wait_for(lambda: ratio() > back, 60,
                     f"the slowed unit's share to rise again (from {low:.2f}:1 past {back:.2f}:1)", interval=0.1)
            print(f"co-tenant gone: shares {_shares(state, topo.name, topo)} after {time.monotonic() - t_off:.1f} s, "
                  f"{_rounds(state, topo.name) - r_off} rounds")
            log = state.balance_log(topo.name)
            print("\n".join(f"{e['time']:.1f} {e['decision']}" for e in log))
            # (not sooner: a client process starting is itself a co-tenant on a 2-core machine)
            status = c.submit_cli("status", topo.name, timeout=60)
            assert status.returncode == 0, status.stderr
            assert "load balancing: last" in status.stdout and "compute shares task" in status.stdout, status.stdout
            assert "other processes busy" in status.stdout, status.stdout
            request_stop(state, topo.name)
            results = finish(state, topo.name, timeout=600)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait(10)
    assert len(log) >= 2 and all("compute shares" in e["decision"] for e in log)
    s = summarise(cfg, results, workers=2)
    assert s.extra["each_sample_counted_once"] is True
    held = {t["unit"]: t for t in s.extra["stragglers"]["top"]}
    assert held.get(slow, {}).get("reasons", {}).get("compute", 0) >= 1, s.extra["stragglers"]  # before shares moved
    counted = results["sync.0.stats"]["epoch_samples"]
    last = max(map(int, counted))
    assert last >= 2 and all(counted[str(e)] == 6000 for e in range(1, last)), counted   # the last one stopped early
    assert s.test_accuracy >= 0.70


@pytest.mark.parametrize("victim", ["compute", "data"])
def test_balanced_training_survives_sigkill_of_a_units_host(zk, victim):
    """SIGKILL of a unit's host, or of the data spout's (its successor restores a position
    saved up to data_spout.SAVE_EVERY rounds back and sends those rounds again), under
    load balancing: every sample still counted once. That the rounds sent again are cut
    as before when the balancer's shares changed meanwhile is tests/unit/test_data_spout.py's:
    here the shares need not change between the last save and the kill."""
    cfg = lenet5_mixbp(units=2, epochs=3, balance="load", data=DataConfig(train_limit=12000, test_limit=2000))
    topo = build_topology(cfg, name=f"balance-kill-{victim}")
    with running_cluster(zk, workers=3) as (c, state):
        state.submit_topology(topo.name, topo.to_dict())
        where = wait_for(lambda: placement(state, topo.name), 30, "the assignment")
        wait_for(lambda: _rounds(state, topo.name) >= 20, 120, "training to get going", interval=0.2)
        host = where[topo.tasks(victim)[0]]
        c.kill9(host)
        wait_for(lambda: host not in placement(state, topo.name).values(), 30, "the dead worker's tasks to move",
                 interval=0.05)
        results = finish(state, topo.name, timeout=600)
    s = summarise(cfg, results, workers=2)
    assert s.extra["each_sample_counted_once"] is True
    assert results["sync.0.stats"]["epoch_samples"] == {"1": 12000, "2": 12000, "3": 12000}
    assert s.test_accuracy >= 0.80
