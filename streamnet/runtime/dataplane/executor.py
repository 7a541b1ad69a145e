"""Task executors: the loop around one spout or bolt instance.

A component's calls (next_tuple, execute) are synchronous from the engine's
point of view: what they emit is buffered, and delivered - with backpressure -
before the next call. So memory stays bounded by the queues, and a component
never sees its own emits interleaved with its next input.

Reliability is Storm's: each spout executor keeps the XOR ledgers of its own
tuple trees (acker.py); bolts anchor what they emit to what they received and
ack or fail it.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field

from ..component import Bolt, BoltCollector, Context, Spout, SpoutCollector, Tuple
from ..messages import AckMsg, DataMsg, FailMsg
from .acker import ROOT_BITS, Acker, root_task
from .fencing import FencedError
from .inbox import Inbox

log = logging.getLogger(__name__)
STOP = object()
# put in an idle bolt's queue when its tick is due (BoltExecutor._tick_due): wakes it
TICK = object()
# a spout's tuple tree pending this part of message_timeout_s (and at least STALL_MIN_S)
# is logged once: a tuple lost on the way shows before the timeout replays it
STALL_FRACTION, STALL_MIN_S = 0.5, 10.0
# a polled spout (Spout.polled) that emitted nothing is called again after IDLE_FIRST_S,
# then twice as long each time up to IDLE_MAX_S; one that is not, after IDLE_MAX_S (and
# at once for an ack, a fail or a landed save). The data spout waits at the barrier
# for most of a round: polled, it ran about 4 times a LeNet-5 round for nothing
IDLE_FIRST_S, IDLE_MAX_S = 0.001, 0.05


@dataclass
class TaskMetrics:
    executed: int = 0
    emitted: int = 0
    acked: int = 0
    failed: int = 0
    replay_failed: int = 0     # spouts: roots failed (explicitly or by timeout)
    timed_out: int = 0
    errors: int = 0
    exec_s: float = 0.0
    latency_ms_ewma: float = 0.0
    _lat: deque = field(default_factory=lambda: deque(maxlen=256), repr=False)

    def observe(self, seconds: float) -> None:
        self.executed += 1
        self.exec_s += seconds
        ms = seconds * 1e3
        self.latency_ms_ewma = ms if self.executed == 1 else 0.95 * self.latency_ms_ewma + 0.05 * ms
        self._lat.append(ms)

    def as_dict(self) -> dict:
        lat = sorted(self._lat)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
        return {"executed": self.executed, "emitted": self.emitted, "acked": self.acked, "failed": self.failed,
                "timed_out": self.timed_out, "errors": self.errors, "execute_ms_avg": round(self.latency_ms_ewma, 4),
                "execute_ms_p99": round(p99, 4), "execute_s_total": round(self.exec_s, 4)}


class Wake:
    """An event's set() and clear(), and a wait with a timeout that makes no task
    (asyncio.wait_for makes one each time: an idle spout waits once per ack)."""

    def __init__(self):
        self._set = False
        self._waiter: asyncio.Future | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout: float) -> bool:
        """True if set (now or within `timeout` seconds)."""
        if not self._set:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self._set


class Executor:
    kind = ""

    def __init__(self, runtime, task: int, component: dict, instance, ctx: Context):
        self.rt, self.task, self.spec, self.instance, self.ctx = runtime, task, component, instance, ctx
        self.cid = component["id"]
        self.metrics = TaskMetrics()
        self.out: list = []            # buffered (target task, message) until flushed
        self.rng = random.Random(f"{runtime.name}:{task}:{time.time_ns()}")
        self._task: asyncio.Task | None = None
        self.stopping = False
        self.restored = None   # the last saved state, handed to restore() after open/prepare
        self.state_version = -1  # version of the state node this instance owns (fencing)
        self.session = 0         # the worker's coordinator session an assignment last placed it in
        self.unsettled = None    # (value, version) of a save whose fate the coordinator has not told yet
        self.fenced = False
        self.crashed = False   # the worker died under it (LocalCluster.crash_worker): no close()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._guarded(), name=f"{self.cid}-{self.task}")

    async def _guarded(self) -> None:
        try:
            await self.run()
        except asyncio.CancelledError:
            return
        except FencedError as e:
            log.warning("%s", e)
            self.rt.on_fenced(self)
            return
        except Exception:  # noqa: BLE001 - a task's crash is logged, the worker lives on
            log.exception("task %s[%d] of %s crashed", self.cid, self.task, self.rt.name)
        if not (self.stopping or self.fenced or self.crashed):
            await self.ended()

    async def ended(self) -> None:
        """run() is over without being stopped: the component could not start, or the
        task crashed. What still comes for it must not wait for it (a bolt's)."""

    async def run(self) -> None:
        raise NotImplementedError

    def _start(self, setup, what: str) -> bool:
        """open()/prepare(), then restore(): False if the component raised. A component
        that cannot start would leave its topology waiting for ever, so the error goes to
        the topology's results, where clients read it (and fail the run); the worker and
        its other tasks go on."""
        step = what
        self.ctx.restarting = self.restored is not None
        try:
            setup()
            if self.restored is not None:
                step = "restore"
                self.instance.restore(self.restored)
            return True
        except FencedError:
            raise
        except Exception as e:  # noqa: BLE001 - user code
            self.metrics.errors += 1
            log.exception("%s %s[%d] of %s: %s() failed", self.kind, self.cid, self.task, self.rt.name, step)
            self.rt.task_failed(self.task, f"{step}() raised {type(e).__name__}: {e}")
            return False

    async def flush(self) -> None:
        if not self.out:        # most calls of a bolt that emits nothing: once per tuple
            return
        out, self.out = self.out, []
        if len(out) > 1:
            # peers' messages first (a stable sort: each target's stay in order): their frames
            # then go out (PeerLink.write_now) before the local tasks run that share the
            # event loop, which a peer's message takes longer to reach its task. Traced on 2
            # worker processes (MixBP H=8), a sync task's parameters reached the remote unit
            # 0.99 -> 0.91 ms after they were emitted (medians) and the local unit 0.21 ->
            # 0.55 ms: the remote unit is the one the next round waits for
            # (docs/perf-history.md).
            local = self.rt.view.local
            out.sort(key=lambda item: item[0] in local)
        deliver = self.rt.deliver
        for target, msg in out:
            await deliver(target, msg)

    def _new_edge(self) -> int:
        return self.rng.getrandbits(64) or 1


class SpoutExecutor(Executor):
    kind = "spout"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.timeout_s = float(self.rt.topology.config["message_timeout_s"])
        self.stall_s = max(STALL_MIN_S, self.timeout_s * STALL_FRACTION)   # a tree pending this long is logged
        self.pending = Acker(self.timeout_s)  # this spout's tuple trees not complete yet
        self.callbacks: deque = deque()      # ("ack"|"fail", msg_id) to hand to the spout
        self.wake = Wake()
        self.max_pending = int(self.rt.topology.config["max_spout_pending"])
        self.done_reported = False
        self.active = True
        self.drain_called = False
        self.exited = False          # run() has returned: a refusal found now is logged by saved()
        self.refused: FencedError | None = None   # a background save refused, not yet raised by the spout

    def saved(self, done) -> None:
        """A background state save (ctx.save_state_started) is done: the spout goes on at
        once. A refused one (another instance took the task over) is the spout's to
        raise; but an instance stopped meanwhile (its task moved, which is how a stale
        one usually learns of it) never will, so the refusal is logged for it."""
        self.wake.set()
        error = None if done.cancelled() else done.exception()
        if isinstance(error, FencedError):
            self.refused = error
            if self.exited:
                log.warning("%s (refused after this instance stopped)", error)

    # -- emit -----------------------------------------------------------------------
    def emit(self, values, stream, msg_id, direct_task):
        targets = self.rt.route(self.cid, stream, values, direct_task)
        self.metrics.emitted += 1
        if msg_id is None:
            for t in targets:
                self.out.append((t, DataMsg(self.rt.name, t, stream, self.task, values, [], self.rt.version)))
            return targets
        root = (self.task << ROOT_BITS) | self.rng.getrandbits(ROOT_BITS)
        ledger = 0
        for t in targets:
            edge = self._new_edge()
            ledger ^= edge
            self.out.append((t, DataMsg(self.rt.name, t, stream, self.task, values, [[root, edge]], self.rt.version)))
        if targets:
            self.pending.start(root, ledger, msg_id)
        else:
            self.callbacks.append(("ack", msg_id))  # nobody subscribes: the tree is complete
        return targets

    # -- acker ----------------------------------------------------------------------
    def on_ack(self, root: int, xor: int) -> None:
        msg_id = self.pending.ack(root, xor)
        if msg_id is not None:
            self.callbacks.append(("ack", msg_id))
            self.wake.set()

    def on_fail(self, root: int) -> None:
        msg_id = self.pending.fail(root)
        if msg_id is not None:
            self.callbacks.append(("fail", msg_id))
            self.wake.set()

    def fail_all(self) -> None:
        """Fail every pending tree now (its tuples may have been lost with a worker)."""
        for msg_id in self.pending.fail_all():
            self.callbacks.append(("fail", msg_id))
        self.wake.set()

    def _expire(self) -> None:
        for msg_id in self.pending.expire():
            self.metrics.timed_out += 1
            self.callbacks.append(("fail", msg_id))
        for msg_id in self.pending.stalled(self.stall_s):
            log.warning("spout %s[%d] of %s: the tuple tree of %r is not complete after %.0f s; it fails and is "
                        "replayed %.0f s after it began (message_timeout_s)", self.cid, self.task, self.rt.name,
                        msg_id, self.stall_s, self.timeout_s)

    def _call(self, fn, *args) -> None:
        """A spout method: its errors are logged and counted, the task goes on."""
        try:
            fn(*args)
        except FencedError:
            raise
        except Exception:  # noqa: BLE001 - e.g. a save while the coordinator is unreachable
            self.metrics.errors += 1
            log.exception("spout %s[%d]: %s failed", self.cid, self.task, getattr(fn, "__name__", fn))

    def _run_callbacks(self) -> None:
        spout: Spout = self.instance
        while self.callbacks:
            kind, msg_id = self.callbacks.popleft()
            if kind == "ack":
                self.metrics.acked += 1
                self._call(spout.ack, msg_id)
            else:
                self.metrics.failed += 1
                self._call(spout.fail, msg_id)

    async def run(self) -> None:
        spout: Spout = self.instance
        if not self._start(lambda: spout.open(self.ctx, SpoutCollector(self)), "open"):
            return
        await self.rt.wait_converged()
        first_idle = IDLE_FIRST_S if spout.polled else IDLE_MAX_S
        idle = first_idle
        next_expiry_check = time.monotonic() + 0.1
        try:
            while not self.stopping:
                if time.monotonic() >= next_expiry_check:
                    self._expire()
                    next_expiry_check = time.monotonic() + min(0.1, self.timeout_s / 4)
                self._run_callbacks()
                emitted = False
                if self.rt.stop_requested and not self.drain_called:
                    self.drain_called = True
                    self._call(spout.drain)
                finished = spout.is_done() or spout.drained
                if self.active and len(self.pending) < self.max_pending and not finished:
                    before = self.metrics.emitted
                    t0 = time.perf_counter()
                    self._call(spout.next_tuple)
                    emitted = self.metrics.emitted > before
                    if emitted:
                        self.metrics.observe(time.perf_counter() - t0)
                await self.flush()
                if emitted:
                    idle = first_idle
                    continue
                if finished and not self.pending and not self.callbacks and not self.done_reported:
                    self.done_reported = True
                    self.rt.task_done(self.task)
                self.wake.clear()
                self.rt.write_now()
                if not await self.wake.wait(idle):
                    idle = min(idle * 2, IDLE_MAX_S)
        except FencedError:
            self.fenced = True
            raise
        finally:
            self.exited = True
            if self.refused is not None and not self.fenced:
                log.warning("%s (refused as this instance stopped)", self.refused)
            if not (self.fenced or self.crashed or self.refused):   # a stale (or crashed) one publishes nothing
                spout.close()


class BoltExecutor(Executor):
    kind = "bolt"

    def __init__(self, *a, queue_size: int, **k):
        super().__init__(*a, **k)
        self.inbound = Inbox(queue_size, on_release=self._release)
        self.auto_ack = bool(getattr(self.instance, "auto_ack", False))
        self._current: Tuple | None = None
        self.holding: dict[int, Tuple] = {}   # received, neither acked nor failed yet
        self.queue_taken = False              # fenced or ended, and its queue handed over or failed

    def emit(self, values, stream, anchors, direct_task):
        targets = self.rt.route(self.cid, stream, values, direct_task)
        self.metrics.emitted += 1
        if anchors is None and self.auto_ack and self._current is not None:
            anchors = [self._current]
        for t in targets:
            # as Storm: an edge per anchor, XORed into that anchor's ack and into the new
            # tuple's id for each of the anchor's roots. Two anchors of one tree (the
            # slices of one round) then each add their own edge; one edge for all would
            # cancel out of their acks and leave the new tuple's in the ledger for good
            ids: dict[int, int] = {}
            for a in anchors or ():
                edge = self._new_edge()
                for r in a.anchors:
                    a.acc[r] = a.acc.get(r, 0) ^ edge
                    ids[r] = ids.get(r, 0) ^ edge
            anchor_list = [[r, e] for r, e in ids.items()]
            self.out.append((t, DataMsg(self.rt.name, t, stream, self.task, values, anchor_list, self.rt.version)))
        return targets

    def ack(self, tup: Tuple) -> None:
        if tup.done:
            return
        tup.done = True
        self.holding.pop(id(tup), None)
        self.metrics.acked += 1
        for root, edge in tup.anchors.items():
            task = root_task(root)
            self.out.append((task, AckMsg(self.rt.name, task, root, edge ^ tup.acc.get(root, 0))))

    def fail(self, tup: Tuple) -> None:
        if tup.done:
            return
        tup.done = True
        self.holding.pop(id(tup), None)
        self.metrics.failed += 1
        for root in tup.anchors:
            task = root_task(root)
            self.out.append((task, FailMsg(self.rt.name, task, root)))

    async def _tick(self) -> None:
        try:
            r = self.instance.tick()
            if inspect.isawaitable(r):
                await r
        except FencedError:
            raise
        except Exception:  # noqa: BLE001 - e.g. the coordinator briefly unreachable: try again next tick
            self.metrics.errors += 1
            log.exception("bolt %s[%d] tick failed", self.cid, self.task)
        await self.flush()

    async def run(self) -> None:
        bolt: Bolt = self.instance
        if not self._start(lambda: bolt.prepare(self.ctx, BoltCollector(self)), "prepare"):
            return
        # A bolt's tick runs between its tuples once due: checked before each tuple, and a
        # timer wakes an idle bolt by queueing TICK. (One timer a tick, where a wait_for on
        # every tuple's get made a task and a timer a tuple: 6 a LeNet-5 round, README.)
        tick = getattr(bolt, "tick_interval_s", None)
        loop = asyncio.get_running_loop()
        next_tick = time.monotonic() + tick if tick else None
        timer = loop.call_later(tick, self._tick_due) if tick else None
        try:
            while True:
                if next_tick is not None and time.monotonic() >= next_tick:
                    await self._tick()
                    next_tick = time.monotonic() + tick
                    timer.cancel()
                    timer = loop.call_later(tick, self._tick_due)
                if self.inbound.empty():
                    self.rt.write_now()     # about to wait: what this task emitted leaves now
                    tup = await self.inbound.get()
                else:
                    tup = self.inbound.get_nowait()   # no coroutine per tuple while tuples wait
                if tup is TICK:
                    continue
                if tup is STOP:
                    return
                self._current = tup
                self.holding[id(tup)] = tup
                t0 = time.perf_counter()
                try:
                    r = bolt.execute(tup)
                    if r is not None and inspect.isawaitable(r):
                        await r
                    if self.auto_ack:
                        self.ack(tup)
                except FencedError:
                    raise
                except Exception:  # noqa: BLE001 - user code: fail the tuple, keep going
                    self.metrics.errors += 1
                    log.exception("bolt %s[%d] failed on %r", self.cid, self.task, tup)
                    self.fail(tup)
                self._current = None
                self.metrics.observe(time.perf_counter() - t0)
                await self.flush()
        except FencedError:
            self.fenced = True
            await self.abandon()
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if not (self.fenced or self.crashed):
                bolt.close()

    async def ended(self) -> None:
        """Nothing reads this bolt's queue any more: what is queued, and what comes later,
        is failed for replay (fencing.hand_over_queue), rather than filling the queue and
        holding up every stream that delivers here - those of other tasks and topologies
        from the same peer - and the topology's stop behind it."""
        log.warning("bolt %s[%d] of %s ended without being stopped: tuples for it are failed for replay",
                    self.cid, self.task, self.rt.name)
        await self.rt.hand_over_queue(self)

    async def send_now(self) -> None:
        """BoltCollector.send_now: flush, then one pass of the event loop."""
        await self.flush()
        await asyncio.sleep(0)

    async def abandon(self) -> None:
        """This instance was fenced: nothing it emitted leaves, and every tuple it took
        and did not ack (held by its bolt, or the one it was on) is failed, so its spout
        replays it now rather than at the message timeout. Queued tuples are left to
        TopologyRuntime.hand_over_queue."""
        self.out.clear()
        for tup in list(self.holding.values()):
            self.fail(tup)
        await self.flush()

    def _release(self, inbox: Inbox) -> None:
        """The queue has room again: the workers told to hold this task's tuples may send."""
        self.rt.release_holds(self.task, inbox)

    def _tick_due(self) -> None:
        if self.inbound.empty():            # else it sees the time before its next tuple
            self.inbound.put_nowait(TICK)

    def take_queue(self) -> list:
        self.queue_taken = True
        out = []
        while not self.inbound.empty():
            tup = self.inbound.get_nowait()
            if tup is not STOP and tup is not TICK:
                out.append(tup)
        return out

    async def fail_queue(self) -> list:
        queued = self.take_queue()
        for tup in queued:
            self.fail(tup)
        await self.flush()
        return queued
