"""The checkpoint bolt: writes each checkpoint round's state (checkpoint.py) and
records the pointer in the coordinator."""
from __future__ import annotations

import logging

from ..runtime import Bolt
from .run_stats import CheckpointReport

log = logging.getLogger(__name__)


class CheckpointBolt(Bolt):
    """Without a directory it only acks: the topology's shape does not depend on it."""
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.dir = self.config.get("dir")
        self.errors = 0
        self.last = None

    async def execute(self, tup):
        if self.dir:
            from functools import partial

            from .checkpoint import DEFAULT_KEEP, CheckpointError, write_checkpoint
            try:
                write = partial(write_checkpoint, keep=self.config.get("keep", DEFAULT_KEEP))
                pointer = await self.ctx.compute(write, self.dir, self.ctx.topology, tup["step"],
                                                 tup["params"], tup["state"])
                pointer["epoch"] = tup["epoch"]
                self.ctx.put_checkpoint(pointer)
                self.last = pointer
            except CheckpointError as e:
                self.errors += 1
                log.error("checkpoint failed, training goes on with the previous one: %s", e)
        self.collector.ack(tup)

    def close(self):
        self.ctx.publish("checkpoints", CheckpointReport(last=self.last, errors=self.errors).to_dict())
