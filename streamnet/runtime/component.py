"""What users subclass: Spout and Bolt, and what they are handed: Context, Tuple,
collectors.

A constructor stores plain parameters only (the component's `config` from the
topology); sockets, models and files are made in `open` / `prepare`, which run
on the worker. `execute` may be a coroutine: CPU-heavy work goes through
`await ctx.compute(fn, *args)`, which runs on the worker's compute threads and
keeps the event loop free for I/O.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
from typing import Any, Awaitable, Callable, NamedTuple

_FIGURE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
#: labels /metrics puts on every task's family itself
_TASK_LABELS = frozenset({"worker", "topology", "component", "task", "quantile"})
#: figures (name and label set) one task keeps: a label whose values grow with the
#: data (a label per sample or per round) would grow /status and /metrics without end
MAX_FIGURES = 1000


class Figure(NamedTuple):
    """A number a task reports through `Context.figure`."""
    name: str
    value: float
    type: str          # "gauge" | "counter"
    help: str
    labels: dict


class Component:
    #: output fields per stream: ["a", "b"] for the default stream, or {"stream": [...]}
    outputs: list[str] | dict[str, list[str]] = []

    def __init__(self, **config):
        self.config = config

    def restore(self, state) -> None:
        """Called after open/prepare with the last state this task saved through
        `ctx.save_state` (wherever it ran before), if it saved any."""


class Spout(Component):
    #: whether next_tuple must be polled. True (Storm's way) for a spout that may find
    #: something to emit that the engine does not see (a queue, a file, a clock): when it
    #: emits nothing it is called again after 1 ms, backing off to 50 ms. A spout that can
    #: only emit once one of its trees is acked or failed, or a state save of it landed
    #: (ctx.save_state_started), sets False: it is woken for each of those at once and
    #: otherwise called every 50 ms (for a drain, and anything else it polls)
    polled: bool = True

    def open(self, ctx: "Context", collector: "SpoutCollector") -> None:
        self.ctx, self.collector = ctx, collector

    def next_tuple(self) -> None:
        """Emit zero or more tuples. Called again as long as max_spout_pending allows."""

    def ack(self, msg_id) -> None:
        """The tuple tree of msg_id was fully processed."""

    def fail(self, msg_id) -> None:
        """The tuple tree of msg_id failed or timed out: replay it if it matters."""

    def is_done(self) -> bool:
        """A finite spout returns True once it will emit nothing more."""
        return False

    #: set by the default drain(): the executor then treats the spout as done
    drained: bool = False

    def drain(self) -> None:
        """The topology is asked to stop cleanly (`streamnet-submit kill --checkpoint`,
        SIGTERM to a worker). Finish what must be finished, then report is_done().
        The default stops emitting at once; pending trees still complete."""
        self.drained = True

    def close(self) -> None:
        pass


class Bolt(Component):
    #: ack each input after execute() returns (unless execute acked or failed it),
    #: and anchor every emit to the input - Storm's BasicBolt
    auto_ack: bool = False
    #: call tick() when this many seconds pass without input (Storm's tick tuples)
    tick_interval_s: float | None = None

    def prepare(self, ctx: "Context", collector: "BoltCollector") -> None:
        self.ctx, self.collector = ctx, collector

    def execute(self, tup: "Tuple") -> None | Awaitable[None]:
        raise NotImplementedError

    def tick(self) -> None | Awaitable[None]:
        """Called every tick_interval_s (when set) between inputs."""

    def close(self) -> None:
        pass


class BasicBolt(Bolt):
    auto_ack = True


class Tuple:
    __slots__ = ("values", "fields", "stream", "source", "source_task", "anchors", "acc", "done")

    def __init__(self, values: list, fields: list[str], stream: str, source: str, source_task: int,
                 anchors: dict[int, int]):
        self.values, self.fields, self.stream = values, fields, stream
        self.source, self.source_task, self.anchors = source, source_task, anchors
        self.acc: dict[int, int] = {}   # per root: XOR of edges emitted anchored to this tuple
        self.done = False               # acked or failed

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, int):
            return self.values[key]
        try:
            return self.values[self.fields.index(key)]
        except ValueError:
            raise KeyError(f"tuple from {self.source!r} has no field {key!r}; fields: {self.fields}") from None

    def as_dict(self) -> dict:
        return dict(zip(self.fields, self.values))

    def __repr__(self) -> str:
        return f"Tuple({self.source}:{self.stream} {self.values!r})"


class Context:
    """What a task knows about where it runs."""

    def __init__(self, *, topology: str, component: str, task: int, task_index: int, parallelism: int,
                 worker: str, config: dict, component_config: dict, component_tasks: Callable[[str], range],
                 compute: Callable[..., Awaitable], publish: Callable[[str, Any], None],
                 save_state: Callable[[Any], None], put_checkpoint: Callable[[dict], None] = None,
                 compute_share: Callable[[], int] = lambda: 1,
                 report_work: Callable[[float, float, float | None], None] = lambda items, seconds, share: None,
                 work_shares: Callable[[str], list[float] | None] = lambda component: None,
                 save_state_async: Callable[[Any], Awaitable[None]] | None = None,
                 fail_topology: Callable[[str], None] | None = None):
        self.topology, self.component, self.task = topology, component, task
        self.task_index, self.parallelism, self.worker = task_index, parallelism, worker
        self.config, self.component_config = config, component_config
        self._component_tasks, self._compute, self._publish = component_tasks, compute, publish
        self.retired = False
        self._save_state = save_state
        self._save_state_async = save_state_async
        self._on_saved: Callable[[Any], None] = lambda done: None   # the engine: wake the task's executor
        self._put_checkpoint = put_checkpoint
        self._compute_share = compute_share
        self._report_work, self._work_shares = report_work, work_shares
        self._fail_topology = fail_topology
        #: (name, labels) -> Figure: the named numbers this task reports (see `figure`)
        self.figures: dict[tuple, Figure] = {}
        self._figures_full = False      # a figure past MAX_FIGURES was left out (warned once)
        #: True when this task saved state before (it starts again after a failure or a
        #: move): restore(state) follows prepare(), which can skip what the state replaces
        self.restarting = False
        #: this instance's fencing token: it grows with every instance that claims the
        #: task's state, so an instance started later has a larger one. A task can send
        #: it with what it emits, and a receiver that has seen a larger one knows the
        #: sender was superseded (its next save would fail) and can refuse what it sends
        self.generation = 0
        self.log = logging.getLogger(f"streamnet.task.{component}.{task_index}")

    def component_tasks(self, component: str) -> list[int]:
        """Task ids of a component (for direct grouping)."""
        return list(self._component_tasks(component))

    def compute(self, fn: Callable, *args) -> Awaitable:
        """Run fn(*args) on the worker's compute threads; await the result."""
        return self._compute(fn, *args)

    def compute_share(self) -> int:
        """This task's share of the worker's compute threads: the pool's size divided
        among the tasks of this component that run on this worker (at least 1). A task
        whose one step can use several threads (training's compute units) asks before
        each step: a rebalance of threads, or a task moving in or out, changes it."""
        return self._compute_share()

    def report_work(self, items: float, seconds: float, share: float | None = None) -> None:
        """This task processed `items` work items in `seconds` of compute (a training
        unit: samples, and the seconds its round took). The worker keeps a moving
        window of these and publishes the speed; with the topology setting
        `balance="load"` the leader sets each task's work share from it. `share`: the
        work share the items were cut with, where the task knows it (work cut before a
        change of shares may be done after it); None: the assignment's current one."""
        self._report_work(items, seconds, share)

    def work_shares(self, component: str) -> list[float] | None:
        """The load balancer's current shares of `component`'s work, by task index
        (mean 1.0: a task at 1.5 should get half again its equal part), or None while
        none is set (equal shares). A task that hands out work (a spout) asks at each
        of its own boundaries, so a change takes effect there."""
        return self._work_shares(component)

    def save_state(self, state) -> None:
        """Persist this task's state in the coordinator; when the task starts again
        (here or on another worker, after a failure or a rebalance) the engine calls
        restore(state) with the last one saved. Keep it small (ZooKeeper nodes: < 1 MB)."""
        self._save_state(state)

    async def save_state_async(self, state) -> None:
        """save_state for a coroutine (an async execute): the event loop goes on while
        the coordinator answers, and no thread waits for it."""
        if self._save_state_async is None:
            self._save_state(state)
        else:
            await self._save_state_async(state)

    def save_state_started(self, state):
        """Start save_state(state) and return at once: a future whose done() says whether
        the coordinator has answered and whose result() returns None or raises what
        save_state would have (FencedError: another instance took the task over). For a
        task whose methods are not coroutines (a spout) that must not hold the event loop
        for a save. One at a time: start the next once this one is done. When it is, the
        engine calls the task again at once (a spout's next_tuple) rather than after its
        idle wait. Where the engine runs no event loop (a task tested on its own) the save
        is done before it returns."""
        if self._save_state_async is None:
            done: concurrent.futures.Future = concurrent.futures.Future()
            try:
                self._save_state(state)
                done.set_result(None)
            except Exception as e:  # noqa: BLE001 - handed to the caller, as save_state would raise it
                done.set_exception(e)
            return done
        saving = asyncio.ensure_future(self._save_state_async(state))
        saving.add_done_callback(self._on_saved)
        return saving

    def put_checkpoint(self, pointer: dict) -> None:
        """Record the topology's latest checkpoint (step, path, checksum) in the coordinator."""
        self._put_checkpoint(pointer)

    def figure(self, name: str, value: float, *, help: str, counter: bool = False, **labels: str) -> None:
        """Report a named number of this task (a loss, an epoch, seconds spent): it shows
        in the worker's /status under the task and as the Prometheus family
        `streamnet_<name>` on /metrics, labelled with the task and `labels`. A counter's
        name ends in `_total` and its value only grows. Cheap: call it as often as the
        number changes; the last value is what is read."""
        key = (name, tuple(sorted(labels.items())) if labels else ())
        kind = "counter" if counter else "gauge"
        known = self.figures.get(key)
        if known is None or known.type != kind:     # checked once per figure (a task reports several a round)
            if not _FIGURE_NAME.fullmatch(name) or counter != name.endswith("_total"):
                raise ValueError(f"figure name {name!r}: use [a-z_][a-z0-9_]*, ending in _total exactly for a "
                                 "counter")
            if _TASK_LABELS & set(labels):
                raise ValueError(f"figure {name!r}: labels {sorted(_TASK_LABELS & set(labels))} are set by the "
                                 "engine")
            if known is None and len(self.figures) >= MAX_FIGURES:
                if not self._figures_full:
                    self.log.warning("task %s of %s reports more than %d figures: %s%s and others like it are left "
                                "out of /status and /metrics", self.task, self.component, MAX_FIGURES, name,
                                labels)
                self._figures_full = True
                return
            self.figures[key] = Figure(name, float(value), kind, help, dict(labels))
        else:
            self.figures[key] = Figure(name, float(value), kind, help, known.labels)

    def figures_status(self) -> list[dict]:
        """The figures as plain data, for /status."""
        return [f._asdict() for f in self.figures.values()]

    def publish(self, key: str, value) -> None:
        """Store a (small) result under the topology's results, readable by clients."""
        if not self.retired:
            self._publish(f"{self.component}.{self.task_index}.{key}", value)

    def fail_topology(self, why: str) -> None:
        """The topology cannot go on (a training run that diverged, say): `why`, after the
        component, task and worker, goes where clients look, as for a task that could not
        start; `submit --wait` and `train` then kill the topology and exit 1 with it. The
        task itself runs on until then: it should stop sending what would not help."""
        self.log.error("task %d of %s fails its topology: %s", self.task, self.component, why)
        if not self.retired and self._fail_topology is not None:
            self._fail_topology(why)

    def retire(self) -> None:
        """This task instance is stale: its task was placed elsewhere while its worker's
        coordinator session expired. What it publishes from now on, as it stops, is
        dropped: the instance that runs the task publishes the same keys, and a stale
        one's results written after them - a worker cut off from the coordinator writes
        late - would replace a finished run's."""
        self.retired = True


class SpoutCollector:
    def __init__(self, executor):
        self._x = executor

    def emit(self, values: list, stream: str = "default", msg_id=None, direct_task: int | None = None) -> list[int]:
        """Emit a tuple; with msg_id it is tracked, and ack/fail(msg_id) will be called."""
        return self._x.emit(list(values), stream, msg_id, direct_task)


class BoltCollector:
    def __init__(self, executor):
        self._x = executor

    def emit(self, values: list, stream: str = "default", anchors: "Tuple | list[Tuple] | None" = None,
             direct_task: int | None = None) -> list[int]:
        if isinstance(anchors, Tuple):
            anchors = [anchors]
        return self._x.emit(list(values), stream, anchors, direct_task)

    def ack(self, tup: Tuple) -> None:
        self._x.ack(tup)

    def fail(self, tup: Tuple) -> None:
        self._x.fail(tup)

    async def send_now(self) -> None:
        """Hand what this bolt has emitted, acked and failed so far to delivery now, not
        when execute returns, and let the event loop run what that wakes (the link to a
        peer, a bolt here) before the bolt goes on: for a result whose receivers wait,
        ahead of bookkeeping they do not wait for. Emitted tuples cannot be withdrawn
        after this (a task fenced later in the same execute has sent them)."""
        await self._x.send_now()
