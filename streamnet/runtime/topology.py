"""Topologies in Storm's terms, as plain data.

    b = TopologyBuilder("wordcount")
    b.add_spout("sentences", "streamnet.examples.wordcount:SentenceSpout", parallelism=1, count=1000)
    b.add_bolt("split", "streamnet.examples.wordcount:SplitBolt", parallelism=2).shuffle("sentences")
    b.add_bolt("count", "streamnet.examples.wordcount:CountBolt", parallelism=3).fields("split", "word")
    topology = b.build()

A Topology is a JSON/msgpack-serialisable dict underneath (`to_dict`,
`from_dict`); components are named by the import path of installed code, and
code never travels over the wire. A worker imports only from the module prefixes
its operator allows (`streamnet-worker --allow-module`, default
DEFAULT_ALLOWED_MODULES), and instantiates only Spout/Bolt subclasses and
groupings with a `choose(values, targets)` method: whoever can write the
coordinator cannot make it run `subprocess:Popen`. Tasks are numbered globally in component
order: component i owns the task ids [first, first + parallelism).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from ..errors import StreamnetError
from .names import name_problem
from .values import whole

GROUPINGS = ("shuffle", "fields", "all", "global", "direct", "local_or_shuffle", "custom")
DEFAULT_CONFIG = {
    "max_spout_pending": 1000,     # un-acked roots per spout task before next_tuple pauses
    "message_timeout_s": 30.0,     # a root not acked by then is failed and replayed
    "queue_size": 1024,            # inbound tuples per task (backpressure beyond)
    "balance": "static",           # "load": the leader sets work shares and threads by measured speed
    # the components' parallelism is part of what the topology computes (a training run's
    # units and sync slices): a rebalance may move its tasks and set threads, not change it
    "fixed_parallelism": False,
}
BALANCE_MODES = ("static", "load")
#: tasks in one topology, all components together: its assignment (a worker per task)
#: is one ZooKeeper node, which holds at most 1 MB; 50,000 tasks passed that, and the
#: leader's write of it failed on every pass
MAX_TASKS = 10_000


#: the project's own packages: what a worker runs unless its operator allows more
DEFAULT_ALLOWED_MODULES = ("streamnet.examples", "streamnet.training")


class TopologyError(StreamnetError):
    """A topology that cannot run as written; the message says what to change."""


def module_allowed(module: str, allow) -> bool:
    """`module` is one of the prefixes in `allow` or inside one ("a.b" allows "a.b"
    and "a.b.c", not "a.bc"; a prefix ending in "." allows what starts with it)."""
    return any(module == p.rstrip(".") or module.startswith(p if p.endswith(".") else p + ".")
               for p in allow if p)


def resolve(path: str, allow=None):
    """Import "package.module:Name". With `allow` (module prefixes), a module outside
    them is refused before it is imported: importing runs its code. None is for
    paths the caller wrote itself (a client's own topology function)."""
    mod, _, name = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not isinstance(path, str) or path.count(":") != 1 or not mod or not name:
        # an empty module (":x") was a ValueError from importlib, shown as a traceback
        raise TopologyError(f"a path must be 'package.module:Class' (a topology function's "
                            f"'package.module:function'); got {path!r}")
    if allow is not None and not module_allowed(mod, allow):
        raise TopologyError(f"class {path!r} is not allowed: module {mod!r} is outside the allowed prefixes "
                            f"{', '.join(allow) or '(none)'}; to run it, start the workers with "
                            f"--allow-module {mod.split('.')[0]}")
    try:
        obj = getattr(importlib.import_module(mod), name)
    except ImportError as e:
        raise TopologyError(f"cannot import {mod!r} for {path!r}: {e}") from None
    except AttributeError:
        raise TopologyError(f"module {mod!r} has no {name!r}") from None
    return obj


def resolve_component(path: str, kind: str, allow=None) -> type:
    """The Spout (kind "spout") or Bolt subclass at `path`, or TopologyError naming it."""
    from .component import Bolt, Spout
    cls = resolve(path, allow)
    want = Spout if kind == "spout" else Bolt
    if not (isinstance(cls, type) and issubclass(cls, want)):
        raise TopologyError(f"{kind} class {path} is not a {want.__name__} subclass")
    return cls


def resolve_grouping(path: str, allow=None) -> type:
    """A custom grouping: a class whose instances have choose(values, targets)."""
    cls = resolve(path, allow)
    if not (isinstance(cls, type) and callable(getattr(cls, "choose", None))):
        raise TopologyError(f"custom grouping {path} is not a class with a choose(values, targets) method")
    return cls


def declared_outputs(cls) -> dict[str, list[str]]:
    out = getattr(cls, "outputs", None) or {}
    return {"default": list(out)} if isinstance(out, (list, tuple)) else {k: list(v) for k, v in out.items()}


@dataclass
class Declarer:
    """Returned by add_bolt: subscribe the bolt to streams, Storm style."""
    _spec: dict

    def _sub(self, component: str, grouping: dict, stream: str) -> "Declarer":
        self._spec["inputs"].append({"component": component, "stream": stream, "grouping": grouping})
        return self

    def shuffle(self, component: str, stream: str = "default") -> "Declarer":
        return self._sub(component, {"type": "shuffle"}, stream)

    def fields(self, component: str, *keys: str, stream: str = "default") -> "Declarer":
        if not keys:
            raise TopologyError(f"bolt {self._spec['id']!r}: fields grouping on {component!r} needs at least one field")
        return self._sub(component, {"type": "fields", "fields": list(keys)}, stream)

    def all(self, component: str, stream: str = "default") -> "Declarer":
        return self._sub(component, {"type": "all"}, stream)

    def global_(self, component: str, stream: str = "default") -> "Declarer":
        return self._sub(component, {"type": "global"}, stream)

    def direct(self, component: str, stream: str = "default") -> "Declarer":
        return self._sub(component, {"type": "direct"}, stream)

    def local_or_shuffle(self, component: str, stream: str = "default") -> "Declarer":
        return self._sub(component, {"type": "local_or_shuffle"}, stream)

    def custom(self, component: str, grouping: str, stream: str = "default", **config) -> "Declarer":
        """A grouping class by import path: `choose(values, targets, context) -> list of targets`."""
        return self._sub(component, {"type": "custom", "class": grouping, "config": config}, stream)


def spec_version(spec: dict) -> int:
    """A spec's version (0 until a rebalance changes its shape), checked: "1" or null
    (a spec written past the client) was a TypeError on every worker, or an assignment
    the leader wrote again on every pass."""
    v = spec.get("version", 0)
    if not (whole(v) and v >= 0):
        raise TopologyError(f"topology {spec.get('name')!r}: version must be a whole number >= 0; got {v!r}")
    return v


def parallelism_fixed(spec: dict) -> bool:
    """Whether a rebalance may not change the components' parallelism (a training run's
    units and sync slices follow its configuration); threads may still change."""
    return bool(spec.get("config", {}).get("fixed_parallelism"))


def _check_name(name) -> None:
    problem = name_problem(name)
    if problem:
        raise TopologyError(f"a topology's name {problem}")


class TopologyBuilder:
    def __init__(self, name: str):
        _check_name(name)
        self.name = name
        self._components: list[dict] = []

    def _add(self, kind: str, cid: str, component: str, parallelism: int, config: dict) -> dict:
        if any(c["id"] == cid for c in self._components):
            raise TopologyError(f"duplicate component id {cid!r}; ids must be unique")
        if not whole(parallelism) or parallelism < 1:
            raise TopologyError(f"{kind} {cid!r}: parallelism must be an integer >= 1; got {parallelism!r}")
        spec = {"id": cid, "kind": kind, "class": component, "parallelism": parallelism,
                "config": dict(config), "inputs": []}
        self._components.append(spec)
        return spec

    def add_spout(self, cid: str, component: str, parallelism: int = 1, **config) -> None:
        self._add("spout", cid, component, parallelism, config)

    def add_bolt(self, cid: str, component: str, parallelism: int = 1, **config) -> Declarer:
        return Declarer(self._add("bolt", cid, component, parallelism, config))

    def build(self, *, allow_cycles: bool = False, check_classes: bool = True, **config) -> "Topology":
        unknown = set(config) - set(DEFAULT_CONFIG) - {"extra"}
        if unknown:
            raise TopologyError(f"unknown topology setting(s) {sorted(unknown)}; known: {sorted(DEFAULT_CONFIG)}")
        t = Topology({"name": self.name, "components": [dict(c, inputs=list(c["inputs"])) for c in self._components],
                      "config": {**DEFAULT_CONFIG, **config}, "allow_cycles": allow_cycles})
        t.validate(check_classes=check_classes)
        return t


@dataclass
class Topology:
    spec: dict
    _tasks: dict = field(default_factory=dict, repr=False)

    # -- plain data ---------------------------------------------------------------
    def to_dict(self) -> dict:
        return self.spec

    @classmethod
    def from_dict(cls, spec: dict, check_classes: bool = False, allow=None) -> "Topology":
        t = cls(spec)
        t.validate(check_classes=check_classes, allow=allow)
        return t

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def config(self) -> dict:
        return self.spec["config"]

    @property
    def components(self) -> list[dict]:
        return self.spec["components"]

    def component(self, cid: str) -> dict:
        for c in self.components:
            if c["id"] == cid:
                return c
        raise TopologyError(f"unknown component {cid!r}; known: {', '.join(c['id'] for c in self.components)}")

    # -- tasks --------------------------------------------------------------------
    def task_ranges(self) -> dict[str, range]:
        if not self._tasks:
            start = 0
            for c in self.components:
                self._tasks[c["id"]] = range(start, start + c["parallelism"])
                start += c["parallelism"]
        return self._tasks

    def tasks(self, cid: str) -> range:
        return self.task_ranges()[cid]

    @property
    def num_tasks(self) -> int:
        return sum(c["parallelism"] for c in self.components)

    def task_component(self, task: int) -> dict:
        for c in self.components:
            if task in self.tasks(c["id"]):
                return c
        raise TopologyError(f"no task {task} in topology {self.name!r}")

    def subscribers(self, cid: str, stream: str) -> list[tuple[dict, dict]]:
        """(bolt spec, grouping) of every subscription to cid's stream, in component order."""
        return [(c, i["grouping"]) for c in self.components for i in c["inputs"]
                if i["component"] == cid and i["stream"] == stream]

    # -- validation ---------------------------------------------------------------
    def validate(self, check_classes: bool = True, allow=None) -> None:
        """Check the shape; with check_classes also import and check every class (from
        the module prefixes in `allow`, when given)."""
        _check_name(self.spec.get("name"))
        spec_version(self.spec)
        ids = [c["id"] for c in self.components]
        if not ids:
            raise TopologyError(f"topology {self.name!r} has no components")
        if len(set(ids)) != len(ids):
            raise TopologyError(f"duplicate component ids in {ids}")
        if not any(c["kind"] == "spout" for c in self.components):
            raise TopologyError(f"topology {self.name!r} has no spout; add one with add_spout()")
        total = sum(c["parallelism"] for c in self.components if isinstance(c["parallelism"], int))
        if total > MAX_TASKS:
            raise TopologyError(f"topology {self.name!r} has {total} tasks; at most {MAX_TASKS} "
                                "(its assignment must fit a ZooKeeper node)")
        for c in self.components:
            if c["kind"] not in ("spout", "bolt"):
                raise TopologyError(f"component {c['id']!r}: kind must be spout or bolt")
            if not whole(c["parallelism"]) or c["parallelism"] < 1:
                raise TopologyError(f"component {c['id']!r}: parallelism must be >= 1")
            if c["kind"] == "spout" and c["inputs"]:
                raise TopologyError(f"spout {c['id']!r} cannot subscribe to streams")
            for i in c["inputs"]:
                if i["component"] not in ids:
                    raise TopologyError(f"bolt {c['id']!r} subscribes to unknown component {i['component']!r}; "
                                        f"known: {', '.join(ids)}")
                g = i["grouping"]
                if g.get("type") not in GROUPINGS:
                    raise TopologyError(f"bolt {c['id']!r}: unknown grouping {g.get('type')!r}; "
                                        f"known: {', '.join(GROUPINGS)}")
        if not isinstance(self.config.get("fixed_parallelism", False), bool):
            raise TopologyError(f"fixed_parallelism must be true or false; got {self.config['fixed_parallelism']!r}")
        balance = self.config.get("balance", "static")
        if balance not in BALANCE_MODES:
            raise TopologyError(f"balance must be one of {', '.join(BALANCE_MODES)}; got {balance!r}")
        self._check_numbers()
        if not self.spec.get("allow_cycles"):
            self._check_acyclic()
        if check_classes:
            self._check_classes(allow)

    def _check_numbers(self) -> None:
        """The engine's settings, each a number it can run with: checked here, where
        submit, the scheduler and every worker parse a spec, rather than when a worker
        builds a task (queue_size "big" raised there, half-way through applying an
        assignment; max_spout_pending 0 or a timeout <= 0 left the run waiting for ever)."""
        def number(key: str, kind, least, what: str):
            v = self.config.get(key, DEFAULT_CONFIG[key])
            if isinstance(v, bool) or not isinstance(v, kind) or not least <= v < float("inf"):
                raise TopologyError(f"{key} must be {what}; got {v!r}")
        number("max_spout_pending", int, 1, "a whole number >= 1")
        number("queue_size", int, 1, "a whole number >= 1 (tuples a task's queue holds)")
        number("message_timeout_s", (int, float), 1e-3, "a number of seconds > 0")

    def _check_acyclic(self) -> None:
        edges = {c["id"]: [i["component"] for i in c["inputs"]] for c in self.components}
        state: dict[str, int] = {}

        def visit(n, trail):
            if state.get(n) == 1:
                cycle = trail[trail.index(n):] + [n]
                raise TopologyError("the topology has a cycle " + " <- ".join(cycle)
                                    + "; pass allow_cycles=True to build() if it is intended")
            if state.get(n) == 2:
                return
            state[n] = 1
            for m in edges[n]:
                visit(m, trail + [n])
            state[n] = 2
        for n in edges:
            visit(n, [])

    def _check_classes(self, allow=None) -> None:
        outputs = {}
        for c in self.components:
            try:
                cls = resolve_component(c["class"], c["kind"], allow)
            except TopologyError as e:
                raise TopologyError(f"{c['kind']} {c['id']!r}: {e}") from None
            outputs[c["id"]] = declared_outputs(cls)
        for c in self.components:
            for i in c["inputs"]:
                src_out = outputs[i["component"]]
                if i["stream"] not in src_out:
                    raise TopologyError(f"bolt {c['id']!r} subscribes to stream {i['stream']!r} of "
                                        f"{i['component']!r}, which declares: {', '.join(src_out) or 'no streams'}")
                if i["grouping"]["type"] == "fields":
                    missing = [f for f in i["grouping"]["fields"] if f not in src_out[i["stream"]]]
                    if missing:
                        raise TopologyError(f"bolt {c['id']!r} groups by {missing} but {i['component']!r} "
                                            f"declares fields {src_out[i['stream']]}")
                if i["grouping"]["type"] == "custom":
                    resolve_grouping(i["grouping"]["class"], allow)

    # -- text -----------------------------------------------------------------------
    def describe(self) -> str:
        lines = [f"topology {self.name}  ({self.num_tasks} tasks)"]
        for c in self.components:
            r = self.tasks(c["id"])
            lines.append(f"  {c['kind']:5s} {c['id']:<14s} x{c['parallelism']:<3d} tasks {r.start}-{r.stop - 1}  "
                         f"{c['class']}")
            for key, value in sorted(c["config"].items()):
                text = repr(value)
                lines.append(f"          {key} = {text if len(text) < 60 else text[:57] + '...'}")
            for i in c["inputs"]:
                g = i["grouping"]
                extra = f"({', '.join(g['fields'])})" if g["type"] == "fields" else (
                    f"({g['class']})" if g["type"] == "custom" else "")
                stream = "" if i["stream"] == "default" else f" stream {i['stream']!r}"
                lines.append(f"          <- {i['component']}{stream} [{g['type']}{extra}]")
        lines.append("  config: " + ", ".join(f"{k}={v}" for k, v in sorted(self.config.items())))
        return "\n".join(lines)
