"""The sync bolt: receives the units' contributions and combines each round once.

The bolt has a parallelism S: sync task s owns slice s of the flat parameter
vector (slices.py) and does all of the below for that slice alone, with its own
counters, ledger and recovery; S = 1 is the whole vector. One round, for every
unit k with work in it:

    data --work(k, epoch, round, batches)--> compute[k]          (direct; root of k's tree)
    compute[k] --contribution(k, slice s of its vector)--> sync[s], for each s   (direct; anchored to the work)
    sync[s], once every expected unit of the round has reported:
        combine (weighted, in unit order) and one outer step, on slice s
        --params(slice s)--> every compute task (all), at the end of an epoch the run
        evaluates (RunConfig.evaluates) --> eval, and at a checkpoint round --> checkpoint,
        which gather the S slices (anchored to all of the round's contributions), then ack them
    compute[j] sets the slice, acks.

So unit k's tree completes only when every replica holds every slice of the new
parameters (and, at an evaluated epoch's end, the evaluation is done; an epoch that
is not evaluated sends nothing to eval, so nothing waits for it); the data spout starts
round r + 2 only once every tree of round r + 1 is complete, which makes the tree
completion the synchronisation barrier (round r + 1 may go out ahead, held by the
units until its parameters come: data_spout._send_ahead; max_spout_pending is twice
the number of units).
A lost tuple fails the tree and the spout replays the unit's work; the sync bolt
counts each (epoch, round, unit) once (SyncState, SampleLedger) and answers a replay
of a round it already combined by sending the current parameters again
(sync_recovery.py, with the rest of what a failure asks of it).
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..runtime import Bolt, ConnectionLostError, CoordinatorError, FencedError, SessionClosedError
from .bp import Aggregator, Contribution, TrainingDiverged, plan_for, trained_loss
from .config import run_config_from_dict
from .epoch_clock import LossMeter, progress_record
from .run_stats import SyncStats
from .schedule import EpochPlans, check_training_data, dataset_for, make_model, schedule_for
from .slices import bounds
from .streams import APPLIED, CHECKPOINT, DIRECT_PARAMS, EVAL, PARAMS, STATE_REQUEST, row
from ..runtime.values import real, whole
from .sync_recovery import SyncRecovery, vector_problem
from .stragglers import Arrival, Stragglers
from .sync_state import SyncState

log = logging.getLogger(__name__)

# A round's combine of at most this many floats (all contributions together) runs on the
# event loop: LeNet-5's 2 x 61,706 took 0.3 ms there (108 us with its data in cache),
# where handing it to the compute pool and back took 0.5-0.6 ms of the round's path
# (the pool's thread waits for the loop to sleep before it runs: cpu_policy.py). Larger
# ones (AlexNet-64's 7.7 M floats a unit) go to the pool and leave the loop free.
INLINE_COMBINE_FLOATS = 1 << 18
AHEAD_YIELDS = 16       # passes of the event loop before a save ahead starts (see SyncBolt._save_later)


def _figures_problem(tup) -> str | None:
    """Why a contribution's figures cannot be counted or combined, or None: its epoch,
    round, step, samples and local steps must be counts (a negative or NaN sample count
    became a weight of the average: NaN or skewed parameters for every unit), and its
    learning-rate scale a finite number >= 0."""
    for f in ("epoch", "round", "step", "samples", "steps"):
        if not (whole(tup[f]) and tup[f] >= 0):
            return f"{f} {tup[f]!r} is not a count"
    scale, loss = tup["lr_scale"], tup["loss_sum"]
    if not (real(scale) and 0 <= scale < float("inf")):
        return f"lr_scale {scale!r} is not a finite number >= 0"
    if not real(loss):
        return f"loss_sum {loss!r} is not a number"
    return None


class SyncBolt(SyncRecovery, Bolt):
    """The parameter aggregator.

    It combines each step once (`counts.next_step` is the step its parameters start).
    A sync bolt that starts anew (its worker died) holds no parameters: it asks every
    replica for theirs and continues from the newest - the compute units' replicas
    are the parameters' backup - with the outer momentum reset (logged).
    """
    outputs = {"params": list(PARAMS), "direct_params": list(DIRECT_PARAMS), "state_request": list(STATE_REQUEST),
               "eval": list(EVAL), "checkpoint": list(CHECKPOINT)}
    tick_interval_s = 1.0
    PUBLISH_S = 0.5      # progress records at most this often
    # the figures for /status and /metrics at most this often, and at each epoch's end: 26 of
    # them were 0.1 ms of the event loop a round (10 % of it at MixBP H=1)
    REPORT_S = 0.2
    # The counters are saved when a round makes the step a multiple of SAVE_EVERY - and
    # at once for a round the epoch plan does not predict, an epoch's last round, a
    # checkpoint round and an instance's first round (_must_save) - so the rounds a
    # successor does not find saved are the plan's, and it counts them from the plan
    # (sync_recovery `_recount`). One ZooKeeper write a round was the engine's largest
    # cost besides compute (README, issue 12)
    SAVE_EVERY = 32
    CONFIRM_RETRY_S = 1.0    # between tries of a save that must confirm the task is this instance's (_save)

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        ds = dataset_for(self.cfg)
        check_training_data(self.config.get("data"), ds)
        self.train_size = len(ds.train)
        params = make_model(self.cfg, ds.num_classes).params
        self.num_params = params.size
        self.slices = len(ctx.component_tasks("sync"))
        self.slice = ctx.task_index
        self.lo, self.hi = bounds(params.size, self.slices)[self.slice]
        self.agg = Aggregator(params[self.lo:self.hi], plan_for(self.cfg.algorithm))
        self.plans = EpochPlans(schedule_for(self.cfg, self.train_size))
        self.compute_tasks = ctx.component_tasks("compute")
        self.counts = SyncState(units=len(self.compute_tasks))
        self.pending: dict[tuple[int, int], dict[int, object]] = {}   # (epoch, round) -> unit -> contribution
        self.loss = LossMeter()
        self.bytes_in = self.bytes_out = 0
        self.barrier_s = dict.fromkeys(range(len(self.compute_tasks)), 0.0)   # unit -> s waited for the round
        self.arrived: dict[int, float] = {}
        # seconds combined rounds then waited for the coordinator to confirm the save (the
        # fencing check): the part of every unit's round trip that is ZooKeeper's
        self.save_wait_s = 0.0
        # which unit held each round, and why (stragglers.py): judged by slice 0's task alone
        self.stragglers = Stragglers() if self.slice == 0 else None
        self.round_started: float | None = None     # when this task sent the last round's parameters
        # wall clock (time.time()) of this task's last combine: the run's start,
        # counts.started, is a wall clock saved with the counters, so a successor's account
        # spans the run (as its samples do), not its own life
        self.combined_at: float | None = None
        self._published = self._reported = 0.0
        self._ahead: tuple | None = None     # (the round it counts, the save) of _save_ahead, in flight or done
        self._fenced: FencedError | None = None   # an ahead save found another instance owns the task
        self._saves = 0     # counter saves this instance started (its first round saves: _must_save)
        self.diverged: str | None = None   # why the run diverged (TrainingDiverged), once it has
        self.prepare_recovery()
        if self.config.get("resume") and not ctx.restarting:
            # a task started again (its worker died) continues from the coordinator and the
            # replicas (restore): the checkpoint, removed or changed since, is not read again
            self.resume(self.config["resume"])

    async def execute(self, tup):
        self._check_fenced()
        if tup.stream == "replica":
            await self._replica(tup)
        elif tup.stream == "resync":
            await self._resync(tup)
        else:
            await self._contribution(tup)

    async def tick(self):
        self._check_fenced()
        await super().tick()

    async def _contribution(self, tup):
        if self.diverged is not None:
            return      # neither combined nor failed (a replay would come at once): the run is being killed
        problem = _figures_problem(tup)
        if problem:      # before anything reads them: a step or round that is not a count, a weight that is not one
            log.warning("sync bolt refuses a contribution from unit %r: %s", tup["unit"], problem)
            self.agg.refused.append((tup["unit"], problem))
            self.collector.fail(tup)
            return
        self._maybe_new(tup)
        key = (tup["epoch"], tup["round"])
        unit = tup["unit"]
        if self.adoption is None and self._ahead_of_adopted(tup) and not self._refusal(tup):
            log.warning("sync task of slice %d: unit %d's %s for step %d says it holds parameters this task never "
                        "combined (its replica did not answer when it adopted): asking the replicas again",
                        self.slice, unit, "answer" if tup["status"] == APPLIED else "contribution", tup["step"])
            self._request_replicas()     # the tuple waits among the pending (_adopt)
        if self.adoption is None and (tup["status"] == APPLIED or tup["step"] < self.counts.next_step):
            if self._resends(tup):
                await self._confirm_owned()
            self._answer_replay(tup)
            return
        problem = self._refusal(tup)
        if problem:
            # fail it rather than ack: the spout replays the unit's work, so no sample is lost
            log.warning("sync bolt refuses the contribution of unit %s to step %s: %s", unit, tup["step"], problem)
            self.agg.refused.append((unit, problem))
            self.collector.fail(tup)
            return
        slot = self.pending.setdefault(key, {})
        if unit in slot:
            self.counts.duplicates += 1
            self.collector.ack(slot[unit])  # the newer copy replaces the older; its tree is the one left
        slot[unit] = tup
        self.arrived[unit] = time.perf_counter()
        self.bytes_in += tup["vector"].nbytes
        if self.adoption is None:
            await self._maybe_combine(key)

    def _refusal(self, tup) -> str | None:
        """Why a contribution cannot be combined, or None. Finiteness is left to the
        aggregator, which drops a diverged unit from the round without failing it."""
        unit = tup["unit"]
        if not (whole(unit) and 0 <= unit < len(self.compute_tasks)):
            return f"no unit {unit!r} among {len(self.compute_tasks)}"
        if tup["slice"] != self.slice:
            return f"slice {tup['slice']!r} sent to the sync task of slice {self.slice}"
        if tup["status"] == APPLIED:
            return None          # a replay's answer carries an empty vector
        return vector_problem(tup["vector"], self.agg.params.size, finite=False)

    async def _maybe_combine(self, key):
        slot = self.pending.get(key, {})
        flagged = any(t["checkpoint"] for t in slot.values())
        if not slot or set(slot) < self.plans.expected(*key, flagged):
            return
        tuples = [slot[u] for u in sorted(slot)]
        if any(t["status"] == APPLIED or t["step"] != self.counts.next_step for t in tuples):
            del self.pending[key]
            for t in tuples:            # stale after a recovery: answer like replays
                self._answer_replay(t)
            return
        contributions = [Contribution(t["unit"], t["samples"], t["steps"], t["loss_sum"], t["vector"], t["finite"])
                         for t in tuples]
        done = time.perf_counter()
        for u in slot:
            self.barrier_s[u] += done - self.arrived[u]
        if self.stragglers is not None:
            self.stragglers.judge(self.round_started, [a for a in map(self._arrival, tuples) if a is not None])
        step, (epoch, rnd) = tuples[0]["step"], key
        # Count the round, and - every SAVE_EVERY rounds, and for any round a successor
        # could not count from the plan (_must_save) - save the counters (the save is also
        # the fencing check: a superseded task's fails) while the round is combined (a large
        # combine on the compute pool, the event loop free meanwhile; a small one on the loop:
        # INLINE_COMBINE_FLOATS), unless they were saved ahead as the round
        # was computed (a round as planned: _save_ahead). Nothing of the round leaves before
        # both are done: what a bolt emits waits in its executor until execute returns.
        worked = self.plans.worked(epoch, rnd, [t["unit"] for t in tuples])
        samples = sum(c.samples for c in contributions)
        self.counts.count_round(self.plans, step, epoch, rnd, samples, worked)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not flagged and ahead[0] == (step, epoch, rnd, samples, worked):
            saving = ahead[1]       # saved as this round's count while the units computed it
        elif ahead is not None or self._must_save(step, epoch, rnd, samples, worked, flagged):
            # an evaluation or a checkpoint leaves only once a save confirms the task is still ours
            saving = await self._start_save_after(ahead, confirm=flagged or self._evaluated_end(epoch, rnd))
        else:
            saving = None           # a round as planned between saves: a successor counts it from the plan
        try:
            if sum(c.vector.size for c in contributions) <= INLINE_COMBINE_FLOATS:
                params = self.agg.combine(contributions, tuples[0]["lr_scale"], step)
            else:
                params = await self.ctx.compute(self.agg.combine, contributions, tuples[0]["lr_scale"], step)
        except TrainingDiverged as e:
            if saving is not None:
                await asyncio.wait([saving])
            self.counts.undo_last_round()
            del self.pending[key]
            self.diverged = str(e)
            self.ctx.fail_topology(self.diverged)      # the client kills the run and says why
            return
        except BaseException:
            if saving is not None:
                await asyncio.wait([saving])      # one save at a time; the round is combined again on replay
            self.counts.undo_last_round()
            raise
        combined = time.perf_counter()
        if saving is not None:
            await saving
            self.save_wait_s += time.perf_counter() - combined
        del self.pending[key]
        self.behind_spout = False
        self._combined(key, step, tuples, contributions, params, flagged)
        # the parameters leave, and a unit here starts its round, before this round's
        # figures are written (0.2-0.3 ms of the path when they went first)
        await self.collector.send_now()
        now = time.perf_counter()
        if now - self._reported >= self.REPORT_S or self.plans.epoch_end(epoch, rnd):
            self._report(epoch)
            self._reported = now
        if self.slice == 0 and now - self._published > self.PUBLISH_S:   # every slice counts the same rounds
            self._publish_progress(epoch, rnd)
            self._published = now
        self._save_ahead(epoch, rnd)

    def _must_save(self, step: int, epoch: int, rnd: int, samples: int, worked: list, flagged: bool) -> bool:
        """Whether a round's count is saved before its parameters leave.
        Those of an epoch's end and a checkpoint round are: the evaluation and the
        checkpoint slices carry no fencing token. An instance's first round is, so that
        a successor always finds where its rounds stand in the epoch plan."""
        return ((step + 1) % self.SAVE_EVERY == 0 or flagged or self._saves == 0 or self.plans.epoch_end(epoch, rnd)
                or (samples, worked) != self.plans.planned(epoch, rnd))

    async def _confirm_owned(self) -> None:
        """Save the counters, as a round that sends an evaluation or a checkpoint does,
        to confirm this instance still owns the task before a replay's answer sends them
        again. After a save ahead in flight (one save at a time), whose count the next
        round then no longer takes for its own: these counters replace it."""
        ahead, self._ahead = self._ahead, None
        await (await self._start_save_after(ahead, confirm=True))

    def _start_save(self, confirm: bool = False) -> asyncio.Future:
        self._saves += 1
        return asyncio.ensure_future(self._save(self.counts.saved(), confirm))

    async def _start_save_after(self, ahead, confirm: bool = False) -> asyncio.Future:
        """_start_save once the save ahead `ahead` (or None) is done, if in flight: one save
        at a time (two at once on one version, the second would fence this instance)."""
        if ahead is not None and not ahead[1].done():
            await asyncio.wait([ahead[1]])
        return self._start_save(confirm)

    def _save_ahead(self, epoch: int, rnd: int) -> None:
        """Where the next round is one whose count is saved (_must_save), start saving
        the counters as they will be once it is combined, as its units start computing
        it: its samples and units follow from the epoch plan (under load balancing too:
        shares cut a round, not its total), so when it comes as planned its save has
        landed and its parameters go out at once.
        A successor that restores these counters finds them a round ahead of the
        replicas and uncounts that round (sync_recovery `_undone`). The in-memory
        counters do not move: replays are judged by them. Not for step 1: a successor
        cannot uncount down to step 0 (replicas started anew hold step 0's parameters
        too), so counters saved two ahead of step 0 would count a round never computed.
        Nor for an epoch's last round, nor a checkpoint round: the evaluation and the
        checkpoint slices they send carry no fencing token, so they go out only once a
        save of their own has confirmed that this instance still owns the task (else a
        superseded instance's evaluation reached the stale eval bolt on its own worker)."""
        e, r = self.plans.next_round(epoch, rnd)
        if e >= self.cfg.epochs or self.counts.next_step < 2 or self.plans.epoch_end(e, r) \
                or (self.counts.next_step + 1) % self.SAVE_EVERY:
            return      # between saves; an epoch's end (and a checkpoint round: _maybe_combine) saves itself
        samples, worked = self.plans.planned(e, r)
        self._saves += 1
        saving = asyncio.ensure_future(self._save_later(self.counts.snapshot(), self.counts.next_step, e, r,
                                                        samples, worked))
        saving.add_done_callback(self._ahead_saved)
        self._ahead = ((self.counts.next_step, e, r, samples, worked), saving)

    async def _save_later(self, ahead, step: int, epoch: int, rnd: int, samples: int, worked: list) -> None:
        """Count the next round on a snapshot of the counters and save them - after the
        event loop has run AHEAD_YIELDS times, so that the parameters just sent reach
        this worker's units, and the data spout's next work reaches them, before this
        save's encoding and ZooKeeper call take the loop (0.45 ms of a LeNet-5 round's
        path on one core when the save started at once)."""
        for _ in range(AHEAD_YIELDS):
            await asyncio.sleep(0)
        ahead.count_round(self.plans, step, epoch, rnd, samples, worked)
        await self._save(ahead.saved())

    def _ahead_saved(self, saving) -> None:
        """A fenced ahead save means another instance took this task over: this one
        stops at its next tuple or tick (`_check_fenced`), not only if it combines again,
        so it answers no replay and sends nothing more. Other errors are raised where
        the save is awaited, if it ever is."""
        error = None if saving.cancelled() else saving.exception()
        if isinstance(error, FencedError):
            self._fenced = error
        elif error is not None:     # an awaiting round would raise it; one that no longer waits would not
            log.error("sync task of slice %d: saving ahead failed: %s: %s", self.slice, type(error).__name__, error)

    def _check_fenced(self) -> None:
        if self._fenced is not None:
            raise self._fenced

    def _combined(self, key, step: int, tuples: list, contributions: list, params, flagged: bool) -> None:
        """The round is counted and saved: send the new parameters (and an evaluated
        epoch end's evaluation, a checkpoint round's checkpoint) anchored to every
        contribution, then ack."""
        epoch, rnd = key
        self.loss.record(epoch + 1, *trained_loss(contributions))
        next_step = self.counts.next_step
        out = params.copy()  # receivers in this process share the array: never hand out the live one
        self._hand_over_states(tuples, next_step, out)
        self.collector.emit(row(PARAMS, step=next_step, slice=self.slice, params=out,
                                generation=self.ctx.generation), stream="params",
                            anchors=tuples)
        self.round_started, self.combined_at = time.perf_counter(), time.time()
        self.bytes_out += out.nbytes * len(self.compute_tasks)
        end = self.plans.epoch_end(epoch, rnd)
        if end and self.cfg.evaluates(epoch + 1):       # (_evaluated_end, with `end` needed below)
            self.collector.emit(row(EVAL, epoch=epoch + 1, step=step, slice=self.slice, params=out), stream="eval",
                                anchors=tuples)
        if flagged:
            values = row(CHECKPOINT, epoch=epoch + 1 if end else epoch, step=next_step, slice=self.slice, params=out,
                         state=self._checkpoint_state(tuples, (epoch + 1, 0) if end else (epoch, rnd + 1)))
            self.last_checkpoint = (step, values)
            self.collector.emit(values, stream="checkpoint", anchors=tuples)
        for t in tuples:
            self.collector.ack(t)

    def _hand_over_states(self, tuples: list, step: int, params) -> None:
        """A resumed run's first combine: the units of the checkpoint that had no work in
        its round (an uneven plan: per-unit batches, a round past a unit's shard) never
        asked for parameters, so never got their saved state (inner velocity, random
        streams) with them: each gets it now, with the new parameters, ahead of the
        broadcast of the same step (what a unit receives first, it applies before it
        computes). Those that worked had it with their answer to a resync."""
        states, self.unit_states = self.unit_states, {}
        worked = {t["unit"] for t in tuples}
        for unit, state in sorted(states.items()):
            if unit not in worked and 0 <= unit < len(self.compute_tasks) and state is not None:
                self.collector.emit(row(DIRECT_PARAMS, step=step, slice=self.slice, params=params,
                                        unit_state=state, generation=self.ctx.generation),
                                    stream="direct_params", direct_task=self.compute_tasks[unit])

    def _arrival(self, tup) -> Arrival | None:
        """A contribution's arrival and timing for straggler attribution; None when it
        carries no usable timing (a replay's answer, or a malformed one: ignored)."""
        t = tup["timing"]
        try:
            compute_s, queue_s, worker = float(t["compute_s"]), float(t["queue_s"]), str(t["worker"])
        except (TypeError, KeyError, ValueError):
            return None
        if not (0 <= compute_s < float("inf") and 0 <= queue_s < float("inf")):
            return None
        return Arrival(tup["unit"], worker, self.arrived[tup["unit"]], compute_s, queue_s)

    async def _save(self, state: dict, confirm: bool = False) -> None:
        """Save the counters: at best effort (the next round saves again), or - to
        `confirm` that this instance still owns the task, for a round that sends an
        evaluation or a checkpoint, which carry no fencing token - tried while the
        coordinator is out of reach until it answers (FencedError if another instance
        took the task over). Taken at best effort, a superseded instance cut off from
        ZooKeeper sent them on. Another coordinator error (a refused write, a session this
        worker closed) is not retried: logged, as at best effort."""
        while True:
            try:
                await self.ctx.save_state_async(state)
                return
            except FencedError:
                raise
            except CoordinatorError as e:
                if not (confirm and isinstance(e, ConnectionLostError) and not isinstance(e, SessionClosedError)):
                    log.warning("sync bolt could not save its counters: %s", e)
                    return
                log.warning("sync task of slice %d could not save the counters of a round that sends an evaluation "
                            "or a checkpoint: %s; trying again in %.0f s (they leave once it is saved)", self.slice, e,
                            self.CONFIRM_RETRY_S)
                await asyncio.sleep(self.CONFIRM_RETRY_S)

    def _checkpoint_state(self, tuples, position) -> dict:
        """Everything besides the parameters that the run needs to continue exactly (this
        slice's part: slices.merge_checkpoint_states joins the parts)."""
        # the units' work shares the data spout cut this round with (load balancing): a resumed
        # run starts from them. As the work carried them, not worked out from the round's
        # samples, which an epoch's last, partial round skews ([1.5, 0.5] came back [1.6, 0.4])
        shares = [t["share"] for t in tuples]
        if not (self.cfg.balance == "load" and len(shares) == len(self.compute_tasks)
                and all(real(x) and 0 < x < float("inf") for x in shares)):
            shares = None
        return {"position": {"epoch": position[0], "round": position[1], "step": self.counts.next_step,
                             "shares": shares},
                "outer": self.agg.state(),
                "units": {str(t["unit"]): t["unit_state"] for t in tuples if t["unit_state"] is not None},
                "counters": self.counts.checkpoint_counters(),
                "config": self.config["run"]}

    def _report(self, epoch: int):
        """The run's figures after each combined round, for /status and /metrics."""
        c, fig = self.counts, self.ctx.figure
        fig("training_loss", self.loss.last or 0.0, help="Mean training loss of the last combined round")
        fig("training_epoch", epoch + 1, help="Epoch (1-based) of the last combined round")
        fig("training_sync_rounds_total", c.rounds, counter=True, help="Rounds combined by the sync bolt")
        fig("training_samples_total", c.samples, counter=True, help="Samples combined into the parameters")
        fig("training_samples_per_second", (c.samples - c.samples_before) / self._run_seconds(),
            help="Samples combined per second since this run started")
        fig("training_sync_received_bytes_total", self.bytes_in, counter=True,
            help="Bytes of contributions this sync task received (for its slice)")
        fig("training_sync_sent_bytes_total", self.bytes_out, counter=True,
            help="Bytes of parameters this sync task sent to the units (its slice)")
        fig("training_sync_save_wait_seconds_total", self.save_wait_s, counter=True,
            help="Seconds combined rounds waited for the coordinator to confirm the saved counters before "
                 "their parameters were sent")
        fig("training_duplicate_contributions_total", c.duplicates, counter=True,
            help="Contributions answered as replays or replaced by a newer copy")
        fig("training_recoveries_total", c.recoveries, counter=True, help="Times a new sync task took over")
        for unit, s in self.barrier_s.items():
            fig("training_barrier_wait_seconds_total", s, counter=True, unit=str(unit),
                help="Seconds a unit's contributions waited at the sync bolt for the round's others")
        for rec in (self.stragglers.units.values() if self.stragglers else ()):
            fig("training_straggler_held_seconds_total", rec.held_s, counter=True, unit=str(rec.unit),
                help="Seconds the other units waited for this unit in rounds it held (it arrived last)")
            for reason, n in rec.reasons.items():
                fig("training_straggler_rounds_total", n, counter=True, unit=str(rec.unit), reason=reason,
                    help="Rounds this unit held, by reason: compute (slow node), communication (slow link), "
                         "queueing (busy worker)")

    def _publish_stragglers(self):
        st = self.stragglers
        self.ctx.publish("stragglers", {"rounds_judged": st.rounds, "top": st.top(),
                                        "last": st.last._asdict() if st.last else None})

    def _publish_progress(self, epoch, rnd):
        self._publish_stragglers()
        c = self.counts
        plan = self.plans.cached(epoch) or []
        self.ctx.publish("progress", progress_record(
            epoch=epoch, rnd=rnd, rounds=c.rounds, epoch_rounds=max((len(r) for r in plan), default=0),
            samples=c.samples, loss=self.loss.last, samples_this_run=c.samples - c.samples_before,
            elapsed_s=self._run_seconds()))

    def stats(self) -> SyncStats:
        """The run's account; closes the epochs that are complete."""
        c = self.counts
        last = max(c.epoch_samples, default=0)
        finished = {e: n for e, n in c.epoch_samples.items() if n >= self.train_size or e < last}
        for e in finished:
            c.ledger.close(e, self.plans.plan(e - 1))
        return SyncStats(
            sync_rounds=c.rounds, samples_processed=c.samples, samples_this_run=c.samples - c.samples_before,
            duplicates=c.duplicates, bytes_received=self.bytes_in, bytes_sent=self.bytes_out,
            refused=len(self.agg.refused), recoveries=c.recoveries, lost_steps=c.lost_steps,
            epoch_samples=dict(c.epoch_samples),
            each_sample_counted_once=all(n == self.train_size and c.ledger.clean(e) for e, n in finished.items()),
            miscounted=c.ledger.report(lambda e: self.plans.plan(e - 1)),
            barrier_s=dict(self.barrier_s), save_wait_s=self.save_wait_s, epoch_train_loss=self.loss.per_epoch(),
            epoch_clock=dict(c.clock.spans),
            num_params=int(self.num_params), slices=self.slices, resumed_from_step=c.resumed_from,
            quarantined=dataset_for(self.cfg).quarantined, train_s=self._run_seconds(self.combined_at),
            started=c.started)

    def _run_seconds(self, until: float | None = None) -> float:
        """Seconds from the run's start (counts.started) to `until` (a time.time()) or now."""
        return max((until or time.time()) - self.counts.started, 1e-9)

    def close(self):
        """Publish this slice's account and, for a model of at most 512 KB, its slice of the
        parameters (run_stats.final_params joins them)."""
        self.ctx.publish("stats", self.stats().to_dict())
        if self.stragglers is not None:
            self._publish_stragglers()
        self.ctx.publish("params", self.agg.params if self.num_params * 4 <= 512 << 10 else None)
