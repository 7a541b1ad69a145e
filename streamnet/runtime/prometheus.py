"""/metrics: a worker's /status as Prometheus families, through prometheus_client.

`StatusCollector` is a custom collector: at each scrape it reads the status dict
(worker.status()) and yields the families below, so there is one source of truth
and nothing to keep in step by hand. Seconds, not milliseconds; counters end in
`_total`, ratios in `_ratio`; execute latency is a summary (count, sum and the
p99 of the last 256 executions). The figures tasks report through
`Context.figure` (training's loss, accuracy, epoch, ...) become `streamnet_<name>`
families labelled with their task: the engine knows their names only from the
status, never from neural-network code.
"""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)
_clashes: set[str] = set()      # figure families left out of /metrics, each logged once

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TASK_LABELS = ["worker", "topology", "component", "task"]

#: status key in a task -> (family without _total, help)
TASK_COUNTERS = {
    "executed": ("streamnet_task_executed", "Tuples a bolt executed or a spout's next_tuple calls that emitted"),
    "emitted": ("streamnet_task_emitted", "Tuples emitted by the task"),
    "acked": ("streamnet_task_acked", "Tuples acked (bolts) or tuple trees completed (spouts)"),
    "failed": ("streamnet_task_failed", "Tuples failed (bolts) or tuple trees failed (spouts)"),
    "timed_out": ("streamnet_task_timed_out", "Spout tuple trees failed after message_timeout_s"),
    "errors": ("streamnet_task_errors", "Exceptions raised by the component and logged"),
}
#: status key in a task -> (family, help, key of its bound for a _fill_ratio, or None: no ratio)
TASK_GAUGES = {
    "queue": ("streamnet_task_queue", "Tuples waiting in a bolt's input queue", "queue_max"),
    "overflow": ("streamnet_task_overflow",
                 "Tuples from other workers waiting behind a bolt's full input queue (its senders told to hold)",
                 None),
    "pending": ("streamnet_task_pending", "Spout tuple trees not complete yet", "pending_max"),
}


def _task_rows(status: dict):
    w = str(status["worker"])
    for topo, t in status["topologies"].items():
        for task, m in t["tasks"].items():
            yield [w, str(topo), str(m["component"]), str(task)], m


class StatusCollector:
    """prometheus_client collector over `status()` (a callable returning the status dict)."""

    def __init__(self, status):
        self.status = status

    def collect(self):
        s = self.status()
        rows = list(_task_rows(s))
        engine = list(_engine_families(s, rows))
        yield from engine
        # the engine's families and every series name they hold (a summary's x_count and
        # x_sum): a gauge figure named task_execute_seconds_count was a second series of one
        # name and labels, and Prometheus dropped one of the two
        yield from _figures(rows, {f.name for f in engine} | {s.name for f in engine for s in f.samples})


def _engine_families(s: dict, rows: list):
    """The engine's own families (all but the tasks' figures) of one status dict."""
    w = [str(s["worker"])]
    yield _gauge("streamnet_compute_threads", "Compute threads of the worker", s["threads"], w)
    yield _gauge("streamnet_compute_busy_ratio", "Fraction of the compute threads' time spent computing",
                 s["busy_fraction"], w)
    yield _gauge("streamnet_leader", "1 if this worker's scheduler is the cluster's leader",
                 1 if s.get("leader") else 0, w)
    load = s.get("load") or {}
    if "foreign_busy" in load:
        yield _gauge("streamnet_host_foreign_busy_cores", "Cores of this worker's host kept busy by other "
                     "processes (last published load record)", load["foreign_busy"], w)
    if "steal" in load:
        yield _gauge("streamnet_host_steal_ratio", "Fraction of CPU time stolen by the hypervisor",
                     load["steal"], w)
    tr = s["transport"]
    for key, name, doc in (("rejected", "streamnet_rejected_connections", "Inbound connections refused"),
                           ("frames_in", "streamnet_frames_received", "Frames received from peers"),
                           ("bytes_in", "streamnet_received_bytes", "Bytes of frames received from peers"),
                           ("dropped", "streamnet_dropped_tuples", "Tuples dropped by delivery (replayed)")):
        if key in tr:
            yield _counter(name, doc, tr[key], w)
    yield _gauge("streamnet_open_streams", "Inbound peer streams open", tr.get("open_streams", 0), w)
    sent = CounterMetricFamily("streamnet_link_sent_bytes", "Bytes sent to a peer worker",
                               labels=["worker", "peer"])
    for peer, link in s["links"].items():
        sent.add_metric(w + [str(peer)], link.get("bytes_out", 0))
    yield sent
    for key, (name, doc) in TASK_COUNTERS.items():
        fam = CounterMetricFamily(name, doc, labels=TASK_LABELS)
        for labels, m in rows:
            if key in m:
                fam.add_metric(labels, m[key])
        yield fam
    for key, (name, doc, cap) in TASK_GAUGES.items():
        fam = GaugeMetricFamily(name, doc, labels=TASK_LABELS)
        ratio = GaugeMetricFamily(f"{name}_fill_ratio", f"{doc}, as a fraction of its bound", labels=TASK_LABELS)
        for labels, m in rows:
            if key in m:
                fam.add_metric(labels, m[key])
                if cap is not None:
                    ratio.add_metric(labels, m[key] / m[cap] if m.get(cap) else 0.0)
        yield fam
        if cap is not None:
            yield ratio
    yield _execute_summary(rows)


def _gauge(name, doc, value, labels):
    g = GaugeMetricFamily(name, doc, labels=["worker"])
    g.add_metric(labels, value)
    return g


def _counter(name, doc, value, labels):
    c = CounterMetricFamily(name, doc, labels=["worker"])
    c.add_metric(labels, value)
    return c


def _execute_summary(rows) -> Metric:
    """Execute latency in seconds: count and sum over the task's life, p99 of the last 256."""
    name = "streamnet_task_execute_seconds"
    m = Metric(name, "Time a task spent in execute (bolts) or next_tuple (spouts)", "summary")
    for labels, t in rows:
        if "executed" not in t:
            continue
        d = dict(zip(TASK_LABELS, labels))
        m.add_sample(name, {**d, "quantile": "0.99"}, t.get("execute_ms_p99", 0.0) / 1e3)
        m.add_sample(f"{name}_count", d, t["executed"])
        m.add_sample(f"{name}_sum", d, t.get("execute_s_total", 0.0))
    return m


def _figures(rows, taken: set[str] = frozenset()):
    """Context.figure's numbers: one family per name, the task's labels and its own. A
    figure whose family is one of the engine's (`taken`), or already a family of the other
    type (a gauge x beside a counter x_total), is left out - logged once - since a scrape
    with two families of one name is refused whole."""
    families: dict[str, Metric] = {}
    for labels, t in rows:
        base = dict(zip(TASK_LABELS, labels))
        for f in t.get("figures", ()):
            family = "streamnet_" + (f["name"][:-len("_total")] if f["type"] == "counter" else f["name"])
            sample = family + ("_total" if f["type"] == "counter" else "")
            m = families.get(family)
            engines = family in taken or sample in taken
            if engines or (m is not None and m.type != f["type"]):
                if family not in _clashes:
                    _clashes.add(family)
                    log.warning("/metrics leaves out the figure %r of task %s: its family %s is %s", f["name"],
                                base.get("task"), family, "the engine's" if engines else "of another type")
                continue
            if m is None:
                m = families[family] = Metric(family, f["help"] or f["name"], f["type"])
            m.add_sample(sample, {**base, **{k: str(v) for k, v in f["labels"].items()}}, f["value"])
    return families.values()


def registry_for(status) -> CollectorRegistry:
    """A registry of one worker: its status families, and the process's own
    (process_* on Linux, python_info)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StatusCollector(status))
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    return reg


def prometheus(status: dict) -> str:
    """The text exposition of one status dict (for tests and tools)."""
    return generate_latest(registry_for(lambda: status)).decode()
