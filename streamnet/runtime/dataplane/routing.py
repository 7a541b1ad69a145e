"""Where a message goes: pure decisions from a message and one worker's view of the
topology's assignment, tested on plain data (tests/unit/test_routing.py).

The assignment changes under running tuples (a worker dies, a task moves, a
rebalance), and workers apply a new version at different moments; every case
below is one that happened in a fault test:

- a tuple from a sender on a NEWER assignment, for a task that this worker does
  not run yet, is PARKED until the worker applies that version (the task is about
  to start here);
- a tuple that cannot reach its task (sent on an older view while the task moved)
  FAILS ITS TREES, so the spouts replay them at once rather than after
  message_timeout_s - without this, a replayed round's contribution reached the
  sync bolt's old host and the round waited 300 s;
- a tuple from a task instance that an assignment at least as new as the sender's
  places elsewhere is STALE: the sender was cut off and has not caught up; it must
  not reach the topology (fencing of the data plane).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..messages import DATA, DataMsg, DataRun, FailMsg, Message
from .acker import root_task

DELIVER = "deliver"        # to the local executor of the target task
SEND = "send"              # over the link to the worker that runs the target task
PARK = "park"              # hold until this worker applies a newer assignment
FAIL_ROOTS = "fail-roots"  # undeliverable: fail the trees it belongs to (replayed at once)
STALE = "stale"            # from a superseded task instance: drop, count and log


@dataclass(frozen=True)
class View:
    """What one worker knows of one topology when a message comes."""
    me: str
    version: int                                   # the assignment version applied here (-1: none yet)
    local: frozenset[int]                          # tasks with an executor on this worker
    task_worker: Mapping[int, str]                 # task -> worker, by that assignment
    addresses: Mapping[str, str] = field(default_factory=dict)   # worker -> URL


def inbound(msg: Message, view: View, sender: str | None) -> str:
    """A message received from worker `sender` (None: from this worker)."""
    if msg.target not in view.local:
        if isinstance(msg, DATA) and msg.newer_than(view.version):
            return PARK
        return FAIL_ROOTS
    if isinstance(msg, DATA) and sender is not None and is_stale(msg, view, sender):
        return STALE
    return DELIVER


def is_stale(msg: DataMsg | DataRun, view: View, sender: str) -> bool:
    placed = view.task_worker.get(msg.source)
    if placed is None or placed == sender or msg.version is None or msg.newer_than(view.version):
        return False
    return True


def outbound(msg: Message, view: View) -> str:
    """A message emitted by a task on this worker, for task msg.target."""
    if msg.target in view.local:
        return DELIVER
    peer = view.task_worker.get(msg.target)
    if peer == view.me and isinstance(msg, DataMsg):
        return PARK          # ours in the assignment being applied, not started yet
    if peer is None or peer == view.me or peer not in view.addresses:
        return FAIL_ROOTS    # assignment in flux
    return SEND


def parked(msg: DataMsg | DataRun, view: View) -> str:
    """A parked tuple, looked at again after an assignment was applied."""
    if msg.target in view.local:
        return DELIVER
    if msg.newer_than(view.version):
        return PARK
    return FAIL_ROOTS


def failures(msg: Message, view: View) -> list[FailMsg]:
    """The FailMsg for each tree an undeliverable tuple belongs to, addressed to spout
    tasks that run here or on a known worker (by then every worker routes by the new
    assignment). Acks and fails themselves are not failed again."""
    if not isinstance(msg, DATA):
        return []
    out = []
    for root in dict.fromkeys(msg.roots()):     # a run may hold several tuples of one tree
        task = root_task(root)
        if task in view.local or view.task_worker.get(task) not in (None, view.me):
            out.append(FailMsg(msg.topology, task, root))
    return out
