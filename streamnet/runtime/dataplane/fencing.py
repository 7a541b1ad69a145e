"""Fencing: at most one live instance of a task acts on its state and its tuples.

Each new instance of a task claims its saved state with a versioned write, and
every save is compare-and-set on that version; an older instance (on a worker
that was paused or cut off and came back) fails its next save with FencedError
and stops without acking or publishing. What it held is failed for replay at
once, and what was queued for it goes to its successor on this worker, if any.
(The data-plane half - tuples from a superseded instance are dropped as stale -
is a routing decision: routing.py. It sees remote tuples only, and only once the
receiver's worker knows of the new assignment; for what must never be taken from a
superseded sender, the claim's version is also the instance's fencing token,
`Context.generation`, which a task can send with what it emits for its receivers
to check: training's sync tasks do, with the parameters.)
"""
from __future__ import annotations

import asyncio
import copy
import logging

from ..control.coordinator import BadVersionError, ConnectionLostError, NodeExistsError, retry_while_lost

log = logging.getLogger(__name__)

#: how long a new instance waits for the coordinator to come back before giving up
#: on claiming its state (the task cannot start without it)
CLAIM_DEADLINE_S = 120.0


class FencedError(Exception):
    """This task instance was superseded by another (its state was claimed since)."""


def state_key(ex) -> str:
    return f"{ex.cid}.{ex.ctx.task_index}"


async def claim_state(rt, ex) -> None:
    """Load the task's last state and take ownership of it: rewriting it bumps the
    version, so an older instance still running somewhere fails its next save and
    stops - it is fenced. The task cannot start without it: a lost coordinator is
    waited for (up to CLAIM_DEADLINE_S)."""
    state, key = rt.worker.state, state_key(ex)

    def claim():
        while True:
            value, version = state.load_state(rt.name, key)
            try:
                # write it back (or create it empty): an instance that loaded it before us
                # now fails its next save, even a first one
                return value, state.save_state(rt.name, key, value, version)
            except (BadVersionError, NodeExistsError):
                continue     # another instance claimed it between our read and write: read again
    ex.restored, ex.state_version = await asyncio.to_thread(
        retry_while_lost, claim, CLAIM_DEADLINE_S, what=f"claim the state of {key} on worker {rt.worker.id}",
        give_up=lambda: rt.worker.closing)
    ex.ctx.generation = ex.state_version    # every claim writes the node: later instances, larger versions


def save_state(rt, ex, value) -> None:
    """Compare-and-set on the version this instance owns; FencedError if another
    instance claimed the state since."""
    key = state_key(ex)
    try:
        _settle_unsettled(rt, ex)
        try:
            ex.state_version = rt.worker.state.save_state(rt.name, key, value, ex.state_version)
        except ConnectionLostError:
            _unsettled(ex, value)
            raise
    except (BadVersionError, NodeExistsError):
        raise _fenced(rt, key) from None


async def save_state_async(rt, ex, value) -> None:
    """save_state for a task on the event loop, with no thread waiting for the
    coordinator's answer: the sync bolt saves every round, and a ZooKeeper write 9 ms
    after the last (as between LeNet-5 rounds) took 1.6 ms through a thread against
    1.2 ms this way (medians, one core, idle machine)."""
    if ex.state_version < 0 or ex.unsettled is not None:   # not claimed yet (never while running), or see
        await asyncio.to_thread(save_state, rt, ex, value)  # _settle_unsettled
        return
    state, key = rt.worker.state, state_key(ex)
    try:
        try:
            version = await asyncio.wrap_future(state.save_state_async(rt.name, key, value, ex.state_version))
        except ConnectionLostError:     # may have been applied: look, as save_state does
            try:
                version = await asyncio.to_thread(state.settle_state, rt.name, key, value, ex.state_version)
            except ConnectionLostError:
                _unsettled(ex, value)
                raise
    except (BadVersionError, NodeExistsError):
        raise _fenced(rt, key) from None
    ex.state_version = version


def _unsettled(ex, value) -> None:
    """Remember a save whose fate the coordinator did not tell (a copy of the value as
    written, whatever the caller does with it after), for _settle_unsettled."""
    ex.unsettled = (copy.deepcopy(value), ex.state_version)


def _settle_unsettled(rt, ex) -> None:
    """A save whose connection dropped, and that could not be settled while the save
    waited (the coordinator away longer), may yet have been applied: find out before
    the next save, or this instance would take its own write for another instance's
    and fence itself. Not applied, it is written now (the next save replaces it)."""
    if ex.unsettled is not None:
        value, version = ex.unsettled
        ex.state_version = rt.worker.state.settle_state(rt.name, state_key(ex), value, version)
        ex.unsettled = None


def _fenced(rt, key: str) -> FencedError:
    return FencedError(f"task {key} of {rt.name} was taken over by another instance; this one "
                       f"(on worker {rt.worker.id}) stops without saving or acking")


async def restart_fenced(rt, old) -> None:
    """A task instance here was fenced. Normally a newer instance runs elsewhere; but
    if the assignment in the coordinator still places the task here, this worker
    lost a race with an older instance and must run the task again."""
    try:
        assignment, _ = await asyncio.to_thread(rt.worker.state.assignment, rt.name)
    except Exception as e:  # noqa: BLE001 - coordinator away: the next assignment event decides
        log.warning("%s: cannot check where task %d belongs: %s", rt.name, old.task, e)
        await hand_over_queue(rt, old)
        return
    if assignment is None or assignment.worker_of(old.task) != rt.worker.id:
        await hand_over_queue(rt, old)     # it runs elsewhere: what waited here is replayed
        return
    async with rt.lock:
        if rt.executors.get(old.task) is not old:
            return
        log.warning("%s: task %d was fenced but the assignment places it here; starting it again",
                    rt.name, old.task)
        ex = rt.make_executor(old.task)
        await claim_state(rt, ex)
        rt.executors[old.task] = ex
        rt.refresh_view()
        await hand_over_queue(rt, old)
        ex.start()


async def hand_over_queue(rt, old) -> None:
    """The tuples queued for a fenced bolt instance, or one whose task ended (also those
    that reach its queue later), go to its successor on this worker, or are failed so
    their spouts replay them."""
    if old.kind != "bolt":      # (by kind, not class: executor.py imports this module)
        return
    new = rt.executors.get(old.task)
    if new is not None and new.kind == "bolt" and new is not old:
        queued = old.take_queue()
        # at once, behind what is in the new queue's overflow: a put that waited for
        # room would let tuples arriving meanwhile from the same sources go first
        new.inbound.spill(queued)
        what = "handed to the new instance"
    else:
        queued = await old.fail_queue()
        what = "failed for replay"
    if queued:
        log.info("%s: task %d: %d tuple(s) queued for the instance that stopped %s", rt.name, old.task,
                 len(queued), what)
