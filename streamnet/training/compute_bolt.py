"""The compute bolt: one model replica that runs a unit's rounds."""
from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from .. import kernels as K
from ..runtime import Bolt
from .bp import ComputeUnit, plan_for
from .config import run_config_from_dict
from .run_stats import UnitTiming
from .schedule import check_training_data, dataset_for, make_model
from .slices import bounds, slice_index
from .streams import APPLIED, CONTRIBUTION, OK, REPLICA, RESYNC, row
from ..runtime.values import whole
from .sync_recovery import vector_problem

log = logging.getLogger(__name__)


def batches_problem(batches, train_size: int) -> str | None:
    """Why a work tuple's batches are not lists of sample indices of the training set, or None."""
    if not isinstance(batches, list):
        return f"batches are a {type(batches).__name__}, not a list"
    for i, b in enumerate(batches):
        if not (isinstance(b, np.ndarray) and b.ndim == 1 and b.dtype.kind in "iu"):
            return f"batch {i} is not a 1-D integer array"

    def outside(a) -> bool:
        return bool(a.size) and (int(a.min()) < 0 or int(a.max()) >= train_size)
    # the range of all of them at once (a min and a max per batch were 16 numpy calls a
    # LeNet-5 round on the event loop: 8 batches of 32, 19.8 -> 4.7 us); the batch to name
    # is looked for only when one is out of range
    if batches and outside(np.concatenate(batches)):
        i = next(i for i, b in enumerate(batches) if outside(b))
        return f"batch {i} indexes outside the {train_size} training samples"
    return None


class ComputeBolt(Bolt):
    """One model replica: runs a unit's round on the worker's compute threads.

    The parameters come in slices, one from each sync task (slices.py), and each
    slice knows its step; `params_step`, the oldest of them, is the step this
    replica's parameters start once every slice of it has come. Work for that step
    is computed and each slice of the result sent to its sync task; work for an
    earlier step was already combined and applied (a replay after a failure) and is
    answered "applied"; work for a later step means this replica is new or missed a
    broadcast, so it asks the sync tasks for their slices and holds the work until
    they come. (Only after a fault can a slice be ahead of the work while another is
    not: that slice is answered "applied", the others computed.)

    A sync task that starts over asks every replica for its slice; from then on the
    unit takes no parameters of that slice from an older instance of the sync task
    (a smaller `generation`: one still running on a worker that has not yet learnt it
    was superseded). Those fail, and their round is replayed: the new instance judged
    from the replicas' answers which rounds reached the units, and a round that reached
    some after they answered would leave the units and its counters a round apart.

    With overlap (bp.py) the unit computes the work of step `ready_step` - the step its
    own parameters are ready for - as soon as it comes, in the background, while the
    parameters of the step before are still being combined (`params_step` may be one
    behind); the result is held until every slice of its step's parameters is in, then
    sent, and the next round starts from those less the unit's own change. The bolt
    goes on taking tuples meanwhile: the parameters are acked at once, so that the
    data spout's barrier moves and the next round's work is on its way.
    """
    outputs = {"default": list(CONTRIBUTION), "resync": list(RESYNC), "replica": list(REPLICA)}

    tick_interval_s = 0.5
    RESYNC_S = 2.0    # ask again for parameters not received within this

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        self.ds = dataset_for(self.cfg)
        check_training_data(self.config.get("data"), self.ds)
        self.unit = ComputeUnit(ctx.task_index, make_model(self.cfg, self.ds.num_classes), plan_for(self.cfg.algorithm))
        self.size = self.unit.model.input_shape[-1]
        self.sync_tasks = ctx.component_tasks("sync")
        self.slices = bounds(self.unit.model.num_params, len(self.sync_tasks))
        self.slice_steps = [0] * len(self.slices)   # a new replica holds the seeded initial parameters: step 0's
        self.slice_generations = [0] * len(self.slices)   # per slice, the newest sync instance seen
        self.stash: list = []
        self.compute_s = self.wait_s = 0.0
        self.samples = 0
        self._sent_at: float | None = None
        self._asked_at = -float("inf")
        self._computed_step: int | None = None    # the step of the last work computed
        # ((epoch, round, step), its batches, (contribution, seconds, started)) of the last round
        # computed: the same work again at the same parameters is answered from here (_result)
        self._last: tuple | None = None
        self.overlap = self.cfg.algorithm.overlap
        self.ready_step = 0                          # overlap: the step the unit's own parameters are ready for
        self._computing: asyncio.Future | None = None   # overlap: the round running ahead
        self._held: tuple | None = None   # overlap: (work, result, received) waiting for its step's parameters
        self._held_at = 0.0
        self._sent: tuple | None = None   # overlap: the _last of the round sent last, for its replays
        self._resumed: tuple | None = None   # overlap: (step, own parameters) from the checkpoint resumed
        self._closed = False

    @property
    def params_step(self) -> int:
        """The step that every slice of the parameters has reached."""
        return min(self.slice_steps)

    def _round(self, batches, scale):
        self.unit.set_threads(self.ctx.compute_share())   # the threads this worker gives the unit now
        t0 = time.perf_counter()
        c = self.unit.run_round((self.ds.batch(self.ds.train, idx, self.size) for idx in batches), scale)
        return c, time.perf_counter() - t0, t0

    async def _work(self, tup):
        if self.overlap:
            await self._overlap_work(tup)
            return
        step = tup["step"]
        if step > self.params_step:
            first = not self.stash
            self.stash.append(tup)         # tick() asks again if they do not come
            if first and step == self.params_step + 1 and self._sent_at is not None:
                # sent ahead (data_spout._send_ahead): the parameters of its step are on their
                # way; tick() asks for them only if they have not come within RESYNC_S
                self._asked_at = time.monotonic()
            elif first and time.monotonic() - self._asked_at > self.RESYNC_S:
                log.warning("unit %d holds parameters of step %d, work is for step %d: asking for them",
                            self.ctx.task_index, self.params_step, step)
                self._ask_for_params()
            return
        if step < self.params_step:
            self._applied(tup)
            return
        problem = batches_problem(tup["batches"], len(self.ds.train))
        if problem:
            log.warning("unit %d refuses its work for step %s: %s", self.ctx.task_index, step, problem)
            self.collector.fail(tup)
            return
        received = time.perf_counter()
        self._computed_step = step
        result, again = await self._result(tup)
        if not again:
            self.compute_s += result[1]
            self.samples += result[0].samples
        self._send_result(tup, result, received)
        self._sent_at = time.perf_counter()
        # the contribution leaves before the figures are written and the load loop wakes
        await self.collector.send_now()
        if not again:
            self._reported(tup, result)

    def _applied(self, tup) -> None:
        """Work for a step every slice has combined and applied already (a replay): each
        sync task is told so, and the work acked."""
        for s in range(len(self.slices)):
            self._contribute(tup, s)
        self.collector.ack(tup)

    def _send_result(self, tup, result, received: float) -> None:
        """Each slice of a round's result to its sync task (those combined already: "applied"),
        and the work acked."""
        c, seconds, started = result
        step = tup["step"]
        timing = {"compute_s": seconds, "queue_s": max(0.0, started - received), "worker": self.ctx.worker}
        # for a checkpoint that resumes exactly; with overlap with the unit's own parameters,
        # where its next round starts (_progress moved them there first)
        state = self.unit.state(local=self.overlap and c.samples > 0) if tup["checkpoint"] else None
        # the unit's verdict on its whole vector, so that every slice drops a diverged unit
        # as the whole would; with one slice the sync task's own check is that verdict
        # (47 us per LeNet-5 vector, a round's second check of it)
        finite = bool(K.all_finite(c.vector)) if len(self.slices) > 1 else None
        for s, (lo, hi) in enumerate(self.slices):
            if self.slice_steps[s] > step:
                self._contribute(tup, s)
            else:                                  # the unit's state travels with slice 0
                self._contribute(tup, s, samples=c.samples, steps=c.steps, loss_sum=c.loss_sum,
                                 vector=c.vector[lo:hi], finite=finite, status=OK,
                                 unit_state=state if s == 0 else None, timing=timing)
        self.collector.ack(tup)

    def _reported(self, tup, result) -> None:
        """A round's figures, once its result has left: this unit's speed, for load balancing."""
        self.ctx.report_work(result[0].samples, result[1], share=tup["share"])
        self._report()

    # -- overlap (bp.py): the next round runs while the last is combined --------------------

    async def _overlap_work(self, tup) -> None:
        step = tup["step"]
        self._settle_local()
        if step < self.params_step:
            self._applied(tup)
            return
        idle = self._computing is None and self._held is None
        if step == self.params_step and self.ready_step == step + 1:
            # the round sent last, again (its tree failed): its result again, which the sync
            # tasks count once; work cut otherwise (a spout that started anew) is computed
            # again from the parameters of its step, once nothing runs
            result = self._again(self._sent, tup)
            if result is not None:
                self._send_result(tup, result, time.perf_counter())
                await self.collector.send_now()
                return
            if idle:
                self.unit.continue_from(None)
                self.ready_step = step
        if step == self.ready_step and idle:
            problem = batches_problem(tup["batches"], len(self.ds.train))
            if problem:
                log.warning("unit %d refuses its work for step %s: %s", self.ctx.task_index, step, problem)
                self.collector.fail(tup)
                return
            self._computing = asyncio.ensure_future(self._ahead(tup))
            return
        first = not self.stash
        self.stash.append(tup)         # until what runs or waits has gone (tick() asks if nothing moves)
        if step <= self.ready_step + 1:
            if first:
                self._asked_at = time.monotonic()
        elif time.monotonic() - self._asked_at > self.RESYNC_S:
            log.warning("unit %d holds parameters of step %d, work is for step %d: asking for them",
                        self.ctx.task_index, self.params_step, step)
            self._ask_for_params()

    async def _ahead(self, tup) -> None:
        """Compute `tup`'s round on the compute threads while the bolt takes other tuples;
        then hold its result until its step's parameters are in (_progress)."""
        received = time.perf_counter()
        try:
            result = await self.ctx.compute(self._round, tup["batches"], tup["lr_scale"])
        except Exception:  # noqa: BLE001 - as a failed execute: the work is replayed
            self._computing = None
            log.exception("unit %d: the round of step %s failed", self.ctx.task_index, tup["step"])
            if not self._closed:
                self.collector.fail(tup)
            return
        self._computing = None
        if self._closed:
            return
        self.compute_s += result[1]
        self.samples += result[0].samples
        self._held, self._held_at = (tup, result, received), time.perf_counter()
        self._asked_at = time.monotonic()
        try:
            await self._progress()
        except Exception:  # noqa: BLE001 - nothing awaits this task: say it here (the tick asks again)
            log.exception("unit %d: sending the round of step %s failed", self.ctx.task_index, tup["step"])

    async def _progress(self) -> None:
        """Overlap: send the held result if its step's parameters are in, then start the
        next round if its work is here."""
        sent = None
        if self._held is not None:
            tup, result, received = self._held
            step = tup["step"]
            if step == self.params_step:
                self._held = None
                self.wait_s += time.perf_counter() - self._held_at
                if result[0].samples:             # else from the next step's parameters (_settle_local)
                    self.unit.continue_from(result[0].vector)
                    self.ready_step = step + 1
                self._send_result(tup, result, received)
                self._sent = ((tup["epoch"], tup["round"], step), tup["batches"], result)
                sent = (tup, result)
            elif step < self.params_step:       # combined without it (recovery moved past it)
                self._held = None
                self._applied(tup)
        if sent is not None:
            await self.collector.send_now()     # the contribution leaves first
        self._settle_local()
        if self._computing is None and self._held is None and self.stash:
            stash, self.stash = self.stash, []
            for work in stash:
                await self._overlap_work(work)
        if sent is not None:
            self._reported(*sent)

    def _settle_local(self) -> None:
        """The unit's own parameters are behind the combined ones (it had no work in a round,
        a round's result had no samples, or a recovery moved the run on): it starts from
        the combined parameters."""
        if self._computing is None and self._held is None and self.ready_step < self.params_step:
            resumed, self._resumed = self._resumed, None
            if resumed is not None and resumed[0] == self.params_step:
                self.unit.model.params[...] = resumed[1]     # a checkpoint's: where the unit stood
            else:
                self.unit.continue_from(None)
            self.ready_step = self.params_step

    async def _result(self, work) -> tuple[tuple, bool]:
        """((contribution, seconds, started), whether it was computed before) of `work`,
        whose step is the parameters': computed on the compute threads, or - for the
        round computed last, sent again (a replay after a failed tree, a spout that
        started anew, a copy sent ahead twice) while the parameters of its step have
        not moved - its result again. Computing it again would start from the
        parameters and inner state the first computation moved on: MixBP's local steps
        (and dropout's random stream) taken twice, the round's samples trained twice."""
        again = self._again(self._last, work)
        if again is not None:
            return again, True
        result = await self.ctx.compute(self._round, work["batches"], work["lr_scale"])
        self._last = ((work["epoch"], work["round"], work["step"]), work["batches"], result)
        return result, False

    def _again(self, last, work):
        """The result in `last` ((epoch, round, step), batches, result) if `work` is that
        same work again, else None."""
        if last is None or last[0] != (work["epoch"], work["round"], work["step"]) \
                or len(last[1]) != len(work["batches"]) \
                or not all(np.array_equal(a, b) for a, b in zip(last[1], work["batches"])):
            return None
        log.info("unit %d: step %d's work came again; sending the result computed for it", self.ctx.task_index,
                 work["step"])
        return last[2]

    def _contribute(self, work, s: int, **result) -> None:
        """Slice s of this unit's result for the round of `work`, to its sync task;
        without a result, the answer that the step is combined and applied already."""
        result = result or dict(samples=0, steps=0, loss_sum=0.0, vector=np.zeros(0, np.float32), finite=True,
                                status=APPLIED, unit_state=None, timing=None)
        head = {f: work[f] for f in ("unit", "epoch", "round", "step", "lr_scale", "checkpoint", "share")}
        self.collector.emit(row(CONTRIBUTION, **head, slice=s, **result), anchors=work,
                            direct_task=self.sync_tasks[s])

    def _report(self):
        """This unit's figures for /status and /metrics (the UI's per-worker bars)."""
        unit = str(self.ctx.task_index)
        self.ctx.figure("training_compute_seconds_total", self.compute_s, counter=True, unit=unit,
                        help="Seconds this compute unit spent computing its rounds")
        self.ctx.figure("training_round_trip_seconds_total", self.wait_s, counter=True, unit=unit,
                        help="Seconds from sending a contribution to receiving the round's parameters "
                             "(communication, barrier and combine; with overlap, holding a round's result "
                             "until its step's parameters came)")
        self.ctx.figure("training_unit_samples_total", self.samples, counter=True, unit=unit,
                        help="Samples this compute unit trained on")

    def _ask_for_params(self):
        """Ask every sync task for its slice. A unit that computed nothing at its
        parameters' step names the earliest work it holds: if every replica started anew
        with the sync task, that is where the data spout is (sync_recovery `_resync`)."""
        held = min((w["step"] for w in self.stash), default=None)
        self.collector.emit(row(RESYNC, task=self.ctx.task,
                                step=held if self._computed_step != self.params_step else None), stream="resync")
        self._asked_at = time.monotonic()

    def tick(self):
        # the request is a single unanchored tuple: it is lost if a sync task moves
        # meanwhile (and ignored while a new one rebuilds): ask again rather than wait
        # (with overlap a unit also waits holding a result; not while a round runs)
        waiting = [self._held[0]] if self._held else self.stash
        if waiting and self._computing is None and time.monotonic() - self._asked_at > self.RESYNC_S:
            log.warning("unit %d: still no parameters for step %d after %.1f s; asking again",
                        self.ctx.task_index, waiting[0]["step"], time.monotonic() - self._asked_at)
            self._ask_for_params()

    async def execute(self, tup):
        if tup.source == "data":
            await self._work(tup)
            return
        problem = slice_index(tup["slice"], len(self.slices))
        if problem:
            log.warning("unit %d refuses a %s tuple from %s: %s", self.ctx.task_index, tup.stream, tup.source, problem)
            self.collector.fail(tup)
            return
        s = tup["slice"]
        lo, hi = self.slices[s]
        generation = tup["generation"]
        if not whole(generation) or generation < 0:
            log.warning("unit %d refuses a %s tuple from %s: generation %r is not a non-negative integer",
                        self.ctx.task_index, tup.stream, tup.source, generation)
            self.collector.fail(tup)
            return
        if generation < self.slice_generations[s]:
            log.warning("unit %d refuses a %s tuple of slice %d from a superseded sync task (generation %d, a "
                        "newer one is %d)%s", self.ctx.task_index, tup.stream, s, generation,
                        self.slice_generations[s], "" if tup.stream == "state_request" else ": its round is replayed")
            self.collector.fail(tup)
            return
        self.slice_generations[s] = generation
        if tup.stream == "state_request":
            # the parameters of that step, as received: not the unit's own local steps since
            self.collector.emit(row(REPLICA, task=self.ctx.task, slice=s, step=self.slice_steps[s],
                                    params=self.unit.start[lo:hi].copy()),
                                stream="replica", direct_task=self.sync_tasks[s])
            self.collector.ack(tup)
            return
        before = self.params_step
        if tup["step"] >= self.slice_steps[s]:   # a slice of parameters: broadcast or sent to us alone
            problem = vector_problem(tup["params"], hi - lo)
            if problem:
                # failing the tree makes the sync task answer the replay with its slice again
                log.warning("unit %d refuses parameters for step %s from %s: %s", self.ctx.task_index,
                            tup["step"], tup.source, problem)
                self.collector.fail(tup)
                return
            if tup.stream == "direct_params" and tup["unit_state"] is not None and tup["step"] > self.slice_steps[s]:
                # resuming from a checkpoint: once - a second answer to a request made again
                # (the sync task slow to start) came after the unit computed that round and
                # set its inner momentum and dropout streams back; first, so that a state it
                # refuses leaves the slice and its step as they were
                try:
                    local = self.unit.set_state(tup["unit_state"])
                    if local is not None:
                        self._resumed = (tup["step"], local)
                except ValueError as e:
                    # the checkpoint cannot resume this unit: every request for parameters
                    # would be answered with the same state, every 2 s, for ever
                    self.ctx.fail_topology(f"unit {self.ctx.task_index} cannot take its state from the "
                                           f"checkpoint of step {tup['step']}: {e}")
                    self.collector.fail(tup)
                    return
            self.unit.receive_slice(lo, hi, tup["params"], local=not self.overlap)
            self.slice_steps[s] = tup["step"]
        self.collector.ack(tup)
        if self.overlap:
            if self.params_step > before:
                self._asked_at = time.monotonic()
                await self._progress()
            return
        if self.params_step > before:          # every slice of a newer step is in
            if self._sent_at is not None:
                self.wait_s += time.perf_counter() - self._sent_at
                self._sent_at = None
                self._report()
            stash, self.stash = self.stash, []
            for work in stash:
                await self._work(work)

    def close(self):
        self._closed = True
        self.unit.close()
        self.ctx.publish("timing", UnitTiming(worker=self.ctx.worker, unit=self.ctx.task_index,
                                              compute_s=self.compute_s, wait_s=self.wait_s,
                                              samples=self.samples).to_dict())
