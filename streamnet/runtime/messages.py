"""Messages between tasks: typed values, and the only place that knows their field order.

On the wire, inside a codec frame (codec.py), each message is a list whose first
element names its kind:

    ["t", topology, target, stream, source, values, anchors, version]   a tuple for a task
    ["T", topology, target, stream, source, version, [values, ...], [anchors, ...]]
                                                                        a run of tuples, one header
    ["a", topology, target, root, xor]                                  an ack, to a spout's ledger
    ["f", topology, target, root]                                       a failed tree, to its spout
    ["h", topology, target, held]                                       hold (1) or release (0) the
                                                                        tuples for a bolt task (delivery.py)

`anchors` is a list of [root, edge] pairs (Storm's tuple tree ids); `version` is
the sender's assignment version (fencing and parking read it). Lists rather than
maps keep a small tuple's frame small. Consecutive tuples of one frame that share
their header (topology, target, stream, source, version) go as one run (`to_wire_all`):
the receiver decodes, checks and routes the header once, not per tuple - for small
tuples the per-message work, not the bytes, was the limit (29k/s before, in
perf/transport.py). The dataclasses are not frozen for the same reason: a frozen
one's __init__ took 2.4 us against 0.5 us, once per tuple on each side.

Everything received is checked by `from_wire` before anything reads it; a message
of the wrong shape is a CodecError, which closes the connection it came on.
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Union

from .codec import CodecError
from .values import whole


@dataclass(slots=True)
class DataMsg:
    """A tuple for task `target` of `topology`, emitted by task `source` on `stream`."""
    topology: str
    target: int
    stream: str
    source: int
    values: list
    anchors: list            # [[root, edge], ...]; empty for an unanchored tuple
    version: int | None      # the sender's assignment version (None: an old sender that did not say)

    def to_wire(self) -> list:
        return ["t", self.topology, self.target, self.stream, self.source, self.values, self.anchors,
                self.version]

    def roots(self) -> list[int]:
        return [root for root, _ in self.anchors]

    def newer_than(self, version: int) -> bool:
        """Sent by a worker that applied a newer assignment than `version`."""
        return self.version is not None and self.version > version


@dataclass(slots=True)
class AckMsg:
    """XOR `xor` into the ledger of tree `root`, held by the spout task `target`."""
    topology: str
    target: int
    root: int
    xor: int

    def to_wire(self) -> list:
        return ["a", self.topology, self.target, self.root, self.xor]


@dataclass(slots=True)
class FailMsg:
    """Tree `root` failed: its spout task `target` replays it."""
    topology: str
    target: int
    root: int

    def to_wire(self) -> list:
        return ["f", self.topology, self.target, self.root]


@dataclass(slots=True)
class DataRun:
    """Tuples for task `target`, all from task `source` on `stream` under one
    assignment version, as they arrived together: routed once, delivered in order."""
    topology: str
    target: int
    stream: str
    source: int
    values: list             # one list of values per tuple
    anchors: list            # one [[root, edge], ...] per tuple
    version: int | None

    def __len__(self) -> int:
        return len(self.values)

    def roots(self) -> list[int]:
        return [root for anchors in self.anchors for root, _ in anchors]

    def newer_than(self, version: int) -> bool:
        return self.version is not None and self.version > version


@dataclass(slots=True)
class HoldMsg:
    """From the worker of bolt task `target`: send it no more tuples until released
    (`held` False) - its queue is full, and what came on meanwhile waits in its overflow."""
    topology: str
    target: int
    held: bool

    def to_wire(self) -> list:
        return ["h", self.topology, self.target, 1 if self.held else 0]


Message = Union[DataMsg, DataRun, AckMsg, FailMsg, HoldMsg]
DATA = (DataMsg, DataRun)     # the messages that carry tuples


def to_wire_all(msgs: list) -> list:
    """The wire lists of a frame's messages, in order: consecutive tuples that share
    their header become one run (a tuple alone stays a "t")."""
    out = []
    head = None             # the header of the tuple last added, when it was one
    for m in msgs:
        if type(m) is not DataMsg:
            head = None
            out.append(m.to_wire())
            continue
        h = (m.topology, m.target, m.stream, m.source, m.version)
        if h != head:
            head = h
            out.append(m)                       # a tuple alone so far
            continue
        last = out[-1]
        if type(last) is DataMsg:               # a second tuple: the first starts a run
            last = out[-1] = ["T", *h, [last.values], [last.anchors]]
        last[6].append(m.values)
        last[7].append(m.anchors)
    return [m.to_wire() if type(m) is DataMsg else m for m in out]


def _anchors_ok(anchors) -> bool:
    return isinstance(anchors, list) and all(
        isinstance(a, list) and len(a) == 2 and whole(a[0]) and whole(a[1]) for a in anchors)


def _shown(msg) -> str:
    """A message for an error: bounded in length and depth (str() of a list nested
    thousands deep, which a peer can send, raised RecursionError, not CodecError)."""
    return reprlib.repr(msg)[:80]


def from_wire(msg) -> Message:
    """The typed message of a decoded wire list; CodecError if it is not one."""
    if not (isinstance(msg, list) and len(msg) >= 4 and isinstance(msg[1], str) and whole(msg[2])):
        raise CodecError(f"malformed message {_shown(msg)}")
    kind = msg[0]
    if kind == "T" and len(msg) == 8:
        _, topology, target, stream, source, version, values, anchors = msg
        if (isinstance(stream, str) and whole(source) and (version is None or whole(version))
                and isinstance(values, list) and isinstance(anchors, list) and len(values) == len(anchors)
                and all(type(v) is list for v in values)
                and all(type(a) is list and (not a or _anchors_ok(a)) for a in anchors)):
            return DataRun(topology, target, stream, source, values, anchors, version)
    elif kind == "t" and len(msg) in (7, 8):
        _, topology, target, stream, source, values, anchors, *rest = msg
        version = rest[0] if rest else None
        if (isinstance(stream, str) and whole(source) and isinstance(values, list) and _anchors_ok(anchors)
                and (version is None or whole(version))):
            return DataMsg(topology, target, stream, source, values, anchors, version)
    elif kind == "a" and len(msg) == 5 and whole(msg[3]) and whole(msg[4]):
        return AckMsg(msg[1], msg[2], msg[3], msg[4])
    elif kind == "f" and len(msg) == 4 and whole(msg[3]):
        return FailMsg(msg[1], msg[2], msg[3])
    elif kind == "h" and len(msg) == 4 and type(msg[3]) is int and msg[3] in (0, 1):
        return HoldMsg(msg[1], msg[2], msg[3] == 1)
    raise CodecError(f"malformed message {_shown(msg)}")
