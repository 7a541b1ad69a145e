"""The spout's acker: trees complete when their ledger reaches zero, expire after the
message timeout, and a tree pending for a good part of it is named once before."""
import logging
from types import SimpleNamespace

from streamnet.runtime.component import Context
from streamnet.runtime.dataplane import acker, executor
from streamnet.runtime.dataplane.acker import Acker


def _ctx(component: str, task: int, index: int, parallelism: int) -> Context:
    return Context(topology="train", component=component, task=task, task_index=index, parallelism=parallelism,
                   worker="w0", config={}, component_config={}, component_tasks=lambda c: [], compute=None,
                   publish=lambda k, v: None, save_state=None)


def test_a_tree_completes_expires_or_is_named_once_as_stalled(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(acker, "time", SimpleNamespace(monotonic=lambda: now[0]))
    a = Acker(timeout_s=300.0)
    a.start(1, 0b1010, "done soon")
    a.start(2, 0b0110, "lost on the way")
    assert a.ack(1, 0b1000) is None and a.ack(1, 0b0010) == "done soon"
    now[0] += 74
    assert a.stalled(75) == []
    now[0] += 2
    assert a.stalled(75) == ["lost on the way"]
    assert a.stalled(75) == []                    # once
    assert a.expire() == [] and len(a) == 1
    now[0] += 224
    assert a.expire() == ["lost on the way"] and len(a) == 0


def test_the_spout_executor_logs_a_stalled_tree_before_its_timeout(monkeypatch, caplog):
    now = [0.0]
    monkeypatch.setattr(acker, "time", SimpleNamespace(monotonic=lambda: now[0]))
    rt = SimpleNamespace(name="train", topology=SimpleNamespace(config={"message_timeout_s": 300,
                                                                        "max_spout_pending": 2}))
    ex = executor.SpoutExecutor(rt, 0, {"id": "data"}, object(), _ctx("data", 0, 0, 1))
    ex.pending.start(7, 5, (0, 23, 1))
    with caplog.at_level(logging.WARNING):
        now[0] = 149.0
        ex._expire()
        assert caplog.records == []
        now[0] = 151.0
        ex._expire()
        ex._expire()
    assert [r.getMessage() for r in caplog.records] == [
        "spout data[0] of train: the tuple tree of (0, 23, 1) is not complete after 150 s; it fails and is "
        "replayed 300 s after it began (message_timeout_s)"]
    assert not ex.callbacks                       # not failed: that is the timeout's to do


def _bolt_executor(targets):
    rt = SimpleNamespace(name="train", version=3, route=lambda cid, stream, values, direct: list(targets))
    return executor.BoltExecutor(rt, 6, {"id": "eval"}, object(), _ctx("eval", 6, 1, 2), queue_size=8)


def _acks(ex) -> dict[int, int]:
    """root -> XOR of what the executor's acks sent it so far."""
    out: dict[int, int] = {}
    for _, msg in ex.out:
        if isinstance(msg, executor.AckMsg):
            out[msg.root] = out.get(msg.root, 0) ^ msg.xor
    return out


def test_a_tuple_anchored_to_two_tuples_of_the_same_trees_completes_them_once_acked():
    """As an eval task's counts, anchored to the S slices it evaluated: each slice belongs
    to both units' trees. Acking the slices and then the new tuple brings every ledger to
    zero (with one edge for all anchors, the slices' acks cancelled it and the trees
    never completed), and so does the same with the new tuple sent to two tasks."""
    from streamnet.runtime.component import Tuple
    for targets in ([5], [5, 7]):
        ex = _bolt_executor(targets)
        roots, edges = [11 << 48 | 1, 11 << 48 | 2], [[0x1234, 0x9999], [0x5678, 0x7777]]
        ledger = {r: edges[0][i] ^ edges[1][i] for i, r in enumerate(roots)}   # what the emitters added
        slices = [Tuple([s], ["slice"], "eval", "sync", 3 + s, {r: edges[s][i] for i, r in enumerate(roots)})
                  for s in (0, 1)]
        ex.emit([1], "part", slices, 5)
        sent = [msg for _, msg in ex.out]
        ex.out = []
        for t in slices:
            ex.ack(t)
        for msg in sent:               # the receivers ack what came to them
            received = Tuple(msg.values, ["x"], msg.stream, "eval", 6, {r: e for r, e in msg.anchors})
            ex.ack(received)
        got = _acks(ex)
        assert {r: ledger[r] ^ got[r] for r in roots} == {r: 0 for r in roots}, targets
