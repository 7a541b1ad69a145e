"""Inputs are checked where they enter (issue 15): the codec bounds what a header
may decode to and refuses a payload larger than its arrays; the training bolts
refuse a vector of the wrong shape or dtype before any kernel sees it."""
import asyncio
import logging
import struct
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest

from streamnet.runtime import codec
from streamnet.runtime.component import Tuple
from streamnet.training.bp import Aggregator, Plan, SGD
from streamnet.training.compute_bolt import ComputeBolt
from streamnet.training.sync_bolt import SyncBolt
from streamnet.training.sync_recovery import Adoption


# -- codec -------------------------------------------------------------------------------
def _frame(header: bytes, payload: bytes = b"") -> bytes:
    return codec.PREFIX.pack(codec.MAGIC, len(header), len(payload)) + header + payload


def test_a_header_of_many_small_objects_is_refused_before_it_grows():
    header = msgpack.packb([[] for _ in range(5000)])      # 5 KB that would be 5000 list objects
    limits = codec.Limits(max_header_items=1000)
    with pytest.raises(codec.CodecError, match=r"exceeds max_array_len\(1000\)"):   # one list too long
        codec.decode(_frame(header), limits)
    nested = msgpack.packb([[[] for _ in range(300)] for _ in range(10)])    # entries at every level count
    with pytest.raises(codec.CodecError, match="more than 1000 list/map entries"):
        codec.decode(_frame(nested), limits)
    nested = msgpack.packb([{"a": [1, 2]} for _ in range(400)])
    with pytest.raises(codec.CodecError, match="list/map entries"):
        codec.decode(_frame(nested), limits)
    assert codec.decode(_frame(msgpack.packb([{"a": [1, 2]}] * 100)), limits) == [{"a": [1, 2]}] * 100


def test_a_payload_larger_than_its_arrays_is_refused():
    good = codec.encode_bytes([np.arange(1, dtype=np.float32)])
    hlen, plen = codec.parse_prefix(good[:codec.PREFIX.size])
    assert plen == 8 and np.array_equal(codec.decode(good)[0], [0.0])
    header = good[codec.PREFIX.size:codec.PREFIX.size + hlen]
    pinned = _frame(header, good[codec.PREFIX.size + hlen:] + b"\0" * (1 << 20))   # 4 bytes pin 1 MiB
    with pytest.raises(codec.CodecError, match="payload of 1048584 bytes, but its arrays take 8"):
        codec.decode(pinned)
    with pytest.raises(codec.CodecError, match="but its arrays take 0"):
        codec.decode(_frame(msgpack.packb([1]), b"\0" * 8))


# -- sync bolt ---------------------------------------------------------------------------
class Collector:
    def __init__(self):
        self.emitted, self.acked, self.failed = [], [], []

    def emit(self, values, stream="default", **kw):
        self.emitted.append((stream, values))

    def ack(self, tup):
        self.acked.append(tup)

    def fail(self, tup):
        self.failed.append(tup)


def _sync(size=16, units=2):
    from streamnet.training.sync_state import SyncState
    bolt = SyncBolt.__new__(SyncBolt)           # no dataset or model: the receiving half only
    bolt.agg = Aggregator(np.zeros(size, np.float32), Plan(inner=None, outer=SGD(0.1, 0.0, 0.0), scale_outer=True))
    bolt.compute_tasks = list(range(1, units + 1))
    bolt.counts = SyncState(units=units)
    bolt.pending, bolt.arrived = {}, {}
    bolt.bytes_in = 0
    bolt.collector = Collector()
    bolt.prepare_recovery()
    combined = []

    async def maybe_combine(key):
        combined.append(key)
    bolt._maybe_combine = maybe_combine
    return bolt, combined


def _contribution(unit, vector, status="ok"):
    return {"unit": unit, "epoch": 0, "round": 0, "step": 0, "status": status, "vector": vector}


@pytest.mark.parametrize("vector, why", [
    (np.zeros(4 << 20, np.float32), r"shape \(4194304,\), not \(16,\)"),     # the SIGSEGV of the review
    (np.zeros(16, np.float64), "dtype float64, not float32"),
    (np.zeros((4, 4), np.float32), r"shape \(4, 4\), not \(16,\)"),
    ([0.0] * 16, "a list, not an array"),
])
def test_a_contribution_of_the_wrong_shape_or_dtype_is_refused_naming_its_unit(caplog, vector, why):
    bolt, combined = _sync()
    tup = _contribution(1, vector)
    with caplog.at_level(logging.WARNING, "streamnet.training.sync_bolt"):
        asyncio.run(bolt._contribution(tup))
    assert bolt.collector.failed == [tup]              # replayed by the spout: nothing lost
    assert bolt.pending == {} and combined == []       # never reaches the aggregator's kernels
    assert bolt.agg.refused and bolt.agg.refused[0][0] == 1
    assert any("refuses the contribution of unit 1 to step 0" in r.getMessage() for r in caplog.records)
    import re
    assert re.search(why, caplog.text)


def test_a_contribution_for_an_unknown_unit_is_refused_and_a_good_one_goes_on():
    bolt, combined = _sync()
    asyncio.run(bolt._contribution(_contribution(7, np.zeros(16, np.float32))))
    assert len(bolt.collector.failed) == 1 and combined == []
    good = _contribution(1, np.ones(16, np.float32))
    asyncio.run(bolt._contribution(good))
    assert bolt.pending == {(0, 0): {1: good}} and combined == [(0, 0)] and len(bolt.collector.failed) == 1


def test_a_replica_of_the_wrong_shape_is_not_adopted(caplog):
    bolt, _ = _sync()
    bolt.adoption = Adoption(since=0.0)
    with caplog.at_level(logging.WARNING):
        asyncio.run(bolt._replica({"task": 1, "step": 3, "params": np.zeros(99, np.float32)}))
        asyncio.run(bolt._replica({"task": 2, "step": 3, "params": np.full(16, np.inf, np.float32)}))
    assert bolt.adoption.replies == {}
    assert "replica of task 1" in caplog.text and "non-finite values" in caplog.text


# -- compute bolt ------------------------------------------------------------------------
def test_parameters_of_the_wrong_shape_are_refused_by_a_compute_unit(caplog):
    received = []
    bolt = ComputeBolt.__new__(ComputeBolt)
    bolt.ctx = SimpleNamespace(task=7, task_index=1)
    bolt.collector = Collector()
    bolt.unit = SimpleNamespace(model=SimpleNamespace(num_params=16), receive=received.append)
    bolt.params_step, bolt.stash, bolt._sent_at = 0, [], None
    tup = Tuple([1, np.zeros(1 << 20, np.float32)], ["step", "params"], "params", "sync", 0, {})
    with caplog.at_level(logging.WARNING):
        asyncio.run(bolt.execute(tup))
    assert received == [] and bolt.params_step == 0 and bolt.collector.failed == [tup]
    assert "unit 1 refuses parameters for step 1 from sync" in caplog.text
