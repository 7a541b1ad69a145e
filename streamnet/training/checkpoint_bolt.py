"""The checkpoint bolt: writes each checkpoint round's state (checkpoint.py) and
records the pointer in the coordinator. The sync tasks send their slices of the
parameters and of the state; one complete checkpoint is written from all of them."""
from __future__ import annotations

import asyncio
import logging

from ..runtime import Bolt, CoordinatorError
from .run_stats import CheckpointReport
from .slices import Gather, joined, merge_checkpoint_states, slice_index
from ..runtime.values import whole

log = logging.getLogger(__name__)


class CheckpointBolt(Bolt):
    """Without a directory it writes nothing (the topology's shape does not depend on
    it) but still gathers, acks and keeps its account. Its account (the last
    checkpoint, the errors, the newest step gathered whole) is saved in the coordinator
    after each checkpoint round, so that an instance started anew reports the run's
    last checkpoint and acks at once a slice that a replay sends again of a step
    written before it. The first checkpoint of a step stands: a step that a new sync
    task combined again (its predecessor died after saving it, before sending it) is
    not written again."""
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.dir, self.keep = self.config.get("dir"), self.config.get("keep")
        if not (self.dir is None or isinstance(self.dir, str) and self.dir):
            raise ValueError(f"checkpoint dir must be a path; got {self.dir!r}")
        if self.dir:
            from .checkpoint import check_under_root
            check_under_root(self.dir)      # refused when the task starts, not at each checkpoint round
        if not (self.keep is None or whole(self.keep) and self.keep >= 0):
            # written and renamed, then clean_up's TypeError failed the round's tuples,
            # whose replay wrote it again: a checkpoint round that never completed
            raise ValueError(f"checkpoint keep must be a whole number >= 0 (0 keeps all); got {self.keep!r}")
        self.errors = 0
        self.last = None
        self.gather = Gather(len(ctx.component_tasks("sync")))

    def restore(self, state):
        self.last, self.errors, self.gather.done = state["last"], state["errors"], state["done"]

    async def execute(self, tup):
        problem = slice_index(tup["slice"], self.gather.slices)
        if problem:
            log.warning("checkpoint bolt refuses a part of the checkpoint of step %s: %s", tup["step"], problem)
            self.collector.fail(tup)
            return
        parts, finished = self.gather.add(tup["step"], tup["slice"], tup)
        if finished is not None:
            self.collector.ack(finished)       # a replay sent this slice again
        if parts is None:
            return
        if self.dir:
            from functools import partial

            from .checkpoint import DEFAULT_KEEP, CheckpointError, write_checkpoint
            try:
                write = partial(write_checkpoint, keep=DEFAULT_KEEP if self.keep is None else self.keep)
                state = merge_checkpoint_states([t["state"] for t in parts])
                pointer = await self.ctx.compute(write, self.dir, self.ctx.topology, tup["step"],
                                                 joined([t["params"] for t in parts]), state)
                pointer["epoch"] = tup["epoch"]
            except CheckpointError as e:
                self.errors += 1
                log.error("checkpoint failed, training goes on with the previous one: %s", e)
            else:
                self.last = pointer
                try:       # off the event loop: a coordinator in trouble held the worker's loop
                    await asyncio.to_thread(self.ctx.put_checkpoint, pointer)
                except CoordinatorError as e:   # written, not recorded: a resume checks files against the record
                    self.errors += 1
                    log.error("checkpoint %s written but not recorded in the coordinator (training goes on): %s",
                              pointer["path"], e)
        stale = self.gather.finish(tup["step"])
        try:
            await self.ctx.save_state_async({"last": self.last, "errors": self.errors, "done": self.gather.done})
        except CoordinatorError as e:   # the checkpoint is written and recorded: training goes on
            log.warning("checkpoint bolt could not save its account of step %s: %s", tup["step"], e)
        for t in parts + stale:
            self.collector.ack(t)

    def close(self):
        self.ctx.publish("checkpoints", CheckpointReport(last=self.last, errors=self.errors).to_dict())
