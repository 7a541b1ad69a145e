"""The compute bolt: one model replica that runs a unit's rounds."""
from __future__ import annotations

import logging
import time

import numpy as np

from ..runtime import Bolt
from .bp import ComputeUnit, plan_for
from .config import run_config_from_dict
from .run_stats import UnitTiming
from .schedule import dataset_for, make_model
from .streams import APPLIED, CONTRIBUTION, OK, REPLICA, RESYNC, row
from .sync_recovery import vector_problem

log = logging.getLogger(__name__)


def batches_problem(batches, train_size: int) -> str | None:
    """Why a work tuple's batches are not lists of sample indices of the training set, or None."""
    if not isinstance(batches, list):
        return f"batches are a {type(batches).__name__}, not a list"
    for i, b in enumerate(batches):
        if not (isinstance(b, np.ndarray) and b.ndim == 1 and b.dtype.kind in "iu"):
            return f"batch {i} is not a 1-D integer array"
        if b.size and (int(b.min()) < 0 or int(b.max()) >= train_size):
            return f"batch {i} indexes outside the {train_size} training samples"
    return None


class ComputeBolt(Bolt):
    """One model replica: runs a unit's round on the worker's compute threads.

    It knows which step its parameters start (`params_step`): work for that step is
    computed; work for an earlier step was already combined and applied (a replay
    after a failure) and is answered "applied"; work for a later step means this
    replica is new or missed a broadcast, so it asks the sync bolt for the current
    parameters and holds the work until they come.
    """
    outputs = {"default": list(CONTRIBUTION), "resync": list(RESYNC), "replica": list(REPLICA)}

    tick_interval_s = 0.5
    RESYNC_S = 2.0    # ask again for parameters not received within this

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        self.ds = dataset_for(self.cfg)
        self.unit = ComputeUnit(ctx.task_index, make_model(self.cfg, self.ds.num_classes), plan_for(self.cfg.algorithm))
        self.size = self.unit.model.input_shape[-1]
        self.params_step = 0          # a new replica holds the seeded initial parameters: step 0's
        self.stash: list = []
        self.compute_s = self.wait_s = 0.0
        self.samples = 0
        self._sent_at: float | None = None
        self._asked_at = 0.0

    def _round(self, batches, scale):
        self.unit.set_threads(self.ctx.compute_share())   # the threads this worker gives the unit now
        t0 = time.perf_counter()
        c = self.unit.run_round((self.ds.batch(self.ds.train, idx, self.size) for idx in batches), scale)
        return c, time.perf_counter() - t0

    async def _work(self, tup):
        step = tup["step"]
        if step > self.params_step:
            if not self.stash:
                log.warning("unit %d holds parameters of step %d, work is for step %d: asking for them",
                            self.ctx.task_index, self.params_step, step)
                self._ask_for_params()
            self.stash.append(tup)
            return
        work = {f: tup[f] for f in ("unit", "epoch", "round", "step", "lr_scale", "checkpoint")}
        if step < self.params_step:
            self.collector.emit(row(CONTRIBUTION, **work, samples=0, steps=0, loss_sum=0.0,
                                    vector=np.zeros(0, np.float32), status=APPLIED, unit_state=None), anchors=tup)
        else:
            problem = batches_problem(tup["batches"], len(self.ds.train))
            if problem:
                log.warning("unit %d refuses its work for step %s: %s", self.ctx.task_index, step, problem)
                self.collector.fail(tup)
                return
            c, seconds = await self.ctx.compute(self._round, tup["batches"], tup["lr_scale"])
            self.compute_s += seconds
            self.ctx.report_work(c.samples, seconds)      # this unit's speed, for load balancing
            self.samples += c.samples
            self._report()
            state = self.unit.state() if tup["checkpoint"] else None   # for a checkpoint that resumes exactly
            self.collector.emit(row(CONTRIBUTION, **work, samples=c.samples, steps=c.steps, loss_sum=c.loss_sum,
                                    vector=c.vector, status=OK, unit_state=state), anchors=tup)
            self._sent_at = time.perf_counter()
        self.collector.ack(tup)

    def _report(self):
        """This unit's figures for /status and /metrics (the UI's per-worker bars)."""
        unit = str(self.ctx.task_index)
        self.ctx.figure("training_compute_seconds_total", self.compute_s, counter=True, unit=unit,
                        help="Seconds this compute unit spent computing its rounds")
        self.ctx.figure("training_round_trip_seconds_total", self.wait_s, counter=True, unit=unit,
                        help="Seconds from sending a contribution to receiving the round's parameters "
                             "(communication, barrier and combine)")
        self.ctx.figure("training_unit_samples_total", self.samples, counter=True, unit=unit,
                        help="Samples this compute unit trained on")

    def _ask_for_params(self):
        self.collector.emit(row(RESYNC, task=self.ctx.task), stream="resync")
        self._asked_at = time.monotonic()

    def tick(self):
        # the request is a single unanchored tuple: it is lost if the sync bolt moves
        # meanwhile (and ignored while a new one rebuilds): ask again rather than wait
        if self.stash and time.monotonic() - self._asked_at > self.RESYNC_S:
            log.warning("unit %d: still no parameters for step %d after %.1f s; asking again",
                        self.ctx.task_index, self.stash[0]["step"], time.monotonic() - self._asked_at)
            self._ask_for_params()

    async def execute(self, tup):
        if tup.source == "data":
            await self._work(tup)
            return
        if tup.stream == "state_request":
            self.collector.emit(row(REPLICA, task=self.ctx.task, step=self.params_step,
                                    params=self.unit.model.params.copy()), stream="replica")
        elif tup["step"] >= self.params_step:  # parameters: broadcast or sent to us alone
            problem = vector_problem(tup["params"], self.unit.model.num_params)
            if problem:
                # failing the tree makes the sync bolt answer the replay with its parameters again
                log.warning("unit %d refuses parameters for step %s from %s: %s", self.ctx.task_index,
                            tup["step"], tup.source, problem)
                self.collector.fail(tup)
                return
            if self._sent_at is not None:
                self.wait_s += time.perf_counter() - self._sent_at
                self._sent_at = None
                self._report()
            self.unit.receive(tup["params"])
            self.params_step = tup["step"]
            if tup.stream == "direct_params" and tup["unit_state"] is not None:
                self.unit.set_state(tup["unit_state"])   # resuming from a checkpoint
        self.collector.ack(tup)
        stash, self.stash = self.stash, []
        for work in stash:
            await self._work(work)

    def close(self):
        self.unit.close()
        self.ctx.publish("timing", UnitTiming(worker=self.ctx.worker, unit=self.ctx.task_index,
                                              compute_s=self.compute_s, wait_s=self.wait_s,
                                              samples=self.samples).to_dict())
