"""routing.py's decisions on plain data: one worker's view, one message."""
import pytest

from streamnet.runtime.codec import CodecError
from streamnet.runtime.dataplane import routing
from streamnet.runtime.dataplane.acker import ROOT_BITS
from streamnet.runtime.dataplane.routing import View
from streamnet.runtime.messages import AckMsg, DataMsg, FailMsg, from_wire

# v3 on w1: spout task 0 on w0, compute tasks 1 (here) and 2 (w2), sync task 3 here
VIEW = View("w1", 3, frozenset({1, 3}), {0: "w0", 1: "w1", 2: "w2", 3: "w1"}, {"w0": "u0", "w2": "u2"})
ROOT = (0 << ROOT_BITS) | 9


def data(target, source=2, version=3, anchors=((ROOT, 5),)):
    return DataMsg("t", target, "default", source, [1], [list(a) for a in anchors], version)


def test_inbound_for_a_local_task_from_its_placed_sender_is_delivered():
    assert routing.inbound(data(3, source=2), VIEW, sender="w2") == routing.DELIVER
    assert routing.inbound(AckMsg("t", 1, ROOT, 3), VIEW, sender="w0") == routing.DELIVER


def test_inbound_from_a_task_placed_elsewhere_is_stale_unless_the_sender_is_newer():
    # task 2 is on w2 by v3; w9 still runs an old instance of it
    assert routing.inbound(data(3, source=2, version=3), VIEW, sender="w9") == routing.STALE
    assert routing.inbound(data(3, source=2, version=2), VIEW, sender="w9") == routing.STALE
    assert routing.inbound(data(3, source=2, version=4), VIEW, sender="w9") == routing.DELIVER
    assert routing.inbound(data(3, source=2, version=None), VIEW, sender="w9") == routing.DELIVER
    assert routing.inbound(data(3, source=2), VIEW, sender=None) == routing.DELIVER   # from this worker


def test_inbound_for_a_task_not_here_parks_if_newer_else_fails_its_roots():
    assert routing.inbound(data(2, version=4), VIEW, sender="w0") == routing.PARK
    assert routing.inbound(data(2, version=3), VIEW, sender="w0") == routing.FAIL_ROOTS
    assert routing.inbound(FailMsg("t", 2, ROOT), VIEW, sender="w0") == routing.FAIL_ROOTS


def test_outbound():
    assert routing.outbound(data(1), VIEW) == routing.DELIVER
    assert routing.outbound(data(2), VIEW) == routing.SEND
    assert routing.outbound(data(0), VIEW) == routing.SEND
    unknown = View("w1", 3, frozenset(), {5: "w1", 6: "w7"}, {})
    assert routing.outbound(data(5), unknown) == routing.PARK           # ours, not started yet
    assert routing.outbound(AckMsg("t", 5, ROOT, 1), unknown) == routing.FAIL_ROOTS
    assert routing.outbound(data(6), unknown) == routing.FAIL_ROOTS     # no address for w7
    assert routing.outbound(data(8), unknown) == routing.FAIL_ROOTS     # placed nowhere


def test_parked_tuples_once_an_assignment_is_applied():
    assert routing.parked(data(1, version=4), VIEW) == routing.DELIVER
    assert routing.parked(data(2, version=4), VIEW) == routing.PARK
    assert routing.parked(data(2, version=3), VIEW) == routing.FAIL_ROOTS


def test_failures_go_to_spouts_that_run_somewhere_known():
    other = (7 << ROOT_BITS) | 1          # spout task 7 is placed nowhere
    msg = data(2, anchors=((ROOT, 5), (other, 6)))
    assert routing.failures(msg, VIEW) == [FailMsg("t", 0, ROOT)]
    assert routing.failures(AckMsg("t", 2, ROOT, 1), VIEW) == []


def test_messages_round_trip_and_bad_shapes_are_codec_errors():
    for m in (data(1), data(1, version=None), AckMsg("t", 0, ROOT, 77), FailMsg("t", 0, ROOT)):
        wire = m.to_wire()
        if isinstance(m, DataMsg) and m.version is None:
            wire = wire[:7]                  # an old sender's tuple: no version
        assert from_wire(wire) == m
    for bad in ([], ["t", "x"], ["t", "x", 1, "s", 2, [], [[1]], 0], ["t", "x", 1, "s", 2, [], [], "v"],
                ["a", "x", 1, 2], ["f", "x", True, 3], ["q", "x", 1, 2], "t", ["a", 1, 2, 3, 4]):
        with pytest.raises(CodecError):
            from_wire(bad)
