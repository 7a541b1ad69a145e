"""The spout's acker: trees complete when their ledger reaches zero, expire after the
message timeout, and a tree pending for a good part of it is named once before."""
import logging
from types import SimpleNamespace

from streamnet.runtime.component import Context
from streamnet.runtime.dataplane import acker, executor
from streamnet.runtime.dataplane.acker import Acker


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
    ctx = Context(topology="train", component="data", task=0, task_index=0, parallelism=1, worker="w0", config={},
                  component_config={}, component_tasks=lambda c: [], compute=None, publish=lambda k, v: None,
                  save_state=None)
    ex = executor.SpoutExecutor(rt, 0, {"id": "data"}, object(), ctx)
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
