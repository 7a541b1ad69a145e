"""The evaluation bolt: test accuracy and loss of the parameters at the end of each
epoch the run evaluates (every `eval_every_epochs`-th and the last: RunConfig.evaluates;
the sync tasks send nothing here at the end of the others).

The evaluation is split over the bolt's E tasks (nsmap: one per unit, up to
EVAL_TASKS): task k evaluates shard k of the test set (contiguous: shard_bounds) on
its worker's compute threads, and tasks 1..E-1 send their counts - correct
predictions, summed loss, samples - to task 0 (stream "part", anchored to the slices
they evaluated), which adds them up into the epoch's result. An evaluated epoch's
last round holds its tuple trees until the evaluation is done, and the next epoch's
rounds wait for them: evaluated by one task, 10,000 LeNet-5 test images held both units for
about 265 ms on one core; split over the units' workers, each takes its part of that.
"""
from __future__ import annotations

import logging
import math
import time

from ..nn.parallel import shard_bounds
from ..runtime import Bolt, CoordinatorError
from .config import run_config_from_dict
from .evaluate import evaluate_counts, evaluated_size
from .run_stats import Evaluation
from .schedule import dataset_for, make_model
from .slices import Gather, bounds, joined, slice_index
from .streams import EVAL_PART, row
from ..runtime.values import real, whole
from .sync_recovery import vector_problem

log = logging.getLogger(__name__)

#: a task k > 0 keeps the counts of this many of its last epoch ends, to send them again
#: when a replay brings that epoch end's slices back (task 0 may have lost them)
KEEP_SENT = 4


def _slices_problem(parts: list, size: int) -> str | None:
    """Why the slices of a parameter vector of `size` values (in slice order) cannot be
    joined into it, or None. Each slice is checked against its own bounds: a long slice
    beside a short one would join to the right size with the parameters after it out of
    place."""
    for s, (part, (lo, hi)) in enumerate(zip(parts, bounds(size, len(parts)))):
        problem = vector_problem(part, hi - lo, finite=False)
        if problem:
            return f"slice {s}: {problem}"
    return None


class EvalBolt(Bolt):
    """Task 0 keeps one result per evaluated epoch, saved in the coordinator so that it
    survives its worker, and published as `eval.0.history` after each evaluation and
    when the topology ends. The parameters come from the sync tasks in slices, gathered before
    evaluating; the slices' tuples are acked once the task's shard is evaluated (task
    0: once every task's counts are in). An epoch end that a replay sends again after
    it was evaluated (here or by an instance before this one: task 0's history says) is
    acked at once, not evaluated twice: the first evaluation of a step stands. A task
    k > 0 that evaluated it sends its counts again with the copy, since task 0 may
    have been started anew without them."""
    outputs = {"part": list(EVAL_PART)}

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        self.ds = dataset_for(self.cfg)
        self.model = make_model(self.cfg, self.ds.num_classes)
        self.history: list[dict] = []
        self.gather = Gather(len(ctx.component_tasks("sync")))
        self.tasks = ctx.component_tasks("eval")
        self.index = ctx.task_index
        n = evaluated_size(self.ds.test, self.cfg.data.test_limit)
        # one shard per task, an empty one for a task beyond the samples
        self.shards = shard_bounds(n, len(self.tasks))
        self.shards += [(n, n)] * (len(self.tasks) - len(self.shards))
        self.joins = Gather(len(self.tasks))      # task 0: each task's (counts, tuples) per epoch end
        self.sent: dict[tuple, tuple] = {}        # a task k > 0: epoch end -> the counts it sent

    def restore(self, state):
        self.history = list(state)
        self.gather.done = self.joins.done = max(((h["epoch"], h["step"]) for h in self.history), default=None)

    def _evaluate(self, params):
        self.model.set_params(params)
        return evaluate_counts(self.model, self.ds, self.ds.test, *self.shards[self.index])

    async def execute(self, tup):
        if tup.stream == "part":
            await self._part(tup)
            return
        problem = slice_index(tup["slice"], self.gather.slices)
        if problem:
            log.warning("eval task %d refuses parameters of epoch %s: %s", self.index, tup["epoch"], problem)
            self.collector.fail(tup)
            return
        key = (tup["epoch"], tup["step"])
        parts, finished = self.gather.add(key, tup["slice"], tup)
        if finished is tup and key in self.sent:
            self._send(key, self.sent[key], [tup])  # a replay's copy of an epoch end evaluated here
        if finished is not None:
            self.collector.ack(finished)       # a replay sent this slice again
        if parts is None:
            return
        vectors = [t["params"] for t in parts]
        problem = _slices_problem(vectors, self.model.num_params)
        if problem:
            log.warning("eval task %d refuses the parameters of epoch %s: %s", self.index, tup["epoch"], problem)
            for t in parts:
                self.collector.fail(t)
            return
        counts = await self.ctx.compute(self._evaluate, joined(vectors))
        stale = self.gather.finish(key)
        if self.index == 0:
            await self._join(key, 0, counts, parts)
        else:
            self.sent[key] = counts
            for old in sorted(self.sent)[:-KEEP_SENT]:
                del self.sent[old]
            self._send(key, counts, parts)
            for t in parts:
                self.collector.ack(t)
        for t in stale:
            self.collector.ack(t)

    def _send(self, key, counts, anchors) -> None:
        correct, loss_sum, count = counts
        self.collector.emit(row(EVAL_PART, epoch=key[0], step=key[1], task=self.index, correct=correct,
                                loss_sum=loss_sum, count=count), stream="part", anchors=anchors,
                            direct_task=self.tasks[0])

    def _part_problem(self, tup) -> str | None:
        """Why a part cannot be joined (None: it can)."""
        if self.index != 0:
            return f"it came to eval task {self.index}; parts go to task 0"
        if not all(whole(tup[f]) for f in ("epoch", "step", "task", "correct", "count")):
            return "epoch, step, task, correct and count must be integers"
        k = tup["task"]
        if not 1 <= k < len(self.tasks):
            return f"from task {k}: there are eval tasks 0..{len(self.tasks) - 1}"
        lo, hi = self.shards[k]
        if tup["count"] != hi - lo:
            return f"task {k} counted {tup['count']} samples; its shard has {hi - lo}"
        if not 0 <= tup["correct"] <= tup["count"]:
            return f"{tup['correct']} correct of {tup['count']}"
        loss = tup["loss_sum"]
        if not (real(loss) and math.isfinite(loss) and loss >= 0):
            return f"summed loss {loss!r}: not a finite number >= 0"
        return None

    async def _part(self, tup) -> None:
        problem = self._part_problem(tup)
        if problem:
            log.warning("eval task %d refuses a part of epoch %s's evaluation: %s", self.index, tup["epoch"], problem)
            self.collector.fail(tup)
            return
        await self._join((tup["epoch"], tup["step"]), tup["task"],
                         (tup["correct"], float(tup["loss_sum"]), tup["count"]), [tup])

    async def _join(self, key, k: int, counts, tuples: list) -> None:
        """Task 0: task k's counts of the epoch end `key`; once every task's are in, the
        epoch's result."""
        got, old = self.joins.add(key, k, (counts, tuples))
        if old is not None:                   # a copy replaced, or one of an epoch end joined already
            for t in old[1]:
                self.collector.ack(t)
        if got is None:
            return
        correct, loss_sum, n = (sum(c[i] for c, _ in got) for i in range(3))
        acc, loss = correct / max(n, 1), loss_sum / max(n, 1)
        epoch = key[0]
        self.history = [h for h in self.history if h["epoch"] != epoch]  # a recomputed epoch end
        self.history.append(Evaluation(epoch=epoch, step=key[1], test_accuracy=acc, test_loss=loss,
                                       time=time.time()).to_dict())
        try:
            await self.ctx.save_state_async(self.history)   # survives this worker
        except CoordinatorError as e:      # published below all the same; a new instance would not know it
            log.warning("eval bolt could not save the evaluation of epoch %s: %s", epoch, e)
        self.ctx.publish("history", self.history)
        self.ctx.figure("training_test_accuracy", acc, help="Test accuracy after the last evaluated epoch")
        self.ctx.figure("training_test_loss", loss, help="Test loss after the last evaluated epoch")
        self.ctx.figure("training_evaluated_epoch", epoch, help="The last evaluated epoch (1-based)")
        for _, ts in got + self.joins.finish(key):
            for t in ts:
                self.collector.ack(t)

    def close(self):
        # a run stopped before its first epoch's end has evaluated nothing: say so, so
        # that an absent history is an error for the summary rather than "no epochs"
        if self.index == 0:
            self.ctx.publish("history", self.history)
