"""The data spout: each unit's work, round by round, epoch by epoch.

A round's trees completing is the synchronisation barrier (see sync_bolt.py): the
spout emits round r + 2 only when every tree of round r + 1 is acked, and replays
the work of a unit whose tree failed or timed out. Round r + 1 itself may go out
while round r is in flight (_send_ahead): the units hold it until the parameters of
its step come.

The spout's saved position is where a spout started anew (its worker died) begins
again; exactly-once is the sync bolt's business (it counts each step once and
answers work for a step it already combined as a replay, without computing it).
So the position is saved at most every SAVE_S during an epoch, and always when an
epoch ends, after a checkpoint round and when the run stops, and a new spout re-sends
at most SAVE_S of rounds, which the units answer "applied" at once.

Under load balancing the rounds a new spout re-sends must be cut as its predecessor
cut them - with the shares of the moment, the round that was in flight could reach
the sync bolt in two different cuts - so there the position is saved every
SAVE_EVERY rounds (at the boundaries of the steps it divides) and whenever the shares
change, and a new spout keeps the shares it restored for as many rounds as its
predecessor may have sent past that position. No round waits for a save (a ZooKeeper
write, and a ZooKeeper server's work: on a machine whose cores the workers share with
it, a write every round was about half of its requests), except where the shares
change:

- round s goes out (ahead or not) only once the position of step s - SAVE_EVERY or
  later has landed (the last save has had SAVE_EVERY rounds to);
- a change of shares goes out only once the position saved with it has landed;
- a round sent ahead is cut with the shares of the round in flight, and only while
  the balancer has no others: the boundary it then starts at keeps them, and a change
  waits for the next boundary (one round later than without sending ahead);
- a spout keeps the shares it started with up to step q + SAVE_EVERY, q its first.

So a spout that starts from the last position that landed, step q, knows that the
one before it sent at most round q + SAVE_EVERY, every round from q on cut with the
shares of q (a change after q would have landed first, and a round sent ahead kept
the shares of the one before it): it sends those rounds with them, and only then
takes the balancer's. The saves that must land before the next round (an epoch's
end, a checkpoint round, a stop) are waited for in both modes, and the spout is not
done until its last save has landed.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from ..runtime import FencedError, LogBudget, Spout
from .bp import lr_scale
from .config import run_config_from_dict
from .run_stats import StoppedAt
from .schedule import SharedSchedule, schedule_for
from .streams import WORK, row

log = logging.getLogger(__name__)

SHARE_LOG = 50      # changes of the work shares kept in the published log
SAVE_S = 0.5        # the position is saved at most this often (and at every epoch end)
SAVE_EVERY = 8      # ... and under load balancing every this many rounds, and at every change of shares
RETRY_S = 1.0       # a save that failed is tried again this long after (unless a later one is queued)
clock = time.monotonic      # the spout's clock for SAVE_S and RETRY_S (a test sets its own)


class DataSpout(Spout):
    """Emits each unit's work, round by round, epoch by epoch.

    A round flagged `checkpoint` (an epoch's last round when the topology writes
    checkpoints, and the round that ends a drain) goes to every unit, so that each
    hands over its state with its contribution and the sync bolt can write a
    checkpoint that resumes exactly. A drain (`streamnet-submit kill --checkpoint`,
    SIGTERM to a worker) ends the run after its next checkpoint round.
    """
    outputs = list(WORK)
    # it emits only once a tree is acked or failed or a save of its position landed, each
    # of which wakes it (a drain is seen within the executor's longest idle wait)
    polled = False

    def open(self, ctx, collector):
        super().open(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        self.schedule = schedule_for(self.cfg, int(self.config["train_size"]))
        self.balanced = isinstance(self.schedule, SharedSchedule)
        self.shares = [1.0] * self.cfg.units        # the units' work shares for the next round (load balancing)
        self.compute_tasks = ctx.component_tasks("compute")
        self.checkpoints = bool(self.config.get("checkpoints"))
        self.epoch = self.round = self.step = 0
        if self.config.get("resume"):        # a resume point (nsmap.resume_point)
            start = self.config["resume"]
            self.epoch, self.round, self.step = start["epoch"], start["round"], start["step"]
            self.shares = list(start.get("shares") or self.shares)   # the run's last decision, from its checkpoint
        self.plan, self.rounds = self._epoch(min(self.epoch, self.cfg.epochs - 1))
        self.total = self.rounds * self.cfg.epochs          # every epoch has as many rounds
        self.share_log: list[dict] = []             # the last SHARE_LOG changes of shares, published
        self.in_flight: dict[tuple, list] = {}      # (epoch, round, unit) -> work values
        self.flagged = False                        # is the round in flight a checkpoint round?
        self.ahead = False                          # is the next round's work sent already (_send_ahead)?
        self.replay: list[tuple] = []
        self.replayed = 0             # work tuples sent again after a failure
        self._replay_lines = LogBudget()
        self.replayed_samples = 0     # the samples of that work
        self._count_replay(0)
        self.draining = self.stopped = False
        self._saved_at = -float("inf")              # clock() at the last save of the position
        self._saving = None              # (step, state, future) of the save in flight (ctx.save_state_started)
        self._queued = None              # (step, state) to save once that one has landed
        self._landed = self.step         # the step of the last position known saved (where we began: ours)
        self._must_land = False          # the next round waits for the position saved at its boundary
        self._hold_until = self.step + SAVE_EVERY   # boundaries up to this step keep the shares we began with
        self._retry_at = 0.0             # the queued save starts no sooner (a failed one tried again)
        self._fenced: FencedError | None = None     # a save found another instance owns the task

    def restore(self, state):
        self.epoch, self.round, self.step = state["epoch"], state["round"], state["step"]
        self.replayed = state["replayed"]
        self.replayed_samples = state.get("replayed_samples", 0)    # absent in states saved before it was
        self.stopped = state.get("stopped", False)   # absent in states saved before drains existed
        self.shares = list(state.get("shares") or self.shares)
        self._landed = self.step
        self._hold_until = self.step + SAVE_EVERY
        if self.epoch < self.cfg.epochs:
            self.plan, self.rounds = self._epoch(self.epoch)

    def _epoch(self, epoch: int):
        """(per unit its rounds of `epoch`, the round count). Under load balancing the
        rounds are cut when they are emitted, with the shares of the moment: no plan."""
        if self.balanced:
            return None, self.schedule.num_rounds
        return self.schedule.epoch(epoch)

    def drain(self):
        if not self.draining and not self.is_done():
            log.warning("drain requested at epoch %d, round %d: stopping after the next checkpoint round",
                        self.epoch + 1, self.round + 1)
        self.draining = True

    def _emit(self, key, values):
        self.collector.emit(values, msg_id=key, direct_task=self.compute_tasks[key[2]])

    def next_tuple(self):
        self._settle()
        if self._fenced is not None:
            raise self._fenced
        if self.replay:
            key = self.replay.pop()
            self._emit(key, self.in_flight[key])
            return
        if self.in_flight:
            self._send_ahead()
            return  # the barrier: the whole round must complete first
        if self.epoch >= self.cfg.epochs or self.stopped:
            return
        if not (self._landed >= self.step if self._must_land else self._may_go_out(self.step)):
            return  # the position this round depends on is not saved yet (see the module's docstring)
        self._must_land = False
        self.flagged = self.draining or (self.checkpoints and self.round + 1 >= self.rounds)
        self._send_round(self.round, self.step, self.flagged)

    def _may_go_out(self, step: int) -> bool:
        """Whether the round of `step` may go out as far as saved positions go: under load
        balancing once the position of step - SAVE_EVERY or later has landed (the module's
        docstring), with static shares at once."""
        return not self.balanced or self._landed >= step - SAVE_EVERY

    def _work(self, rnd: int, flagged: bool):
        """(unit, batches) of round `rnd` of the current epoch: under load balancing every
        unit's, cut by the spout's shares; else the units' with work in it, and every
        unit's in a `flagged` round (an empty list for one that has none)."""
        if self.balanced:
            return enumerate(self.schedule.round(self.epoch, rnd, self.shares))
        return ((unit, rounds[rnd] if rnd < len(rounds) else [])
                for unit, rounds in enumerate(self.plan) if rnd < len(rounds) or flagged)

    def _send_round(self, rnd: int, step: int, flagged: bool) -> None:
        """Emit round `rnd` (step `step`) of the current epoch: each unit's batches
        (_work), held in flight until its tree is acked."""
        scale = lr_scale(self.cfg.algorithm, step / self.total)
        for unit, mine in self._work(rnd, flagged):
            key = (self.epoch, rnd, unit)
            self.in_flight[key] = row(WORK, unit=unit, epoch=self.epoch, round=rnd, step=step, lr_scale=scale,
                                      batches=[b.astype(np.int32) for b in mine], checkpoint=flagged,
                                      share=self.shares[unit])
            self._emit(key, self.in_flight[key])

    def _send_ahead(self) -> None:
        """Send round r + 1's work while round r is in flight, so that it waits at the
        units (which hold it until the parameters of its step come) instead of leaving
        here only once every tree of round r is acked: a unit holding round r's result
        then starts at once (a 2-worker round spent 0.9-1.7 ms between). Only where
        round r + 1 is cut now as it would be then - not an epoch's last round nor a
        checkpoint round, no drain or stop, nothing to replay, no save the round must
        wait for; under load balancing the position of round r saved (the module's
        docstring) and no new shares from the balancer, so that the boundary keeps
        round r's - and the barrier's meaning is unchanged: round r + 2 still waits for
        every tree of r + 1."""
        if (self.ahead or self.replay or self.draining or self.stopped or self._must_land
                or self.flagged or self.round + 2 >= self.rounds
                or any(k[:2] != (self.epoch, self.round) for k in self.in_flight)):
            return
        if not self._may_go_out(self.step + 1) or (self.balanced and self._new_shares() is not None):
            return
        self._send_round(self.round + 1, self.step + 1, flagged=False)
        self.ahead = True

    def ack(self, key):
        self.in_flight.pop(tuple(key), None)
        while not any(k[:2] == (self.epoch, self.round) for k in self.in_flight):
            if not self._round_done():
                break

    def _round_done(self) -> bool:
        """Every tree of the current round is acked: move on; whether the round now
        current was sent ahead (its trees may all be acked already)."""
        ahead, self.ahead = self.ahead, False
        self.round += 1
        self.step += 1
        self.ctx.figure("training_rounds_total", self.step, counter=True,
                        help="Synchronisation rounds the data spout has seen complete (steps of the run)")
        if self.round >= self.rounds:
            self.epoch, self.round = self.epoch + 1, 0
            if self.epoch < self.cfg.epochs:
                self.plan, self.rounds = self._epoch(self.epoch)
        if self.draining and self.flagged and self.epoch < self.cfg.epochs:
            self.stopped = True
            log.warning("drained: stopped before epoch %d, round %d (step %d)",
                        self.epoch + 1, self.round + 1, self.step)
        changed = self._take_shares(keep=ahead)
        # under load balancing every SAVE_EVERY rounds, else at most every SAVE_S; the next round
        # waits for it at an epoch's start, after a checkpoint round, at a stop and with new shares
        must = self.round == 0 or self.flagged or self.stopped or changed
        if must or (self.step % SAVE_EVERY == 0 if self.balanced else clock() - self._saved_at >= SAVE_S):
            self._save(must)
        return ahead and not self.in_flight and self.epoch < self.cfg.epochs

    def _save(self, must: bool) -> None:
        """Save the position now reached, in the background, after any save in flight."""
        self._queued = (self.step, {"epoch": self.epoch, "round": self.round, "step": self.step,
                                    "replayed": self.replayed, "replayed_samples": self.replayed_samples,
                                    "stopped": self.stopped, "shares": self.shares})
        self._must_land = self._must_land or must
        self._saved_at = clock()
        self._settle()

    def _settle(self) -> None:
        """Take note of a save that has landed and start the one queued behind it. A
        fenced save (another instance took the task over) makes next_tuple raise. A save
        that failed otherwise (the coordinator away) is logged and tried again after
        RETRY_S, unless a later position is queued: under load balancing the round after
        next waits for it, and no round would come to save a later one."""
        if self._saving is not None and self._saving[2].done():
            step, state, done = self._saving
            self._saving = None
            if done.cancelled():
                self._queued = None         # the worker is closing: nothing more is saved
                return
            error = done.exception()
            if error is None:
                self._landed = max(self._landed, step)
            elif isinstance(error, FencedError):
                self._fenced = error
            else:       # e.g. the coordinator away longer than a save waits: the task goes on
                log.warning("could not save the position of step %d (%s: %s); trying again in %.0f s",
                            step, type(error).__name__, error, RETRY_S)
                if self._queued is None:    # a later position queued makes this one moot
                    self._queued, self._retry_at = (step, state), clock() + RETRY_S
        if (self._saving is None and self._queued is not None and self._fenced is None
                and clock() >= self._retry_at):
            step, state = self._queued
            self._queued = None
            self._saving = (step, state, self.ctx.save_state_started(state))
            self._saving[2].add_done_callback(lambda _: self._settle())

    def _new_shares(self) -> list[float] | None:
        """The load balancer's shares where they differ from the spout's, else None."""
        new = self.ctx.work_shares("compute") if self.balanced else None
        return list(new) if new and len(new) == len(self.shares) and new != self.shares else None

    def _take_shares(self, keep: bool) -> bool:
        """At a round boundary, the load balancer's current shares become the next
        round's (saved with the position at once, so a spout started anew cuts that
        round the same way, and units never mix batches of two cuts) - unless `keep`:
        that round went out ahead, cut with the shares it had."""
        if keep or self.step <= self._hold_until:     # see the module's docstring
            return False
        new = self._new_shares()
        if new is None:
            return False
        before, after = self.schedule.batch_sizes(self.shares), self.schedule.batch_sizes(new)
        log.info("batch shares from round %d of epoch %d: %s", self.round + 1, self.epoch + 1, ", ".join(
            f"unit {k} batch {b} -> {a}" for k, (b, a) in enumerate(zip(before, after)) if a != b) or "unchanged")
        self.shares = new
        for k, b in enumerate(after):
            self.ctx.figure("training_unit_batch", b, unit=str(k),
                            help="Samples per local step the data spout gives each unit (load balancing)")
        # when each cut began, by step and wall clock (perf/balance.py counts the rounds it took)
        self.share_log = self.share_log[-(SHARE_LOG - 1):] + [
            {"step": self.step, "epoch": self.epoch, "round": self.round, "time": time.time(), "shares": self.shares}]
        self.ctx.publish("shares", self.share_log)
        return True

    def fail(self, key):
        key = tuple(key)
        if key in self.in_flight:
            self.replayed += 1
            self._count_replay(sum(len(b) for b in dict(zip(WORK, self.in_flight[key]))["batches"]))
            said = self._replay_lines.allow()      # a burst of them after a failure is one cause
            if said is not None:
                log.warning("replaying work of unit %d, epoch %d, round %d%s", key[2], key[0], key[1], said)
            self.replay.append(key)

    def _count_replay(self, samples: int) -> None:
        self.replayed_samples += samples
        self.ctx.figure("training_replayed_samples_total", self.replayed_samples, counter=True,
                        help="Samples whose work the data spout sent again after a failure")

    def is_done(self):
        self._settle()
        return ((self.epoch >= self.cfg.epochs or self.stopped) and not self.in_flight and self._fenced is None
                and self._saving is None and self._queued is None)

    def close(self):
        if self.is_done():
            self.ctx.publish("replayed", self.replayed)
            self.ctx.publish("replayed_samples", self.replayed_samples)
            if self.stopped:
                self.ctx.publish("stopped_at", StoppedAt(epoch=self.epoch, round=self.round, step=self.step).to_dict())
