"""The evaluation bolt: test accuracy and loss of the parameters at each epoch's end."""
from __future__ import annotations

import time

from ..runtime import Bolt
from .config import run_config_from_dict
from .evaluate import evaluate
from .run_stats import Evaluation
from .schedule import dataset_for, make_model


class EvalBolt(Bolt):
    """Keeps one result per epoch (a replayed epoch end is evaluated again and replaces
    the first), saved in the coordinator so that it survives this worker, and
    published as `eval.0.history` after each evaluation and when the topology ends."""
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
        self.history.append(Evaluation(epoch=tup["epoch"], step=tup["step"], test_accuracy=acc, test_loss=loss,
                                       time=time.time()).to_dict())
        self.ctx.save_state(self.history)   # survives this worker
        self.ctx.publish("history", self.history)
        self.ctx.figure("training_test_accuracy", acc, help="Test accuracy after the last evaluated epoch")
        self.ctx.figure("training_test_loss", loss, help="Test loss after the last evaluated epoch")
        self.ctx.figure("training_evaluated_epoch", tup["epoch"], help="The last evaluated epoch (1-based)")
        self.collector.ack(tup)

    def close(self):
        # a run stopped before its first epoch's end has evaluated nothing: say so, so
        # that an absent history is an error for the summary rather than "no epochs"
        self.ctx.publish("history", self.history)
