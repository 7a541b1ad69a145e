"""Stream groupings: which of a bolt's tasks get each tuple. Pure functions of the
tuple's values and the target task list.

Fields grouping hashes with CRC-32 of the key values' msgpack encoding, not
Python's hash(), which differs between processes: every worker must send the
same key to the same task.
"""
from __future__ import annotations

import random
import zlib
from typing import Callable

import msgpack

from ..topology import TopologyError, resolve_grouping

Chooser = Callable[[list, int | None], list[int]]


def stable_hash(values: list) -> int:
    return zlib.crc32(msgpack.packb(values, default=str))


def make_chooser(grouping: dict, targets: list[int], fields: list[str], local_tasks: set[int],
                 seed: int, allow=None) -> Chooser:
    """A function (values, direct_task) -> target task ids. A custom grouping's class
    comes from the module prefixes in `allow` (a worker passes its own)."""
    kind = grouping["type"]
    n = len(targets)
    if kind == "shuffle" or (kind == "local_or_shuffle" and not local_tasks.intersection(targets)):
        # Storm's shuffle: walk a random permutation, reshuffle each lap - even load, no pattern
        order = list(targets)
        rng = random.Random(seed)
        rng.shuffle(order)
        state = {"i": 0}
        if n == 1:      # nothing to shuffle (a 1-element reshuffle per tuple was 17 % of a spout's time)
            return lambda values, direct: list(order)

        def shuffle(values, direct):
            i = state["i"]
            if i == n:
                rng.shuffle(order)
                i = 0
            state["i"] = i + 1
            return [order[i]]
        return shuffle
    if kind == "local_or_shuffle":
        local = sorted(local_tasks.intersection(targets))
        return make_chooser({"type": "shuffle"}, local, fields, local_tasks, seed)
    if kind == "fields":
        idx = [fields.index(f) for f in grouping["fields"]]
        return lambda values, direct: [targets[stable_hash([values[i] for i in idx]) % n]]
    if kind == "all":
        return lambda values, direct: list(targets)
    if kind == "global":
        lowest = [min(targets)]
        return lambda values, direct: lowest
    if kind == "direct":
        allowed = set(targets)

        def direct_(values, direct):
            if direct is None:
                return []   # a direct stream only delivers emits that name a task
            if direct not in allowed:
                raise TopologyError(f"direct emit to task {direct}, which does not subscribe; "
                                    f"subscribers: {sorted(allowed)}")
            return [direct]
        return direct_
    if kind == "custom":
        impl = resolve_grouping(grouping["class"], allow)(**grouping.get("config", {}))
        return lambda values, direct: list(impl.choose(values, targets))
    raise TopologyError(f"unknown grouping {kind!r}")
