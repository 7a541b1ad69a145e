"""/status as Prometheus text exposition."""
from __future__ import annotations


def _label(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def prometheus(status: dict) -> str:
    w = _label(status["worker"])
    lines = [
        "# TYPE streamnet_compute_threads gauge",
        f'streamnet_compute_threads{{worker="{w}"}} {status["threads"]}',
        "# TYPE streamnet_compute_busy_fraction gauge",
        f'streamnet_compute_busy_fraction{{worker="{w}"}} {status["busy_fraction"]}',
        "# TYPE streamnet_rejected_connections_total counter",
        f'streamnet_rejected_connections_total{{worker="{w}"}} {status["transport"]["rejected"]}',
        "# TYPE streamnet_frames_received_total counter",
        f'streamnet_frames_received_total{{worker="{w}"}} {status["transport"]["frames_in"]}',
        "# TYPE streamnet_bytes_received_total counter",
        f'streamnet_bytes_received_total{{worker="{w}"}} {status["transport"]["bytes_in"]}',
    ]
    counters = ("executed", "emitted", "acked", "failed", "timed_out", "errors")
    for c in counters:
        lines.append(f"# TYPE streamnet_task_{c}_total counter")
        for topo, t in status["topologies"].items():
            for task, m in t["tasks"].items():
                lines.append(f'streamnet_task_{c}_total{{worker="{w}",topology="{_label(topo)}",'
                             f'component="{_label(m["component"])}",task="{task}"}} {m[c]}')
    for g in ("queue", "pending", "execute_ms_avg"):
        lines.append(f"# TYPE streamnet_task_{g} gauge")
        for topo, t in status["topologies"].items():
            for task, m in t["tasks"].items():
                if g in m:
                    lines.append(f'streamnet_task_{g}{{worker="{w}",topology="{_label(topo)}",'
                                 f'component="{_label(m["component"])}",task="{task}"}} {m[g]}')
    lines.append("# TYPE streamnet_link_bytes_sent_total counter")
    for peer, l in status["links"].items():
        lines.append(f'streamnet_link_bytes_sent_total{{worker="{w}",peer="{_label(peer)}"}} {l["bytes_out"]}')
    return "\n".join(lines) + "\n"
