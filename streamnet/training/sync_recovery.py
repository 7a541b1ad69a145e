"""The sync bolt's recovery half: how it gets its parameters back and answers work
it has already combined.

- resuming a stopped run from a checkpoint (`resume`);
- a sync task started anew after its worker died (`restore`, or a first
  contribution ahead of step 0): its counters come back from the coordinator, its
  parameters from the compute units' replicas - it asks every replica for theirs
  and adopts the newest, with the outer momentum reset (logged); if every replica
  has answered and all are older than its counters (all of them started anew with
  it), the updates in between are lost: it goes on from the newest as the counters'
  step, since the spout will not send those steps again (an error in the log, and
  `lost_steps` in the summary);
- a contribution for a step already combined (a replay after a failure) is
  answered with the current parameters, and an epoch end's evaluation and
  checkpoint are sent again, since they may have been lost with a worker;
- a unit whose contribution says it holds a step this task never combined (it
  applied it, or computed it; its replica did not answer in time, and an older one
  was adopted) makes it ask the replicas again: answered as a replay, that unit would
  never contribute to the round again, which would wait for it for ever; and
  counting those rounds lost would drop updates the unit holds;
- a compute unit that missed a broadcast asks (`resync`) and gets the parameters
  sent to it alone;
- the counters are saved every SAVE_EVERY rounds (sync_bolt.py), so a successor may
  find them behind the rounds its predecessor combined: it counts those from the epoch
  plan (`_recount`) - up to the newest replica's step, whose parameters hold their
  updates; and where every replica started anew, up to the step of the work the units
  hold (their resync requests say it), those rounds' updates lost (`lost_steps`).

A mixin over the SyncBolt's state (sync_bolt.py holds the receiving and combining
half): the two halves share the aggregator, the counters and the pending rounds.
With S sync tasks each recovers its own slice: from the checkpoint's vector, or
from the replicas' copies of that slice.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .. import kernels as K
from .bp import Aggregator
from .slices import slice_of_outer_state
from .streams import APPLIED, DIRECT_PARAMS, EVAL, PARAMS, STATE_REQUEST, row
from ..runtime.values import whole

log = logging.getLogger(__name__)


def vector_problem(v, size: int, finite: bool = True) -> str | None:
    """Why `v` cannot be one of the model's flat vectors (float32, `size` values and,
    with `finite`, no inf/NaN), or None if it can. Every vector that arrives in a tuple
    (contributions, parameters, replicas) passes here before a kernel sees it: the
    kernels index without bounds checks, so a wrongly sized one would write past its
    arrays and take the whole worker down."""
    if not isinstance(v, np.ndarray):
        return f"a {type(v).__name__}, not an array"
    if v.dtype != np.float32:
        return f"dtype {v.dtype}, not float32"
    if v.shape != (size,):
        return f"shape {v.shape}, not ({size},)"
    if finite and not K.all_finite(v):
        return "non-finite values"
    return None


def _steps(first: int, n: int) -> str:
    """"step 4 was" / "steps 4-6 were"."""
    return f"step {first} was" if n == 1 else f"steps {first}-{first + n - 1} were"


@dataclass
class Adoption:
    """Replica replies collected while a new sync task rebuilds its parameters."""
    since: float                                   # time.monotonic() of the request
    replies: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)   # task -> (step, params)

    def newest(self) -> tuple[int, np.ndarray]:
        """The replica of the latest step (the first to arrive among equals)."""
        return max(self.replies.values(), key=lambda r: r[0])


class SyncRecovery:
    ADOPT_WAIT_S = 5.0    # replicas that have not replied by then died with the old sync task
    # a unit's requests for parameters within this of the answer it was sent, for the same
    # step, are answered by it: requests that queued while this task waited (a save waiting
    # for the coordinator; a unit asks every compute_bolt RESYNC_S) each cost a copy of the
    # parameters sent (AlexNet-64: 31 MB); a unit that lost the answer asks again later
    RESYNC_ANSWERED_S = 1.0

    def prepare_recovery(self) -> None:
        self.adoption: Adoption | None = None
        self.restored = False
        self.last_checkpoint = None   # (step, checkpoint tuple values), to send again if its round is replayed
        self.unit_states: dict[int, dict] = {}   # from the checkpoint resumed, for the units' first resync
        self._answered: dict[object, tuple[int, float]] = {}   # task -> (step, monotonic) of its last `_resync` answer
        # every replica started anew with this task and the counters may be behind the data
        # spout (rounds combined after the last save): until its first combine, the units'
        # resync requests say where the spout is (`_resync`)
        self.behind_spout = False

    def resume(self, where: dict) -> None:
        """Continue a stopped run from the checkpoint `where` (nsmap.resume_point) points at."""
        from .checkpoint import CheckpointError, load_checkpoint
        ck = load_checkpoint(where["path"], where.get("sha256"))
        if ck["params"].size != self.num_params:
            # a model of the same name that is not the same model (a dataset with more
            # classes, another version): the units would refuse every parameter tuple
            raise CheckpointError(f"{where['path']} holds {ck['params'].size} parameters; "
                                  f"{self.cfg.model.name} on this dataset has {self.num_params}")
        st = ck["state"]
        self.agg = Aggregator(ck["params"][self.lo:self.hi], self.agg.plan)
        self.agg.set_state(slice_of_outer_state(st["outer"], self.lo, self.hi))
        self.counts.resume(ck["step"], st["counters"])
        if self.slice == 0:     # the units' states travel with slice 0
            self.unit_states = {int(k): v for k, v in st["units"].items()}
        log.warning("sync bolt resumes from %s at step %d", where["path"], self.counts.next_step)

    def restore(self, state):
        """Counters survive in the coordinator; parameters come back from the replicas."""
        self.restored = True
        self.unit_states = {}
        self.counts.restore(state)
        self._request_replicas()

    def _request_replicas(self) -> None:
        log.warning("sync task of slice %d starting over at step %d: asking the %d replicas for their parameters",
                    self.slice, self.counts.next_step, len(self.compute_tasks))
        self.adoption = Adoption(since=time.monotonic())
        self.collector.emit(row(STATE_REQUEST, nonce=time.time_ns(), slice=self.slice,
                                generation=self.ctx.generation), stream="state_request")

    def _maybe_new(self, tup) -> None:
        """A sync task with no saved state that gets work past step 0 replaced one that
        died before it saved: the same recovery as a restore."""
        if self.adoption is None and not self.restored and self.counts.next_step == 0 and tup["step"] > 0:
            self.restored = True
            self._request_replicas()

    async def _resync(self, tup) -> None:
        """A compute unit asks for the current parameters (it is new, or missed them).
        Where every replica started anew with this task, its request names the step of
        the earliest work it holds (and none for its parameters' step): the data spout
        is there, and sends the rounds before it no more (compute_bolt `_ask_for_params`)."""
        if self.adoption is None and self.behind_spout and self._unsaved(tup["step"]):
            await self._count_lost(tup["step"], f"task {tup['task']!r} holds the data spout's work of step "
                                                f"{tup['step']}, the replicas were started anew")
        now, step = time.monotonic(), self.counts.next_step
        last = self._answered.get(tup["task"])
        if self.adoption is None and not (last and last[0] == step and now - last[1] < self.RESYNC_ANSWERED_S):
            unit = self.compute_tasks.index(tup["task"])
            self.collector.emit(row(DIRECT_PARAMS, step=step, slice=self.slice,
                                    params=self.agg.params.copy(), unit_state=self.unit_states.get(unit),
                                    generation=self.ctx.generation),
                                stream="direct_params", direct_task=tup["task"])
            self._answered[tup["task"]] = (step, now)
        self.collector.ack(tup)

    async def _replica(self, tup) -> None:
        self.collector.ack(tup)
        if self.adoption is None:
            return
        problem = vector_problem(tup["params"], self.agg.params.size)
        if tup["slice"] != self.slice:
            problem = f"slice {tup['slice']!r}, not {self.slice}"
        if not (whole(tup["step"]) and tup["step"] >= 0):     # newest() compares them: a TypeError on every tick
            problem = f"step {tup['step']!r} is not a whole number >= 0"
        if problem:
            log.warning("sync bolt refuses the replica of task %s (step %s): %s", tup["task"], tup["step"], problem)
            return
        self.adoption.replies[tup["task"]] = (tup["step"], tup["params"])
        if len(self.adoption.replies) == len(self.compute_tasks):
            await self._adopt()

    async def tick(self):
        if self.adoption is not None and time.monotonic() - self.adoption.since > self.ADOPT_WAIT_S:
            newest = self.adoption.newest()[0] if self.adoption.replies else None
            # some replica died with the old sync bolt: go on with the others - unless that
            # would uncount rounds: a unit that never heard this instance's request (it died,
            # or the request was lost) could still take those rounds from the instance this
            # one superseded, which may send one a round after saving its count (sync_bolt
            # `_save_ahead`); its new instance, or the request made again, answers
            if newest is not None and self._lost_by(newest) == 0 and not self._undone(newest):
                await self._adopt()
            else:
                self._request_replicas()   # none, or only older ones: a replica that holds them may yet answer

    def _undone(self, step: int) -> int:
        """How many of the last combines the newest replica's `step` says were counted
        and saved but never delivered (0, 1 or 2): the old sync task died after saving
        them and before their parameters reached any unit - or, for the round after the
        one it sent, before that round even came (it saves that round's count ahead,
        sync_bolt.py). Not down to step 0: a replica started anew holds the seeded
        parameters of step 0 too, so there the replicas cannot tell whether that first
        combine reached them (if it did, going back would leave every unit waiting for a
        step the spout has passed; if not, its update is lost - logged)."""
        n = self.counts.next_step - step
        recent = self.counts.recent
        if step <= 0 or not 0 < n <= len(recent):
            return 0
        return n if [r.step for r in recent[-n:]] == list(range(step, step + n)) else 0

    def _unsaved(self, step) -> int:
        """How many rounds a predecessor may have combined past this task's count if a
        unit holds parameters (or work) of `step`: 0 if it is not ahead, or further
        ahead than the rounds between two saves (and a round sent ahead)."""
        if not whole(step):
            return 0
        n = step - self.counts.next_step
        return n if 0 < n <= self.SAVE_EVERY + 1 else 0

    def _recount(self, upto: int) -> int:
        """Count the rounds from the next step up to step `upto` as the epoch plan has
        them: rounds a predecessor combined and sent after its counters were last saved
        (it saves at once any round not as planned: sync_bolt `_must_save`). Returns how
        many; 0 where their place in the plan is unknown (the counters hold no round and
        are past step 0)."""
        n, last = self._unsaved(upto), self.counts.last_round
        if (last.step != self.counts.next_step - 1) if last is not None else self.counts.next_step != 0:
            return 0
        e, r = self.plans.next_round(last.epoch - 1, last.round) if last is not None else (0, 0)
        rounds = []
        for _ in range(n):
            if e >= self.cfg.epochs:
                return 0
            rounds.append((e, r))
            e, r = self.plans.next_round(e, r)
        for e, r in rounds:
            samples, worked = self.plans.planned(e, r)
            self.counts.count_round(self.plans, self.counts.next_step, e, r, samples, worked)
        return len(rounds)

    async def _count_lost(self, upto: int, why: str) -> None:
        """The rounds up to step `upto` were combined by a predecessor and are in no
        parameters this task holds: count their samples (the spout will not send them
        again) and their updates as lost; save the count."""
        first = self.counts.next_step
        n = self._recount(upto)
        if not n:
            log.error("sync task of slice %d: %s, and the rounds from step %d cannot be counted from the epoch "
                      "plan: they stay uncounted", self.slice, why, first)
        else:
            self.counts.lost_steps += n
            log.error("sync task of slice %d: %s; %s combined after the counters were saved and their updates are "
                      "lost: counted from the epoch plan, training goes on from step %d", self.slice, why,
                      _steps(first, n), self.counts.next_step)
            await self._start_save()

    def _lost_by(self, step: int) -> int:
        """The combined steps whose updates adopting the parameters of `step` loses."""
        return 0 if self._undone(step) else max(0, self.counts.next_step - step)

    async def _adopt(self) -> None:
        step, params = self.adoption.newest()
        log.warning("sync task of slice %d adopts the parameters of step %d from %d replica(s); outer momentum "
                    "restarts", self.slice, step, len(self.adoption.replies))
        self.agg = Aggregator(params, self.agg.plan)
        undone = self._undone(step)
        if step > self.counts.next_step:
            first, n = self.counts.next_step, self._recount(step)
            if n:
                log.warning("sync task of slice %d: %s combined after the counters it restored were saved; "
                            "counted from the epoch plan", self.slice, _steps(first, n))
                await self._start_save()
            else:
                log.error("sync task of slice %d: a replica holds step %d, the counters it restored end at step %d, "
                          "and the rounds between cannot be counted from the epoch plan: they stay uncounted",
                          self.slice, step, first)
        elif undone:
            for _ in range(undone):
                self.counts.undo_last_round()
            log.warning("step(s) %d-%d counted but never delivered; they will be combined again", step,
                        step + undone - 1)
        elif step < self.counts.next_step:
            # every replica that held newer parameters started anew (all units moved with the
            # sync task at once), and every one has answered: the data spout is past those
            # steps and will not send them again, so they cannot be combined anew. Going back
            # to `step` would leave every unit waiting for parameters of a step that never comes
            self.counts.lost_steps += self.counts.next_step - step
            log.error("sync task of slice %d: the updates of steps %d-%d were lost with every replica that held "
                      "them; training goes on from the parameters of step %d as step %d (those rounds' samples "
                      "stay counted)", self.slice, step, self.counts.next_step - 1, step, self.counts.next_step)
            self.behind_spout = True
            await self._start_save()   # a sync task started after this one knows them lost
        self.counts.next_step = max(self.counts.next_step, step)
        # a contribution that arrived meanwhile computed past the count: its replica did not
        # answer again, so the rounds up to it are in no parameters here - counted as lost,
        # before the parameters go out at the step the units will compute next
        computed = [t["step"] for slot in self.pending.values() for t in slot.values()
                    if t["status"] != APPLIED and self._ahead_of_adopted(t)]
        if computed:
            await self._count_lost(min(computed), f"a unit holds the parameters of step {min(computed)}, its "
                                                  "replica did not answer")
        step = self.counts.next_step
        self.adoption = None
        # replicas behind the newest one catch up before they compute again
        self.collector.emit(row(PARAMS, step=step, slice=self.slice, params=self.agg.params.copy(),
                                generation=self.ctx.generation), stream="params")
        # what arrived while we were rebuilding. A unit that applied a step past the adopted
        # one is one whose replica did not answer again: its answer is failed (its work is
        # replayed, and the answer asks again: `_contribution`; answered as a replay, its tree
        # completed and the round waited for it for ever)
        for key in sorted(self.pending):
            slot = self.pending[key]
            for unit, t in sorted(slot.items()):
                if t["status"] == APPLIED and self._ahead_of_adopted(t):
                    del slot[unit]
                    log.warning("sync task of slice %d: unit %d holds a step past %d, its replica did not answer: "
                                "its round is replayed", self.slice, unit, self.counts.next_step)
                    self.collector.fail(t)
                elif t["status"] == APPLIED or t["step"] < self.counts.next_step:
                    del slot[unit]
                    self._answer_replay(t)
            if not slot:
                del self.pending[key]
        for key in sorted(self.pending):
            await self._maybe_combine(key)

    def _ahead_of_adopted(self, tup) -> bool:
        """Whether a unit's contribution says it holds parameters this task never
        combined - a replica that did not answer when this task adopted an older one: it
        answered that it applied the step of `tup` (a unit answers so once it holds a
        later step), or it computed that step past this task's count (within the rounds a
        predecessor may have combined unsaved: `_unsaved`)."""
        if tup["status"] == APPLIED:
            return whole(tup["step"]) and tup["step"] >= self.counts.next_step
        return self._unsaved(tup["step"]) > 0

    def _evaluated_end(self, epoch: int, rnd: int) -> bool:
        """Whether round `rnd` ends an epoch the run evaluates: its combine sends an evaluation."""
        return self.plans.epoch_end(epoch, rnd) and self.cfg.evaluates(epoch + 1)

    def _resends(self, tup) -> bool:
        """Whether answering the replay `tup` sends its round's evaluation or checkpoint
        again (`_answer_replay`)."""
        return tup["step"] == self.counts.next_step - 1 and (
            self._evaluated_end(tup["epoch"], tup["round"])
            or (bool(tup["checkpoint"]) and self.last_checkpoint is not None and self.last_checkpoint[0] == tup["step"]))

    def _answer_replay(self, tup) -> None:
        """A step already combined: complete the tree with the current parameters. If it
        was the last step of an epoch the run evaluates, its evaluation may have been lost
        with a worker, and a checkpoint round's checkpoint too: send them again (the eval
        and checkpoint bolts ack at once a copy of a step they have dealt with)."""
        self.counts.duplicates += 1
        next_step = self.counts.next_step
        params = self.agg.params.copy()
        self.collector.emit(row(PARAMS, step=next_step, slice=self.slice, params=params,
                                generation=self.ctx.generation), stream="params", anchors=tup)
        epoch, rnd = tup["epoch"], tup["round"]
        if tup["step"] == next_step - 1:
            if self._evaluated_end(epoch, rnd):
                self.collector.emit(row(EVAL, epoch=epoch + 1, step=tup["step"], slice=self.slice, params=params),
                                    stream="eval", anchors=tup)
            if tup["checkpoint"]:
                if self.last_checkpoint and self.last_checkpoint[0] == tup["step"]:
                    self.collector.emit(self.last_checkpoint[1], stream="checkpoint", anchors=tup)
                else:
                    log.warning("the checkpoint of step %d was lost with a worker; the previous one stays the "
                                "newest", next_step)
        self.collector.ack(tup)
