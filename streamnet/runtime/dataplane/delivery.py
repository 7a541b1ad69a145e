"""Delivery: carries out routing.py's decisions for one worker - into a local task's
queue, onto the link to a peer worker (with backpressure), into the parking
lot, or back to the spouts as failed trees."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import aiohttp

from .. import codec
from ..component import Tuple
from ..messages import AckMsg, DataMsg, DataRun, FailMsg, Message
from . import routing
from .executor import BoltExecutor, SpoutExecutor
from .transport import Auth, PeerLink

log = logging.getLogger(__name__)


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

    # -- inbound: from a peer's stream ------------------------------------------------------
    def receive_now(self, msg: Message, sender: str | None = None) -> bool:
        """receive() where nothing has to wait: True when done; False, having done
        nothing, when the message must go through receive() (a bolt's full queue, trees
        to fail). The stream server calls it from its socket's callback."""
        rt = self.runtimes.get(msg.topology)
        if rt is None:
            self.dropped += 1      # not ours (any more): the sender's view is stale
            return True
        decision = routing.inbound(msg, rt.view, sender)
        if decision == routing.DELIVER:
            return self._deliver_now(rt, rt.executors[msg.target], msg)
        if decision == routing.PARK:
            rt.park(msg)   # the sender applied a newer assignment than we have: hold it until we do
        elif decision == routing.STALE:
            self._count_stale(rt, msg, sender)
        else:
            return False
        return True

    async def receive(self, msg: Message, sender: str | None = None) -> None:
        if self.receive_now(msg, sender):
            return
        rt = self.runtimes[msg.topology]
        if routing.inbound(msg, rt.view, sender) == routing.FAIL_ROOTS:
            self.dropped += 1
            await self._fail_roots(rt, msg)
        else:
            await self._deliver_local(rt, rt.executors[msg.target], msg)

    async def deliver_parked(self, rt) -> None:
        """Tuples that arrived for tasks of an assignment we had not applied yet."""
        for msg in rt.unpark():
            decision = routing.parked(msg, rt.view)
            if decision == routing.DELIVER:
                await self._deliver_local(rt, rt.executors[msg.target], msg)
            elif decision == routing.PARK:
                rt.park(msg)
            else:
                rt.dropped += 1
                await self._fail_roots(rt, msg)

    def _deliver_now(self, rt, ex, msg: Message) -> bool:
        """_deliver_local where nothing has to wait: False, having done nothing, where
        a bolt's queue has no room for the message's tuples or was handed over."""
        if isinstance(msg, (DataMsg, DataRun)) and isinstance(ex, BoltExecutor):
            tuples = _tuples(rt, msg)
            if tuples is None:
                rt.dropped += len(msg) if isinstance(msg, DataRun) else 1
                return True
            q = ex.inbound
            if ex.queue_taken or (q.maxsize > 0 and q.maxsize - q.qsize() < len(tuples)):
                return False
            for tup in tuples:
                q.put_nowait(tup)
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
