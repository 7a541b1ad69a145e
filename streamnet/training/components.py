"""NN-S as runtime components: the data spout, compute bolts, the sync bolt, the
evaluation bolt and the checkpoint bolt.

One round, for every unit k with work in it:

    data --work(k, epoch, round, batches)--> compute[k]          (direct; root of k's tree)
    compute[k] --contribution(k, vector)--> sync                 (anchored to the work)
    sync, once every expected unit of the round has reported:
        combine (weighted, in unit order) and one outer step
        --params--> every compute task (all), and at epoch ends --params--> eval, checkpoint
        (anchored to all of the round's contributions), then ack the contributions
    compute[j] sets the params, acks.

So unit k's tree completes only when every replica holds the new parameters (and,
at an epoch's end, the evaluation is done); the spout's max_spout_pending equals
the number of units, which makes the tree completion the synchronisation barrier.
A lost tuple fails the tree and the spout replays the unit's work; the sync bolt
counts each (epoch, round, unit) once and answers a replay of a round it already
combined by sending the current parameters again.
"""
from __future__ import annotations

import functools
import logging
import time

import numpy as np

from ..runtime import Bolt, CoordinatorError, FencedError, Spout
from .bp import Aggregator, ComputeUnit, Contribution, lr_scale, plan_for
from .config import run_config_from_dict
from .evaluate import evaluate
from .ledger import SampleLedger
from .local import UnitSchedule, load_data, make_model

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def _dataset(data_key: str, seed: int):
    """One copy per process however many tasks use it (the local cluster runs all
    workers in one process); read-only, so sharing is safe."""
    import json
    from .config import DataConfig
    return load_data(DataConfig(**json.loads(data_key)), seed)


def dataset_for(cfg):
    import json
    from dataclasses import asdict
    return _dataset(json.dumps(asdict(cfg.data), sort_keys=True), cfg.seed)


class DataSpout(Spout):
    """Emits each unit's work, round by round, epoch by epoch.

    A round flagged `checkpoint` (an epoch's last round when the topology writes
    checkpoints, and the round that ends a drain) goes to every unit, so that each
    hands over its state with its contribution and the sync bolt can write a
    checkpoint that resumes exactly. A drain (`streamnet-submit kill --checkpoint`,
    SIGTERM to a worker) ends the run after its next checkpoint round.
    """
    outputs = ["unit", "epoch", "round", "step", "lr_scale", "batches", "checkpoint"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        self.schedule = UnitSchedule(self.cfg, int(self.config["train_size"]))
        self.compute_tasks = ctx.component_tasks("compute")
        self.checkpoints = bool(self.config.get("checkpoints"))
        start = self.config.get("resume") or {}
        self.epoch, self.round, self.step = start.get("epoch", 0), start.get("round", 0), start.get("step", 0)
        self.total = self.schedule.epoch(0)[1] * self.cfg.epochs
        if self.epoch < self.cfg.epochs:
            self.plan, self.rounds = self.schedule.epoch(self.epoch)
        self.in_flight: dict[tuple, list] = {}      # (epoch, round, unit) -> work values
        self.flagged = False                        # is the round in flight a checkpoint round?
        self.replay: list[tuple] = []
        self.replayed = 0
        self.draining = self.stopped = False

    def restore(self, state):
        self.epoch, self.round, self.step = state["epoch"], state["round"], state["step"]
        self.replayed = state["replayed"]
        self.stopped = state.get("stopped", False)
        if self.epoch < self.cfg.epochs:
            self.plan, self.rounds = self.schedule.epoch(self.epoch)

    def drain(self):
        if not self.draining and not self.is_done():
            log.warning("drain requested at epoch %d, round %d: stopping after the next checkpoint round",
                        self.epoch + 1, self.round + 1)
        self.draining = True

    def _emit(self, key, values):
        self.collector.emit(values, msg_id=key, direct_task=self.compute_tasks[key[2]])

    def next_tuple(self):
        if self.replay:
            key = self.replay.pop()
            self._emit(key, self.in_flight[key])
            return
        if self.in_flight or self.epoch >= self.cfg.epochs or self.stopped:
            return  # the barrier: the whole round must complete first
        scale = lr_scale(self.cfg.algorithm, self.step / self.total)
        self.flagged = self.draining or (self.checkpoints and self.round + 1 >= self.rounds)
        for unit, rounds in enumerate(self.plan):
            if self.round < len(rounds) or self.flagged:
                batches = [b.astype(np.int32) for b in rounds[self.round]] if self.round < len(rounds) else []
                key = (self.epoch, self.round, unit)
                self.in_flight[key] = [unit, self.epoch, self.round, self.step, scale, batches, self.flagged]
                self._emit(key, self.in_flight[key])

    def ack(self, key):
        self.in_flight.pop(tuple(key), None)
        if not self.in_flight:
            self.round += 1
            self.step += 1
            if self.round >= self.rounds:
                self.epoch, self.round = self.epoch + 1, 0
                if self.epoch < self.cfg.epochs:
                    self.plan, self.rounds = self.schedule.epoch(self.epoch)
            if self.draining and self.flagged and self.epoch < self.cfg.epochs:
                self.stopped = True
                log.warning("drained: stopped before epoch %d, round %d (step %d)",
                            self.epoch + 1, self.round + 1, self.step)
            self.ctx.save_state({"epoch": self.epoch, "round": self.round, "step": self.step,
                                 "replayed": self.replayed, "stopped": self.stopped})

    def fail(self, key):
        key = tuple(key)
        if key in self.in_flight:
            self.replayed += 1
            log.warning("replaying work of unit %d, epoch %d, round %d", key[2], key[0], key[1])
            self.replay.append(key)

    def is_done(self):
        return (self.epoch >= self.cfg.epochs or self.stopped) and not self.in_flight

    def close(self):
        if self.is_done():
            self.ctx.publish("replayed", self.replayed)
            if self.stopped:
                self.ctx.publish("stopped_at", {"epoch": self.epoch, "round": self.round, "step": self.step})


class ComputeBolt(Bolt):
    """One model replica: runs a unit's round on the worker's compute threads.

    It knows which step its parameters start (`params_step`): work for that step is
    computed; work for an earlier step was already combined and applied (a replay
    after a failure) and is answered "applied"; work for a later step means this
    replica is new or missed a broadcast, so it asks the sync bolt for the current
    parameters and holds the work until they come.
    """
    outputs = {"default": ["unit", "epoch", "round", "step", "lr_scale", "samples", "steps", "loss_sum", "vector",
                           "status", "checkpoint", "unit_state"],
               "resync": ["task"], "replica": ["task", "step", "params"]}

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
        head = [tup["unit"], tup["epoch"], tup["round"], step, tup["lr_scale"]]
        if step < self.params_step:
            self.collector.emit(head + [0, 0, 0.0, np.zeros(0, np.float32), "applied", tup["checkpoint"], None],
                                anchors=tup)
        else:
            c, seconds = await self.ctx.compute(self._round, tup["batches"], tup["lr_scale"])
            self.compute_s += seconds
            self.samples += c.samples
            state = self.unit.state() if tup["checkpoint"] else None   # for a checkpoint that resumes exactly
            self.collector.emit(head + [c.samples, c.steps, c.loss_sum, c.vector, "ok", tup["checkpoint"], state],
                                anchors=tup)
            self._sent_at = time.perf_counter()
        self.collector.ack(tup)

    def _ask_for_params(self):
        self.collector.emit([self.ctx.task], stream="resync")
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
            self.collector.emit([self.ctx.task, self.params_step, self.unit.model.params.copy()], stream="replica")
        elif tup["step"] >= self.params_step:  # parameters: broadcast or sent to us alone
            if self._sent_at is not None:
                self.wait_s += time.perf_counter() - self._sent_at
                self._sent_at = None
            self.unit.receive(tup["params"])
            self.params_step = tup["step"]
            if tup.stream == "direct_params" and tup["unit_state"] is not None:
                self.unit.set_state(tup["unit_state"])   # resuming from a checkpoint
        self.collector.ack(tup)
        stash, self.stash = self.stash, []
        for work in stash:
            await self._work(work)

    def close(self):
        self.ctx.publish("timing", {"worker": self.ctx.worker, "unit": self.ctx.task_index,
                                    "compute_s": self.compute_s, "wait_s": self.wait_s, "samples": self.samples})


class SyncBolt(Bolt):
    """The parameter aggregator.

    It combines each step once (`next_step` is the step its parameters start). A
    sync bolt that starts anew (its worker died) holds no parameters: it asks every
    replica for theirs and continues from the newest - the compute units' replicas
    are the parameters' backup - with the outer momentum reset (logged).
    """
    outputs = {"params": ["step", "params"], "direct_params": ["step", "params", "unit_state"],
               "state_request": ["nonce"], "eval": ["epoch", "step", "params"],
               "checkpoint": ["epoch", "step", "params", "state"]}
    tick_interval_s = 1.0
    ADOPT_WAIT_S = 5.0

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        ds = dataset_for(self.cfg)
        self.train_size = len(ds.train)
        model = make_model(self.cfg, ds.num_classes)
        self.agg = Aggregator(model.params, plan_for(self.cfg.algorithm))
        self.schedule = UnitSchedule(self.cfg, self.train_size)
        self.compute_tasks = ctx.component_tasks("compute")
        self.expected_cache: dict[int, list] = {}
        self.pending: dict[tuple[int, int], dict[int, object]] = {}
        self.next_step = 0
        self.adopting: dict | None = None     # replica replies while rebuilding state
        self.rounds = self.samples = self.duplicates = self.recoveries = 0
        self.epoch_samples: dict[int, int] = {}
        self.ledger = SampleLedger(len(self.compute_tasks))
        self.bytes_in = self.bytes_out = 0
        self.barrier_s: dict[int, float] = {}
        self.arrived: dict[int, float] = {}
        self.loss_history: list[float] = []
        self.epoch_loss: dict[int, list[float]] = {}   # epoch -> [loss sum, samples]
        self.t0 = time.perf_counter()
        self.started = time.time()
        # epoch -> {"from", "to" (wall clock), "samples" combined in this run}: per-epoch throughput
        self.epoch_clock: dict[int, dict] = {}
        self._published = 0.0
        self.restored = False
        self.last_round = None   # (step, epoch, samples, round, units) of the last combine, to undo one never delivered
        self.last_checkpoint = None   # (step, checkpoint tuple values), to send again if its round is replayed
        self.unit_states: dict[int, dict] = {}   # from the checkpoint resumed, for the units' first resync
        self.resumed_from = None
        self.samples_before = 0     # samples counted before the checkpoint this run resumed from
        if self.config.get("resume"):
            self._resume(self.config["resume"])

    def _resume(self, where: dict):
        from .checkpoint import load_checkpoint
        ck = load_checkpoint(where["path"], where.get("sha256"))
        st = ck["state"]
        self.agg = Aggregator(ck["params"], self.agg.plan)
        self.agg.set_state(st["outer"])
        self.next_step = self.resumed_from = ck["step"]
        c = st["counters"]
        self.epoch_samples = {int(k): v for k, v in c["epoch_samples"].items()}
        self.ledger.load_state(c.get("ledger"))
        self.rounds, self.samples = c["rounds"], c["samples"]
        self.samples_before = c["samples"]
        self.unit_states = {int(k): v for k, v in st["units"].items()}
        log.warning("sync bolt resumes from %s at step %d", where["path"], self.next_step)

    def restore(self, state):
        """Counters survive in the coordinator; parameters come back from the replicas."""
        self.restored = True
        self.unit_states = {}
        self.next_step = state["next_step"]
        self.epoch_samples = {int(k): v for k, v in state["epoch_samples"].items()}
        self.ledger.load_state(state.get("ledger"))
        self.rounds, self.samples, self.duplicates = state["rounds"], state["samples"], state["duplicates"]
        self.recoveries = state["recoveries"] + 1
        self.started = state["started"]
        self.epoch_clock = {int(k): v for k, v in (state.get("epoch_clock") or {}).items()}
        self.last_round = state.get("last_round")
        self._request_replicas()

    def _request_replicas(self):
        log.warning("sync bolt starting over at step %d: asking the %d replicas for their parameters",
                    self.next_step, len(self.compute_tasks))
        self.adopting = {"replies": {}, "since": time.monotonic()}
        self.collector.emit([time.time_ns()], stream="state_request")

    def _save(self):
        try:
            self._save_now()
        except FencedError:
            raise
        except CoordinatorError as e:  # best effort: the next round saves again
            log.warning("sync bolt could not save its counters: %s", e)

    def _save_now(self):
        self.ctx.save_state({"next_step": self.next_step, "epoch_samples": {str(k): v for k, v in self.epoch_samples.items()},
                             "rounds": self.rounds, "samples": self.samples, "duplicates": self.duplicates,
                             "recoveries": self.recoveries, "started": self.started, "last_round": self.last_round,
                             "ledger": self.ledger.to_state(),
                             "epoch_clock": {str(k): v for k, v in self.epoch_clock.items()}})

    def _plan(self, epoch: int) -> list:
        if epoch not in self.expected_cache:
            # two epochs kept: at a boundary the ledger closes the previous one as the next begins
            if len(self.expected_cache) >= 2:
                del self.expected_cache[max(self.expected_cache, key=lambda e: abs(e - epoch))]
            self.expected_cache[epoch] = self.schedule.epoch(epoch)[0]
        return self.expected_cache[epoch]

    def _expected(self, epoch: int, rnd: int, flagged: bool = False) -> set[int]:
        """The units with work in a round; every unit in a checkpoint round."""
        return {u for u, rounds in enumerate(self._plan(epoch)) if flagged or rnd < len(rounds)}

    def _epoch_end(self, epoch: int, rnd: int) -> bool:
        return rnd + 1 >= max(len(r) for r in self._plan(epoch))

    async def execute(self, tup):
        if tup.stream == "replica":
            await self._replica(tup)
        elif tup.stream == "resync":
            if self.adopting is None:
                unit = self.compute_tasks.index(tup["task"])
                self.collector.emit([self.next_step, self.agg.params.copy(), self.unit_states.get(unit)],
                                    stream="direct_params", direct_task=tup["task"])
            self.collector.ack(tup)
        else:
            await self._contribution(tup)

    async def _replica(self, tup):
        self.collector.ack(tup)
        if self.adopting is None:
            return
        self.adopting["replies"][tup["task"]] = (tup["step"], tup["params"])
        if len(self.adopting["replies"]) == len(self.compute_tasks):
            await self._adopt()

    async def tick(self):
        if self.adopting is not None and time.monotonic() - self.adopting["since"] > self.ADOPT_WAIT_S:
            if self.adopting["replies"]:
                await self._adopt()   # some replica died with the old sync bolt: go on with the others
            else:
                self._request_replicas()

    async def _adopt(self):
        replies = self.adopting["replies"]
        step, params = max(replies.values(), key=lambda r: r[0])
        log.warning("sync bolt adopts the parameters of step %d from %d replica(s); outer momentum restarts",
                    step, len(replies))
        self.agg = Aggregator(params, self.agg.plan)
        if self.next_step > step and self.last_round and self.last_round[0] == step:
            # the old sync bolt saved its last combine but died before sending it: undo its count
            _, epoch, n, rnd, units = self.last_round
            self.ledger.record(epoch, rnd, units, 0, delta=-1)
            log.warning("step %d was combined but never delivered; it will be combined again", step)
            self.epoch_samples[epoch] -= n
            self.samples -= n
            self.rounds -= 1
        self.next_step = step
        self.adopting = None
        # replicas behind the newest one catch up before they compute again
        self.collector.emit([self.next_step, self.agg.params.copy()], stream="params")
        for key in sorted(self.pending):   # what arrived while we were rebuilding
            slot = self.pending[key]
            for unit, t in sorted(slot.items()):
                if t["status"] == "applied" or t["step"] < self.next_step:
                    del slot[unit]
                    self._answer_replay(t)
            if not slot:
                del self.pending[key]
        for key in sorted(self.pending):
            await self._maybe_combine(key)

    def _answer_replay(self, tup):
        """A step already combined: complete the tree with the current parameters. If it
        was an epoch's last step, its evaluation and checkpoint may have been lost with a
        worker: send them again (the eval bolt keeps one result per epoch)."""
        self.duplicates += 1
        params = self.agg.params.copy()
        self.collector.emit([self.next_step, params], stream="params", anchors=tup)
        epoch, rnd = tup["epoch"], tup["round"]
        if tup["step"] == self.next_step - 1:
            if self._epoch_end(epoch, rnd):
                self.collector.emit([epoch + 1, tup["step"], params], stream="eval", anchors=tup)
            if tup["checkpoint"]:
                if self.last_checkpoint and self.last_checkpoint[0] == tup["step"]:
                    self.collector.emit(self.last_checkpoint[1], stream="checkpoint", anchors=tup)
                else:
                    log.warning("the checkpoint of step %d was lost with a worker; the previous one stays the "
                                "newest", self.next_step)
        self.collector.ack(tup)

    async def _contribution(self, tup):
        if self.adopting is None and not self.restored and self.next_step == 0 and tup["step"] > 0:
            self.restored = True           # a new sync bolt with no saved state: same recovery
            self._request_replicas()
        key = (tup["epoch"], tup["round"])
        unit = tup["unit"]
        if self.adopting is None and (tup["status"] == "applied" or tup["step"] < self.next_step):
            self._answer_replay(tup)
            return
        slot = self.pending.setdefault(key, {})
        if unit in slot:
            self.duplicates += 1
            self.collector.ack(slot[unit])  # the newer copy replaces the older; its tree is the one left
        slot[unit] = tup
        self.arrived[unit] = time.perf_counter()
        self.bytes_in += tup["vector"].nbytes
        if self.adopting is None:
            await self._maybe_combine(key)

    async def _maybe_combine(self, key):
        slot = self.pending.get(key, {})
        flagged = any(t["checkpoint"] for t in slot.values())
        if not slot or set(slot) < self._expected(*key, flagged):
            return
        tuples = [slot[u] for u in sorted(slot)]
        if any(t["status"] == "applied" or t["step"] != self.next_step for t in tuples):
            del self.pending[key]
            for t in tuples:            # stale after a recovery: answer like replays
                self._answer_replay(t)
            return
        contributions = [Contribution(t["unit"], t["samples"], t["steps"], t["loss_sum"], t["vector"]) for t in tuples]
        done = time.perf_counter()
        for u in slot:
            self.barrier_s[u] = self.barrier_s.get(u, 0.0) + done - self.arrived[u]
        params = await self.ctx.compute(self.agg.combine, contributions, tuples[0]["lr_scale"], tuples[0]["step"])
        del self.pending[key]
        epoch, rnd = key
        self.next_step = tuples[0]["step"] + 1
        self.rounds += 1
        n = sum(c.samples for c in contributions)
        self.samples += n
        self.epoch_samples[epoch + 1] = self.epoch_samples.get(epoch + 1, 0) + n
        plan = self._plan(epoch)
        worked = [t["unit"] for t in tuples if rnd < len(plan[t["unit"]])]
        for done in [e for e in self.ledger.open if e < epoch + 1]:
            self.ledger.close(done, self._plan(done - 1))   # a later epoch began: it can no longer change
        self.ledger.record(epoch + 1, rnd, worked, max(len(r) for r in self._plan(epoch)))
        self.last_round = (tuples[0]["step"], epoch + 1, n, rnd, worked)
        loss_sum = sum(c.loss_sum for c in contributions)
        self.loss_history.append(loss_sum / max(n, 1))
        acc = self.epoch_loss.setdefault(epoch + 1, [0.0, 0])
        acc[0] += loss_sum
        acc[1] += n
        self._clock(epoch + 1, n, self._epoch_end(epoch, rnd))
        self.unit_states = {}
        out = params.copy()  # receivers in this process share the array: never hand out the live one
        self.collector.emit([self.next_step, out], stream="params", anchors=tuples)
        self.bytes_out += out.nbytes * len(self.compute_tasks)
        end = self._epoch_end(epoch, rnd)
        if end:
            self.collector.emit([epoch + 1, tuples[0]["step"], out], stream="eval", anchors=tuples)
        if flagged:
            values = [epoch + 1 if end else epoch, self.next_step, out,
                      self._checkpoint_state(tuples, (epoch + 1, 0) if end else (epoch, rnd + 1))]
            self.last_checkpoint = (tuples[0]["step"], values)
            self.collector.emit(values, stream="checkpoint", anchors=tuples)
        self._save()
        for t in tuples:
            self.collector.ack(t)
        now = time.perf_counter()
        if now - self._published > 0.5:
            self._publish_progress(epoch, rnd)
            self._published = now

    def _clock(self, epoch: int, samples: int, ends: bool) -> None:
        """An epoch runs from the end of the one before (or the start of this run) to its
        last combine."""
        if epoch not in self.epoch_clock:
            before = [c["to"] for e, c in self.epoch_clock.items() if e < epoch and "to" in c]
            self.epoch_clock[epoch] = {"from": max(before, default=self.started), "samples": 0}
        c = self.epoch_clock[epoch]
        c["samples"] += samples
        if ends:
            c["to"] = time.time()

    def _checkpoint_state(self, tuples, position) -> dict:
        """Everything besides the parameters that the run needs to continue exactly."""
        return {"position": {"epoch": position[0], "round": position[1], "step": self.next_step},
                "outer": self.agg.state(),
                "units": {str(t["unit"]): t["unit_state"] for t in tuples if t["unit_state"] is not None},
                "counters": {"epoch_samples": {str(k): v for k, v in self.epoch_samples.items()},
                             "ledger": self.ledger.to_state(),
                             "rounds": self.rounds, "samples": self.samples},
                "config": self.config["run"]}

    def _publish_progress(self, epoch, rnd):
        elapsed = time.perf_counter() - self.t0
        plan = self.expected_cache.get(epoch) or []
        self.ctx.publish("progress", {"epoch": epoch + 1, "round": rnd + 1, "rounds": self.rounds,
                                      "epoch_rounds": max((len(r) for r in plan), default=0),
                                      "samples": self.samples, "loss": self.loss_history[-1],
                                      "samples_per_s": (self.samples - self.samples_before) / elapsed
                                      if elapsed else 0.0})

    def close(self):
        finished = {e: n for e, n in self.epoch_samples.items() if n >= self.train_size or e < max(self.epoch_samples, default=0)}
        for e in finished:
            self.ledger.close(e, self._plan(e - 1))
        self.ctx.publish("stats", {"sync_rounds": self.rounds, "samples_processed": self.samples,
                                   "samples_this_run": self.samples - self.samples_before,
                                   "duplicates": self.duplicates, "bytes_received": self.bytes_in,
                                   "bytes_sent": self.bytes_out, "refused": len(self.agg.refused),
                                   "recoveries": self.recoveries,
                                   "epoch_samples": {str(e): n for e, n in self.epoch_samples.items()},
                                   "each_sample_counted_once": all(n == self.train_size and self.ledger.clean(e)
                                                                   for e, n in finished.items()),
                                   "miscounted": self.ledger.report(lambda e: self._plan(e - 1)),
                                   "barrier_s": {str(k): v for k, v in self.barrier_s.items()},
                                   "epoch_train_loss": {str(e): l / max(n, 1) for e, (l, n) in self.epoch_loss.items()},
                                   "epoch_clock": {str(e): c for e, c in self.epoch_clock.items()},
                                   "num_params": int(self.agg.params.size),
                                   "resumed_from_step": self.resumed_from,
                                   "quarantined": dataset_for(self.cfg).quarantined,
                                   "wall_s": time.perf_counter() - self.t0, "started": self.started})
        self.ctx.publish("params", self.agg.params if self.agg.params.nbytes <= 512 << 10 else None)


class EvalBolt(Bolt):
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        self.ds = dataset_for(self.cfg)
        self.model = make_model(self.cfg, self.ds.num_classes)
        self.history: list[dict] = []

    def restore(self, state):
        self.history = list(state)

    def _evaluate(self, params):
        self.model.set_params(params)
        return evaluate(self.model, self.ds, self.ds.test, self.cfg.data.test_limit)

    async def execute(self, tup):
        acc, loss = await self.ctx.compute(self._evaluate, tup["params"])
        self.history = [h for h in self.history if h["epoch"] != tup["epoch"]]  # a recomputed epoch end
        self.history.append({"epoch": tup["epoch"], "step": tup["step"], "test_accuracy": acc, "test_loss": loss,
                             "time": time.time()})
        self.ctx.save_state(self.history)   # survives this worker
        self.ctx.publish("history", self.history)
        self.collector.ack(tup)


class CheckpointBolt(Bolt):
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.dir = self.config.get("dir")
        self.errors = 0
        self.last = None

    async def execute(self, tup):
        if self.dir:
            from .checkpoint import CheckpointError, write_checkpoint
            try:
                pointer = await self.ctx.compute(write_checkpoint, self.dir, self.ctx.topology, tup["step"],
                                                 tup["params"], tup["state"])
                pointer["epoch"] = tup["epoch"]
                self.ctx.put_checkpoint(pointer)
                self.last = pointer
            except CheckpointError as e:
                self.errors += 1
                log.error("checkpoint failed, training goes on with the previous one: %s", e)
        self.collector.ack(tup)

    def close(self):
        self.ctx.publish("checkpoints", {"last": self.last, "errors": self.errors})
