"""A spout executor and its task's background state saves (ctx.save_state_started):
a save refused because another instance took the task over is logged even when
this instance was stopped first (its task moved: the usual way a stale instance
learns of it), and a stale instance does not close (publish) after a refusal. A spout
that is not polled (Spout.polled) is called for its acks, not in between."""
import asyncio
from types import SimpleNamespace

from streamnet.runtime import FencedError, Spout
from streamnet.runtime.component import Context
from streamnet.runtime.dataplane.executor import SpoutExecutor
from streamnet.testing import until

REFUSED = "task data.0 of t was taken over by another instance"


class SavingSpout(Spout):
    """Starts one background save at its first call and emits nothing."""
    outputs = ["n"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        self.saving, self.closed = None, False

    def next_tuple(self):
        if self.saving is None:
            self.saving = self.ctx.save_state_started({"n": 0})

    def close(self):
        self.closed = True


async def _run(refuse_before_stop: bool):
    """Run the executor until its save is in flight; refuse the save before or after
    stopping the executor. The spout instance."""
    answer = asyncio.get_running_loop().create_future()

    async def save(state):
        await answer

    rt = SimpleNamespace(name="t", topology=SimpleNamespace(config={"message_timeout_s": 30, "max_spout_pending": 4}),
                         stop_requested=False, task_done=lambda task: None, wait_converged=lambda: asyncio.sleep(0),
                         write_now=lambda: None)
    spout = SavingSpout()
    ctx = Context(topology="t", component="data", task=0, task_index=0, parallelism=1, worker="w0", config={},
                  component_config={}, component_tasks=lambda c: [], compute=None, publish=lambda k, v: None,
                  save_state=None, save_state_async=save)
    ex = SpoutExecutor(rt, 0, {"id": "data"}, spout, ctx)
    ctx._on_saved = ex.saved
    run = asyncio.ensure_future(ex.run())
    await until(lambda: spout.__dict__.get("saving") is not None, "the save to start")
    if refuse_before_stop:
        answer.set_exception(FencedError(REFUSED))
        await until(lambda: ex.refused is not None, "the refusal")
    ex.stopping = True
    ex.wake.set()
    await asyncio.wait_for(run, 5)
    if not refuse_before_stop:
        answer.set_exception(FencedError(REFUSED))
        await until(lambda: ex.refused is not None, "the refusal")
    return spout


def test_a_save_refused_after_the_instance_stopped_is_logged(caplog):
    caplog.set_level("WARNING")
    spout = asyncio.run(_run(refuse_before_stop=False))
    assert [r.getMessage() for r in caplog.records] == [REFUSED + " (refused after this instance stopped)"]
    assert spout.closed          # it did not know yet when it stopped


def test_a_save_refused_before_a_stop_the_spout_never_raised_is_logged_and_the_spout_not_closed(caplog):
    caplog.set_level("WARNING")
    spout = asyncio.run(_run(refuse_before_stop=True))
    assert [r.getMessage() for r in caplog.records] == [REFUSED + " (refused as this instance stopped)"]
    assert not spout.closed


class OneTreeSpout(Spout):
    """Emits one tracked tuple, then nothing until it is acked, then one more."""
    outputs = ["n"]

    def __init__(self):
        super().__init__()
        self.calls, self.emitted, self.acked = 0, 0, 0

    def next_tuple(self):
        self.calls += 1
        if self.emitted == self.acked and self.emitted < 2:
            self.emitted += 1
            self.collector.emit([self.emitted], msg_id=self.emitted)

    def ack(self, msg_id):
        self.acked += 1


class UnpolledSpout(OneTreeSpout):
    polled = False


def test_a_spout_that_is_not_polled_is_called_on_an_ack_and_not_in_between(monkeypatch):
    """Spout.polled: a polled spout waiting for its tree is called again and again (its
    idle wait backs off from IDLE_FIRST_S); one that is not waits for the ack (here its
    longest wait, IDLE_MAX_S, is made 30 s), and the ack wakes it at once."""
    from streamnet.runtime.dataplane import executor
    monkeypatch.setattr(executor, "IDLE_MAX_S", 30.0)

    async def go():
        sent: list = []

        async def deliver(target, msg):
            sent.append(msg)
        rt = SimpleNamespace(name="t", version=1, stop_requested=False, task_done=lambda task: None,
                             wait_converged=lambda: asyncio.sleep(0), route=lambda *a: [9], deliver=deliver, write_now=lambda: None,
                             topology=SimpleNamespace(config={"message_timeout_s": 60, "max_spout_pending": 4}))
        runs = []
        for task, spout in enumerate([OneTreeSpout(), UnpolledSpout()]):
            ctx = Context(topology="t", component="data", task=task, task_index=task, parallelism=2, worker="w0",
                          config={}, component_config={}, component_tasks=lambda c: [], compute=None,
                          publish=lambda k, v: None, save_state=None)
            ex = SpoutExecutor(rt, task, {"id": "data"}, spout, ctx)
            runs.append((ex, spout, asyncio.ensure_future(ex.run())))
        (_, polled, _), (unpolled_ex, unpolled, _) = runs

        async def until(condition):
            for _ in range(2000):
                if condition():
                    return
                await asyncio.sleep(0.005)
            raise AssertionError("timed out")
        # the polled twin's repeated calls show its idle waits (1, 2, 4, 8 ms ...) have passed
        await until(lambda: polled.calls >= 6 and unpolled.emitted == 1)
        assert unpolled.calls == 2      # the call that emitted and the one just after it, no more
        (root, edge), = next(m for m in sent if m.source == 1).anchors
        unpolled_ex.on_ack(root, edge)          # its tree completes
        await until(lambda: unpolled.emitted == 2)
        assert unpolled.acked == 1 and unpolled.calls >= 3
        for ex, _, run in runs:
            ex.stopping = True
            ex.wake.set()
            await asyncio.wait_for(run, 5)
    asyncio.run(go())
