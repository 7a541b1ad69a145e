"""A compute unit that waits for parameters asks again when its request was lost."""
import asyncio
import time
from types import SimpleNamespace

from streamnet.training.components import ComputeBolt


class Collector:
    def __init__(self):
        self.emitted = []

    def emit(self, values, stream="default", **kw):
        self.emitted.append((stream, values))


def _bolt():
    bolt = ComputeBolt.__new__(ComputeBolt)     # no model or data needed for the waiting logic
    bolt.ctx = SimpleNamespace(task=7, task_index=1)
    bolt.collector = Collector()
    bolt.params_step, bolt.stash, bolt._asked_at = 0, [], 0.0
    return bolt


def test_work_ahead_of_the_parameters_is_held_and_the_request_repeated_until_they_come():
    bolt = _bolt()
    asyncio.run(bolt._work({"step": 5}))
    asyncio.run(bolt._work({"step": 5}))
    assert bolt.collector.emitted == [("resync", [7])] and len(bolt.stash) == 2   # one request for both
    bolt.tick()
    assert len(bolt.collector.emitted) == 1                                         # not yet: give it time
    bolt._asked_at = time.monotonic() - bolt.RESYNC_S - 0.1                          # the answer never came
    bolt.tick()
    assert bolt.collector.emitted == [("resync", [7])] * 2
    bolt.stash.clear()                                                              # parameters arrived
    bolt._asked_at = 0.0
    bolt.tick()
    assert len(bolt.collector.emitted) == 2


def test_work_already_applied_is_answered_by_field_name():
    """A replay of a combined step: the answer's values follow the stream's declared fields."""
    from streamnet.training.streams import CONTRIBUTION

    class Acking(Collector):
        def ack(self, tup):
            self.acked = tup

    bolt = _bolt()
    bolt.collector = Acking()
    bolt.params_step = 6
    work = {"unit": 1, "epoch": 0, "round": 4, "step": 5, "lr_scale": 0.5, "batches": [], "checkpoint": False}
    asyncio.run(bolt._work(work))
    (stream, values), = bolt.collector.emitted
    assert ComputeBolt.outputs["default"] == list(CONTRIBUTION)
    sent = dict(zip(CONTRIBUTION, values))
    assert stream == "default" and bolt.collector.acked is work
    assert {k: sent[k] for k in work if k != "batches"} == {k: v for k, v in work.items() if k != "batches"}
    assert (sent["status"], sent["samples"], sent["unit_state"]) == ("applied", 0, None)
