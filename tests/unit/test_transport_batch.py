"""How a link's queue cuts its messages into frames (transport._LinkQueue.take): up to
MAX_BATCH_MSGS messages and MAX_BATCH_ARRAY_BYTES of arrays a frame, never past that
cap unless one message alone is bigger, so that a frame always fits beside the one
before it in the socket's buffer (see the cap's comment for the figures)."""
import asyncio

import numpy as np

from streamnet.runtime.dataplane import transport
from streamnet.runtime.dataplane.frame_io import SOCKET_BUFFER
from streamnet.runtime.messages import AckMsg, DataMsg


def _tensor(i, nbytes):
    return DataMsg("bulk", 1, "default", 0, [i, np.zeros(nbytes // 4, np.float32)], [], 1)


def _frames(msgs):
    async def run():
        q = transport._LinkQueue(0, on_put=lambda: None)
        for m in msgs:
            q.put_nowait(m)
        out = []
        while not q.empty():
            out.append(q.take())
        return out
    return asyncio.run(run())


def test_a_frame_stops_before_a_tensor_that_would_take_it_past_the_cap():
    cap = transport.MAX_BATCH_ARRAY_BYTES
    assert cap == SOCKET_BUFFER // 4
    size = 247_000 // 4 * 4                        # perf/transport.py's bulk tensor
    frames = _frames([_tensor(i, size) for i in range(10)])
    per_frame = cap // size                        # 4 with a 1 MB cap
    assert [len(f) for f in frames] == [per_frame, per_frame, 10 - 2 * per_frame]
    for f in frames:
        assert sum(m.values[1].nbytes for m in f) <= cap
    assert [m.values[0] for f in frames for m in f] == list(range(10))   # in order, none lost


def test_a_message_bigger_than_the_cap_goes_alone_and_small_ones_batch_around_it():
    cap = transport.MAX_BATCH_ARRAY_BYTES
    small = [AckMsg("bulk", 0, i, i) for i in range(3)]
    frames = _frames([*small, _tensor(99, 2 * cap), *small])
    assert [len(f) for f in frames] == [3, 1, 3]
    assert frames[1][0].values[0] == 99


def test_small_messages_fill_a_frame_up_to_the_message_cap():
    n = transport.MAX_BATCH_MSGS + 5
    frames = _frames([AckMsg("bulk", 0, i, i) for i in range(n)])
    assert [len(f) for f in frames] == [transport.MAX_BATCH_MSGS, 5]
