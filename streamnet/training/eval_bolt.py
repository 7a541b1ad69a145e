"""The evaluation bolt: test accuracy and loss of the parameters at each epoch's end."""
from __future__ import annotations

import logging
import time

from ..runtime import Bolt, CoordinatorError
from .config import run_config_from_dict
from .evaluate import evaluate
from .run_stats import Evaluation
from .schedule import dataset_for, make_model
from .slices import Gather, joined, slice_index
from .sync_recovery import vector_problem

log = logging.getLogger(__name__)


class EvalBolt(Bolt):
    """Keeps one result per epoch, saved in the coordinator so that it survives this
    worker, and published as `eval.0.history` after each evaluation and when the
    topology ends. The parameters come from the sync tasks in slices, gathered before
    evaluating; the slices' tuples are acked once the evaluation is done. An epoch end
    that a replay sends again after it was evaluated (here or by an instance before
    this one: the history says) is acked at once, not evaluated twice: the first
    evaluation of a step stands."""
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.cfg = run_config_from_dict(self.config["run"])
        self.ds = dataset_for(self.cfg)
        self.model = make_model(self.cfg, self.ds.num_classes)
        self.history: list[dict] = []
        self.gather = Gather(len(ctx.component_tasks("sync")))

    def restore(self, state):
        self.history = list(state)
        self.gather.done = max(((h["epoch"], h["step"]) for h in self.history), default=None)

    def _evaluate(self, params):
        self.model.set_params(params)
        return evaluate(self.model, self.ds, self.ds.test, self.cfg.data.test_limit)

    async def execute(self, tup):
        problem = slice_index(tup["slice"], self.gather.slices)
        if problem:
            log.warning("eval bolt refuses parameters of epoch %s: %s", tup["epoch"], problem)
            self.collector.fail(tup)
            return
        key = (tup["epoch"], tup["step"])
        parts, finished = self.gather.add(key, tup["slice"], tup)
        if finished is not None:
            self.collector.ack(finished)       # a replay sent this slice again
        if parts is None:
            return
        params = joined([t["params"] for t in parts])
        problem = vector_problem(params, self.model.num_params, finite=False)
        if problem:
            log.warning("eval bolt refuses the parameters of epoch %s: %s", tup["epoch"], problem)
            for t in parts:
                self.collector.fail(t)
            return
        acc, loss = await self.ctx.compute(self._evaluate, params)
        self.history = [h for h in self.history if h["epoch"] != tup["epoch"]]  # a recomputed epoch end
        self.history.append(Evaluation(epoch=tup["epoch"], step=tup["step"], test_accuracy=acc, test_loss=loss,
                                       time=time.time()).to_dict())
        try:
            await self.ctx.save_state_async(self.history)   # survives this worker
        except CoordinatorError as e:      # published below all the same; a new instance would not know it
            log.warning("eval bolt could not save the evaluation of epoch %s: %s", tup["epoch"], e)
        self.ctx.publish("history", self.history)
        self.ctx.figure("training_test_accuracy", acc, help="Test accuracy after the last evaluated epoch")
        self.ctx.figure("training_test_loss", loss, help="Test loss after the last evaluated epoch")
        self.ctx.figure("training_evaluated_epoch", tup["epoch"], help="The last evaluated epoch (1-based)")
        for t in parts + self.gather.finish(key):
            self.collector.ack(t)

    def close(self):
        # a run stopped before its first epoch's end has evaluated nothing: say so, so
        # that an absent history is an error for the summary rather than "no epochs"
        self.ctx.publish("history", self.history)
