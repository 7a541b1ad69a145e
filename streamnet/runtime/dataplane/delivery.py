"""Delivery: carries out routing.py's decisions for one worker - into a local task's
queue, onto the link to a peer worker (with backpressure), into the parking
lot, or back to the spouts as failed trees.

Backpressure is per task. A local emitter waits for room in the bolt's queue. A
worker whose tuples fill the queue past three quarters is told to hold that task's
tuples (HoldMsg), and what it had already sent waits, past a full queue, in the
task's overflow (inbox.py); its emitters to that task wait until released (inbox.py
says when), and its stream goes on carrying everything else. A hold is said again
every HOLD_LEASE_S / 2 while it lasts, and lapses on the sender after HOLD_LEASE_S
without it (a release lost, an instance gone)."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp

from .. import codec
from ..component import Tuple
from ..messages import AckMsg, DataMsg, DataRun, FailMsg, HoldMsg, Message
from . import routing
from .executor import BoltExecutor, SpoutExecutor
from .transport import Auth, PeerLink

log = logging.getLogger(__name__)

#: a sender waiting on a held task looks this often whether the task moved or the
#: worker is closing
HELD_CHECK_S = 1.0
#: a hold lapses this long after the peer last said it (a release lost with a stream,
#: a hold that arrived after its release, an instance stopped before it released): the
#: sender sends again, and a task still full tells it to hold again
HOLD_LEASE_S = 2.0


class Delivery:
    def __init__(self, *, worker_id: str, auth: Auth, session: aiohttp.ClientSession, limits: codec.Limits,
                 runtimes: dict, on_unreachable: Callable[[str, str | None], None], tls=None):
        self.id, self.auth, self.session, self.limits = worker_id, auth, session, limits
        self.runtimes = runtimes            # the worker's: topology name -> TopologyRuntime
        self.on_unreachable = on_unreachable
        self.tls = tls                      # TlsConfig: streams to peers run TLS (tls.py)
        self.links: dict[str, PeerLink] = {}
        self.dropped = 0                    # inbound messages for no runtime or no task here
        self.closing = False
        self._retiring: set[asyncio.Task] = set()   # closes of links replaced or to workers gone
        #: (peer, topology, task) -> (resolved when that peer's bolt task releases its
        #: hold, the loop's time at which the hold lapses)
        self.held: dict[tuple[str, str, int], tuple[asyncio.Future, float]] = {}
        self.holds = 0                      # holds this worker was told of (status)
        self.lapsed = 0                     # of those, ended by their lease, not a release

    def link(self, peer: str, url: str) -> PeerLink:
        link = self.links.get(peer)
        if link is None or link.url != url.rstrip("/"):
            if link is not None:
                self._retire(link)
            link = self.links[peer] = PeerLink(sender=self.id, peer=peer, url=url, auth=self.auth,
                                               session=self.session, limits=self.limits, tls=self.tls)
            link.on_unreachable = self.on_unreachable
            link.start()
        return link

    def prune(self, addressed: set[str]) -> None:
        """Close the links to peers that no assignment here names any more (a worker that
        left for good): each kept reconnecting every 2 s for the life of the process, its
        queue holding what was sent to it. What is queued goes with it; those tuples'
        spouts replay them, as they do for a worker that dies."""
        for peer in [p for p in self.links if p not in addressed]:
            link = self.links.pop(peer)
            queued = link.queue.qsize()
            log.info("worker %s: closing the link to %s, which no topology here addresses any more%s", self.id,
                     peer, f" ({queued} message(s) queued to it dropped)" if queued else "")
            self._retire(link)
            self.peer_restarted(peer)

    def _retire(self, link: PeerLink) -> None:
        task = asyncio.get_running_loop().create_task(link.close(0.0))
        self._retiring.add(task)            # referenced until done (the loop holds tasks weakly)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        self.closing = True
        await asyncio.gather(*(l.close() for l in self.links.values()), *self._retiring)

    # -- outbound: emitted by a task here -------------------------------------------------
    async def send(self, rt, target: int, msg: Message) -> None:
        decision = routing.outbound(msg, rt.view)
        if decision == routing.DELIVER:
            await self._deliver_local(rt, rt.executors[target], msg)
        elif decision == routing.PARK:
            rt.park(msg)
        elif decision == routing.FAIL_ROOTS:
            rt.dropped += 1
            await self._fail_roots(rt, msg)
        else:
            peer = rt.view.task_worker[target]
            if self.held and (peer, rt.name, target) in self.held and type(msg) in (DataMsg, DataRun):
                await self._to_held_task(rt, target, peer, msg)
                return
            q = self.link(peer, rt.view.addresses[peer]).queue
            if q.full():
                await self._to_full_peer(rt, target, peer, q, msg)
            else:
                q.put_nowait(msg)     # the common case: no suspension point, no coroutine more

    def write_now(self) -> None:
        """Send what the links have queued now, from the caller's turn of the event loop
        (PeerLink.write_now): a task calls it before it waits, which spares each of its
        frames a pass of the loop."""
        for link in self.links.values():
            if link.write_due:
                link.write_now()

    async def _to_full_peer(self, rt, target: int, peer: str, q, msg: Message) -> None:
        # backpressure: wait for the stream to drain - but not on a peer that stopped
        # draining because it is cut off and its tasks moved: look again every second
        while True:
            try:
                await asyncio.wait_for(q.put(msg), 1.0)
                return
            except asyncio.TimeoutError:
                if self.closing:
                    rt.dropped += 1
                    return
                now = rt.view.task_worker.get(target)
                if now != peer:
                    log.warning("worker %s: task %d moved from %s (not draining) to %s while a tuple waited; "
                                "sending it there", self.id, target, peer, now)
                    await self.send(rt, target, msg)
                    return

    async def _to_held_task(self, rt, target: int, peer: str, msg: Message) -> None:
        # the task's worker asked us to hold its tuples: wait for the release or the
        # hold's lapse - and look every second whether the task moved, or this worker
        # is closing
        key = (peer, rt.name, target)
        loop = asyncio.get_running_loop()
        while (hold := self.held.get(key)) is not None:
            fut, until = hold
            left = until - loop.time()
            if left <= 0:
                # not said again (a release lost with a stream, an instance that stopped):
                # send, and be told again if the task is still full
                self._end_hold(key)
                self.lapsed += 1
                break
            try:
                await asyncio.wait_for(asyncio.shield(fut), min(HELD_CHECK_S, left))
            except asyncio.TimeoutError:
                if self.closing:
                    rt.dropped += 1
                    return
                if rt.view.task_worker.get(target) != peer:
                    self._end_hold(key)                  # moved: a hold there is the new worker's to say
                    break
        await self.send(rt, target, msg)

    def _on_hold(self, msg: HoldMsg, sender: str | None) -> None:
        """A peer's bolt task holds (or releases) the tuples we send it. A hold for a
        topology not here, or a task our assignment does not place on that peer, is
        stale and ignored; a hold said again renews its lease."""
        key = (sender, msg.topology, msg.target)
        if not msg.held:
            self._end_hold(key)
            return
        rt = self.runtimes.get(msg.topology)
        if rt is None or rt.view.task_worker.get(msg.target) != sender:
            return
        loop = asyncio.get_running_loop()
        hold = self.held.get(key)
        if hold is None:
            self.holds += 1
        self.held[key] = (hold[0] if hold else loop.create_future(), loop.time() + HOLD_LEASE_S)

    def peer_restarted(self, peer: str) -> None:
        """A new stream from `peer` (or its link closed): what it held may have been
        released on a stream that broke, so its holds end; where its tasks are still
        full, our next tuples reach their overflows and it tells us again."""
        self._end_holds(lambda key: key[0] == peer)

    def forget(self, topology: str) -> None:
        """The topology left this worker: its holds end (one submitted again under the
        name starts with none)."""
        self._end_holds(lambda key: key[1] == topology)

    def _end_holds(self, which) -> None:
        for key in [k for k in self.held if which(k)]:
            self._end_hold(key)

    def _end_hold(self, key) -> None:
        hold = self.held.pop(key, None)
        if hold is not None and not hold[0].done():
            hold[0].set_result(None)

    def _tell_hold(self, rt, ex, sender: str) -> None:
        """Tuples from `sender` filled bolt task ex's queue past HIGH, or went into its
        overflow: it should hold them (told again after inbox.RETELL_S if they keep
        coming, and every HOLD_LEASE_S / 2 while the hold lasts, so that it does not lapse)."""
        inbox = ex.inbound
        if inbox.tell(sender):
            self._signal(rt, sender, HoldMsg(rt.name, ex.task, True))
            if inbox.renewal is None:
                inbox.renewal = asyncio.get_running_loop().call_later(HOLD_LEASE_S / 2, self._renew, rt, ex)

    def _renew(self, rt, ex) -> None:
        """Say the holds of bolt task ex again while they last and its instance is the
        task's here; once it is not (stopped, moved, fenced), they lapse on the senders."""
        inbox = ex.inbound
        inbox.renewal = None
        if not inbox.told or ex.queue_taken or rt.executors.get(ex.task) is not ex or self.closing:
            return
        for sender in inbox.renew():
            self._signal(rt, sender, HoldMsg(rt.name, ex.task, True))
        inbox.renewal = asyncio.get_running_loop().call_later(HOLD_LEASE_S / 2, self._renew, rt, ex)

    def release(self, rt, task: int, inbox) -> None:
        """Bolt task `task`'s queue is down to LOW, its overflow empty (or it stopped):
        the workers told to hold may send."""
        if inbox.renewal is not None:
            inbox.renewal.cancel()
            inbox.renewal = None
        for sender in inbox.released():
            self._signal(rt, sender, HoldMsg(rt.name, task, False))

    def _signal(self, rt, peer: str, msg: HoldMsg) -> None:
        address = rt.view.addresses.get(peer)
        if address is None or self.closing:
            return                      # not a worker of this assignment (any more)
        self.link(peer, address).queue.put_control(msg)

    # -- inbound: from a peer's stream ------------------------------------------------------
    def receive_now(self, msg: Message, sender: str | None = None) -> bool:
        """receive() where nothing has to wait: True when done; False, having done
        nothing, when the message must go through receive() (a bolt's full queue, trees
        to fail). The stream server calls it from its socket's callback."""
        if type(msg) is HoldMsg:
            self._on_hold(msg, sender)
            return True
        rt = self.runtimes.get(msg.topology)
        if rt is None:
            self.dropped += 1      # not ours (any more): the sender's view is stale
            return True
        decision = routing.inbound(msg, rt.view, sender)
        if decision == routing.DELIVER:
            return self._deliver_now(rt, rt.executors[msg.target], msg, sender)
        if decision == routing.PARK:
            rt.park(msg)   # the sender applied a newer assignment than we have: hold it until we do
        elif decision == routing.STALE:
            self._count_stale(rt, msg, sender)
        else:
            return False
        return True

    async def receive(self, msg: Message, sender: str | None = None) -> None:
        while not self.receive_now(msg, sender):
            rt = self.runtimes[msg.topology]
            if routing.inbound(msg, rt.view, sender) == routing.FAIL_ROOTS:
                self.dropped += 1
                await self._fail_roots(rt, msg)
                return
            ex = rt.executors[msg.target]
            if isinstance(ex, BoltExecutor) and not ex.queue_taken and ex.inbound.overflow_full():
                # this stream waits for the overflow (inbox.py), then routes the message
                # again: its task may have moved or stopped meanwhile
                await ex.inbound.overflow_room()
                continue
            await self._deliver_local(rt, ex, msg)
            return

    async def deliver_parked(self, rt) -> None:
        """Tuples that arrived for tasks of an assignment we had not applied yet: they
        came from other workers, so they go behind a bolt's overflow rather than wait for
        room as a local emitter does. (Tuples from the same senders that arrive on the
        streams once the task is placed here, before these are delivered, go first.)"""
        for msg in rt.unpark():
            decision = routing.parked(msg, rt.view)
            if decision == routing.DELIVER:
                ex = rt.executors[msg.target]
                if not self._deliver_now(rt, ex, msg, remote=True):
                    await self._deliver_local(rt, ex, msg)
            elif decision == routing.PARK:
                rt.park(msg)
            else:
                rt.dropped += 1
                await self._fail_roots(rt, msg)

    def _deliver_now(self, rt, ex, msg: Message, sender: str | None = None, remote: bool = False) -> bool:
        """_deliver_local where nothing has to wait: False, having done nothing, where
        a bolt's queue has no room for the message's tuples or was handed over. Tuples
        from another worker (`sender`, or `remote`: parked) that find no room go into the
        overflow, and the sender (where known) is told to hold - unless the overflow is at
        its bound."""
        if isinstance(msg, (DataMsg, DataRun)) and isinstance(ex, BoltExecutor):
            tuples = _tuples(rt, msg)
            if tuples is None:
                rt.dropped += len(msg) if isinstance(msg, DataRun) else 1
                return True
            q = ex.inbound
            if ex.queue_taken:
                return False
            if not q.has_room(len(tuples)):
                if (sender is None and not remote) or q.overflow_full():
                    return False
                q.spill(tuples)
                if sender is not None:
                    self._tell_hold(rt, ex, sender)
                return True
            for tup in tuples:
                q.put_nowait(tup)
            if sender is not None and q.above_high():
                self._tell_hold(rt, ex, sender)
        elif isinstance(msg, AckMsg) and isinstance(ex, SpoutExecutor):
            ex.on_ack(msg.root, msg.xor)
        elif isinstance(msg, FailMsg) and isinstance(ex, SpoutExecutor):
            ex.on_fail(msg.root)
        else:
            rt.dropped += 1
        return True

    async def _deliver_local(self, rt, ex, msg: Message) -> None:
        if self._deliver_now(rt, ex, msg):
            return
        # a bolt's queue that is full (backpressure), or that an instance fenced or ended handed over
        q = ex.inbound
        for tup in _tuples(rt, msg):
            if ex.queue_taken and q.full():     # nobody reads it: a run longer than the queue would wait
                await rt.hand_over_queue(ex)
            await q.put(tup)
        if ex.queue_taken:   # an instance fenced or ended, whose queue was already dealt with
            await rt.hand_over_queue(ex)
            # a pass of the event loop: a local spout whose tuples fail at once here replays
            # them at once, and that chain of calls never waits - without this it held the
            # loop, and the topology's kill, for ever
            await asyncio.sleep(0)

    async def _fail_roots(self, rt, msg: Message) -> None:
        """A tuple that cannot reach its task fails its trees: their spouts replay them
        now, not after message_timeout_s."""
        for fail in routing.failures(msg, rt.view):
            await self.send(rt, fail.target, fail)

    def _count_stale(self, rt, msg: DataMsg | DataRun, sender: str) -> None:
        before = rt.stale
        rt.stale += len(msg) if isinstance(msg, DataRun) else 1
        if rt.stale <= 5 or rt.stale // 1000 > before // 1000:
            log.warning("worker %s: dropped a stale tuple (%d so far) of %s from task %d on %s: assignment v%d "
                        "places that task on %s; the sender is at v%d", self.id, rt.stale, rt.name, msg.source,
                        sender, rt.version, rt.view.task_worker.get(msg.source), msg.version)

    def status(self) -> dict:
        return {p: l.status() for p, l in self.links.items()}

    def holds_status(self) -> dict:
        """The peers' tasks this worker holds tuples for now, how many holds it was told
        of (a lapsed hold said again counts again), and how many of them lapsed."""
        return {"now": sorted(f"{p}/{t}[{k}]" for p, t, k in self.held), "told": self.holds,
                "lapsed": self.lapsed}


def _tuples(rt, msg: DataMsg | DataRun) -> list[Tuple] | None:
    """The tuples a message carries to a bolt here; None if its stream is unknown."""
    src = rt.task_cid.get(msg.source)
    fields = rt.fields.get(src, {}).get(msg.stream)
    if fields is None:
        return None
    if isinstance(msg, DataMsg):
        return [Tuple(msg.values, fields, msg.stream, src, msg.source, dict(msg.anchors) if msg.anchors else {})]
    return [Tuple(values, fields, msg.stream, src, msg.source, dict(anchors) if anchors else {})
            for values, anchors in zip(msg.values, msg.anchors)]
