"""Storm's acker, kept by each spout task for its own tuple trees.

A spout emit with a msg_id starts a tree with a random root id (the spout's task
id in the top 16 bits, so an ack finds its way home); every edge of the tree has a
random 64-bit id; acking a tuple XORs its edge with the edges of the tuples
anchored to it into the root's ledger. The ledger reaches zero exactly when every
tuple of the tree was acked. A tree not complete within message_timeout_s expires;
one pending for half of it is reported once before (`stalled`), since the
timeout can be minutes long and a tuple lost on the way would otherwise show
nothing until then.
"""
from __future__ import annotations

import time

ROOT_BITS = 48


def root_task(root: int) -> int:
    """The spout task that keeps the ledger of tree `root`."""
    return root >> ROOT_BITS


class _Tree:
    __slots__ = ("ledger", "deadline", "msg_id", "reported")

    def __init__(self, ledger: int, deadline: float, msg_id):
        self.ledger, self.deadline, self.msg_id = ledger, deadline, msg_id
        self.reported = False


class Acker:
    """The pending trees of one spout task: root -> XOR ledger, deadline, msg_id.
    Each method returns the msg_ids whose trees it ended, for the spout's ack/fail."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._trees: dict[int, _Tree] = {}

    def __len__(self) -> int:
        return len(self._trees)

    def start(self, root: int, ledger: int, msg_id) -> None:
        self._trees[root] = _Tree(ledger, time.monotonic() + self.timeout_s, msg_id)

    def ack(self, root: int, xor: int):
        """XOR into the ledger; the msg_id if the tree is now complete, else None."""
        tree = self._trees.get(root)
        if tree is None:
            return None     # already timed out or failed
        tree.ledger ^= xor
        if tree.ledger == 0:
            del self._trees[root]
            return tree.msg_id
        return None

    def fail(self, root: int):
        """The msg_id of the failed tree, or None if it was no longer pending."""
        tree = self._trees.pop(root, None)
        return None if tree is None else tree.msg_id

    def fail_all(self) -> list:
        ids = [t.msg_id for t in self._trees.values()]
        self._trees.clear()
        return ids

    def stalled(self, after_s: float) -> list:
        """The msg_ids of trees pending for more than `after_s`, each named once."""
        now, out = time.monotonic(), []
        for t in self._trees.values():
            if not t.reported and now - (t.deadline - self.timeout_s) > after_s:
                t.reported = True
                out.append(t.msg_id)
        return out

    def expire(self) -> list:
        """The msg_ids of trees past their deadline, removed."""
        now = time.monotonic()
        expired = [r for r, t in self._trees.items() if t.deadline <= now]
        return [self._trees.pop(r).msg_id for r in expired]
