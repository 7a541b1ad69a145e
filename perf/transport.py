"""Transport between two workers on loopback, through the real path (mutual
handshake, a per-stream key and a tag over every frame, frame codec, bounded
queues):

- round-trip latency of a 62k-float32 tensor (spout on one worker -> echo bolt on
  the other -> sink -> ack to the spout; one in flight), p50 and p99, and the parts of
  it: each hop (a sender's emit to the receiving bolt's execute, on the one clock of
  the machine: bench.HopBolt) and there and back (the spout's emit to the sink's
  execute, without the ack's way back);
- bulk GB/s for 247 KB and 10 MB tensors (one worker -> the other, acked, 8 in flight);
- small tuples/s over one connection (unanchored, batched into frames);
- the frame authenticator alone (GB/s over a 247 KB frame, one core);
- the peer: raw blocking TCP sockets between two processes on the same cores (no
  engine, no framing, no tag): a 248 KB round trip and 247 KB bulk, and the workers'
  figures as ratios to it - what "memory speed" means on this host, in the same run.

--engine processes (the default) runs each worker as its own `streamnet-worker`
process on a real ZooKeeper, pinned to its own core where the machine has two, as
users deploy it; --engine local runs both as threads of this process
(LocalCluster: one interpreter lock); --engine both gives both columns.

The processes are measured in each stream mode of --modes (default both): plain (a
MAC over every frame) and tls (the same frames inside TLS, --tls-cert/--tls-key/
--tls-ca with a CA made for the run), so the cost of TLS is read off one run.

    python perf/transport.py [--quick] [--engine processes|local|both] [--modes plain,tls]

Writes perf/results/transport.json and perf/results/transport.png (--out NAME.json or a
path for others, so a trial run does not replace the committed figures).
Targets (issue 12, between two worker processes): p50 <= 0.3 ms, >= 2 GB/s bulk,
>= 100k small tuples/s per connection.

Measured (full mode, processes, 2 shared cores under load 4.5-7 from other jobs,
alternating with the code before - tuple by tuple on the wire, frozen messages, an
incremental GMAC per frame - two runs each): round trip p50 3.00/2.57 -> 1.93/1.96 ms
(CPU per round trip, both ends, set-up included: 1.46/1.37 -> 1.16/1.06 ms); bulk
247 KB 0.30/0.26 -> 0.38/0.49 GB/s (per CPU-second of the busier end 1.47/1.41 ->
1.44/1.79 GB), 10 MB 0.42/0.45 -> 0.58/0.79 GB/s (2.33/2.44 -> 2.83/2.69 GB); small
tuples 19.5k/19.6k -> 50.7k/53.9k/s (82k/79k -> 208k/183k per CPU-second of the
busier end: runs of tuples, one routing decision per run). Again at load 1.6-1.8:
round trip p50 0.63/0.67 -> 0.70/0.64 ms (no gain: without spare CPU to overlap
tagging with the copy, as the old incremental tag did, the critical path is the
same); bulk 247 KB 2.14/0.48 -> 2.19/1.97 GB/s, 10 MB 2.87/0.65 -> 2.58/0.91 GB/s;
small tuples 92k/91k -> 208k/132k/s (93k/94k -> 210k/232k per CPU-second).
TLS against plain in the same run (load 4.5-5.6): round trip p50 1.34 -> 3.08 ms,
bulk 247 KB 0.41 -> 0.29 GB/s, 10 MB 0.62 -> 0.34 GB/s, small tuples 66k -> 71k/s
(per CPU-second of the busier end 102k -> 73k): TLS encrypts and copies each frame
once more, on both ends, and the MAC inside it stays.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine, out_option, png_beside, started_zookeeper, write_json  # noqa: E402

from streamnet.examples import bench  # noqa: E402
from streamnet.runtime import wait_for  # noqa: E402

TARGETS = {"rtt_p50_ms": 0.3, "bulk_gb_s": 2.0, "small_tuples_s": 100_000}


class Processes:
    """Two streamnet-worker processes on a ZooKeeper, behind LocalCluster's face
    (submit, run, kill, worker_status) so that one measurement serves both engines;
    with tls, their streams run TLS."""

    def __init__(self, zk_hosts: str, tls: bool = False):
        from streamnet.runtime.dataplane.tls import make_pki
        from streamnet.testing import Cluster
        self.cluster = Cluster(zk_hosts, workers=0, threads=1, pin_cores=True)
        self.state = None
        try:
            names = ["w0", "w1"]
            pki = make_pki(os.path.join(self.cluster.tmp, "pki"), names) if tls else {}
            for name in names:
                c = pki.get(name)
                self.cluster.start_worker(name, ["--tls-cert", c.cert, "--tls-key", c.key, "--tls-ca", c.ca]
                                          if c else [])
            self.state = self.cluster.state()
            self.cluster.wait_registered(len(names), self.state)
        except BaseException:
            print(self.cluster.dump_logs())
            self.close()
            raise

    def close(self) -> None:
        if self.state is not None:
            self.state.coord.close()
        self.cluster.close()

    def submit(self, topology) -> None:
        self.state.submit_topology(topology.name, topology.to_dict())

    def kill(self, name: str) -> dict:
        from streamnet.runtime.control.client import kill_topology
        return kill_topology(self.state, name, 60)

    def run(self, topology, timeout: float = 300) -> dict:
        from streamnet.testing import finish
        self.submit(topology)
        return finish(self.state, topology.name, timeout)

    def worker_status(self) -> list[dict]:
        return [s for w in sorted(self.state.workers()) if (s := self.cluster.status(self.state, w))]

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds (user + system) each worker process has used so far."""
        out = {}
        for name, proc in self.cluster.procs.items():
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out


def cpu_s(c) -> dict[str, float]:
    """CPU seconds used so far: per worker process, or this whole process (local)."""
    if isinstance(c, Processes):
        return c.cpu_s()
    t = os.times()
    return {"process": t.user + t.system}


def cpu_used(before: dict, after: dict) -> tuple[float, float]:
    """(all workers together, the busiest one): CPU seconds between two readings."""
    used = [after[k] - before[k] for k in before]
    return sum(used), max(used)


@contextlib.contextmanager
def engine(kind: str, tls: bool = False):
    if kind == "local":
        from streamnet.runtime import LocalCluster
        with LocalCluster(workers=2, threads=1) as c:
            yield c
        return
    zk = started_zookeeper()
    procs = None
    try:
        procs = Processes(zk.hosts, tls)
        yield procs
    finally:
        if procs is not None:
            procs.close()
        zk.stop()


def stats_of(results: dict) -> dict:
    return next(v for k, v in results.items() if k.endswith(".stats"))


def measure(c, quick: bool) -> dict:
    """Wall-clock figures, and the CPU time they took: on a shared machine a process
    waits for a core, and CPU time per operation says what it costs regardless
    (cpu_* = the figure if each worker had its own idle core, no overlap counted)."""
    out = {}
    n_ping = 300 if quick else 2000
    c0 = cpu_s(c)
    results = c.run(bench.ping(62_000, n_ping))
    total, _ = cpu_used(c0, cpu_s(c))
    s = stats_of(results)

    def p50_ms(seconds: list) -> float:     # the warm-up (connection set-up) left out
        return float(np.percentile(np.array(seconds[n_ping // 10:]) * 1e3, 50))
    rtt = np.array(s["rtt_s"][n_ping // 10:]) * 1e3
    hops = {k.split(".")[0]: v for k, v in results.items() if k.endswith(".hops")}
    out["rtt_62k_float32"] = {"p50_ms": float(np.percentile(rtt, 50)), "p99_ms": float(np.percentile(rtt, 99)),
                              "n": int(rtt.size), "cpu_ms_per_round_trip": total / n_ping * 1e3,
                              "hop_out_p50_ms": p50_ms(hops["echo"]["hop_s"]),
                              "hop_back_p50_ms": p50_ms(hops["back"]["hop_s"]),
                              "there_and_back_p50_ms": p50_ms(hops["back"]["back_s"]),
                              "workers": {"ping": s["worker"], "echo": hops["echo"]["worker"],
                                          "back": hops["back"]["worker"]}}
    r = out["rtt_62k_float32"]
    print(f"  round trip, 62k float32 (248 KB) each way, emit to ack: p50 {r['p50_ms']:.3f} ms  "
          f"p99 {r['p99_ms']:.3f} ms  (CPU {r['cpu_ms_per_round_trip']:.3f} ms per round trip, both ends)")
    print(f"    of which: hop out p50 {r['hop_out_p50_ms']:.3f} ms, hop back {r['hop_back_p50_ms']:.3f} ms, "
          f"there and back (emit to the tensor's return, no ack) {r['there_and_back_p50_ms']:.3f} ms; "
          + " -> ".join(f"{k} on {w}" for k, w in r["workers"].items()))
    out["bulk"] = {}
    for label, size, count in (("247KB", 247_000 // 4, 1000 if quick else 20000),
                               ("10MB", 10 * 2 ** 20 // 4, 40 if quick else 200)):
        c0 = cpu_s(c)
        s = stats_of(c.run(bench.bulk(size, count)))
        _, busiest = cpu_used(c0, cpu_s(c))
        gbs = s["bytes"] / s["elapsed_s"] / 1e9
        out["bulk"][label] = {"gb_s": gbs, "count": count, "elapsed_s": s["elapsed_s"],
                              "cpu_gb_s": s["bytes"] / busiest / 1e9}
        print(f"  bulk {label:>6s}: {gbs:.2f} GB/s ({count} tensors in {s['elapsed_s']:.2f} s; "
              f"{out['bulk'][label]['cpu_gb_s']:.2f} GB per CPU-second of the busier end)")

    c.submit(bench.small())

    def sink_count():
        for st in c.worker_status():
            for m in st["topologies"].get("small", {}).get("tasks", {}).values():
                if m["component"] == "sink":
                    return m["executed"]
        return 0
    wait_for(lambda: sink_count() > 20_000, 60, "small tuples to flow", interval=0.05)
    n0, t0, c0 = sink_count(), time.perf_counter(), cpu_s(c)
    span = 2.0 if quick else 6.0
    wait_for(lambda: time.perf_counter() - t0 > span, span + 5, "the measuring window", interval=0.05)
    n1, t1, c1 = sink_count(), time.perf_counter(), cpu_s(c)
    c.kill("small")
    _, busiest = cpu_used(c0, c1)
    out["small_tuples_per_s"] = (n1 - n0) / (t1 - t0)
    out["small_tuples_per_cpu_s"] = (n1 - n0) / busiest
    print(f"  small tuples over one connection: {out['small_tuples_per_s']:,.0f}/s "
          f"({out['small_tuples_per_cpu_s']:,.0f} per CPU-second of the busier end)")
    return out


def authenticator_gb_s(repeats: int = 400) -> float:
    """The frame tag alone, over a 247 KB frame in the buffers the codec lays it out in."""
    from streamnet.runtime import codec
    from streamnet.runtime.dataplane.transport import FrameAuth
    auth = FrameAuth(os.urandom(32))
    frame = codec.encode([["t", np.ones(247_000 // 4, np.float32)]])
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for seq in range(repeats):
            auth.tag(seq, frame)
        best = min(best, time.perf_counter() - t0)
    return repeats * sum(len(b) for b in frame) / best / 1e9


RAW_BYTES = 62_000 * 4        # the round trip's payload, as the workers' 62k float32
BULK_BYTES = 247_000


def _raw_echo(port_q, bulk_n: int, core: int) -> None:
    """The raw peer's far end, pinned to `core`: echo round trips, then take `bulk_n`
    bulk messages and answer one byte."""
    import socket
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, {core})
    srv = socket.create_server(("127.0.0.1", 0))
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(max(RAW_BYTES, BULK_BYTES))
    view = memoryview(buf)

    def take(n: int) -> bool:
        got = 0
        while got < n:
            k = conn.recv_into(view[got:n])
            if not k:
                return False
            got += k
        return True
    while take(RAW_BYTES):
        if buf[0] == 255:          # the round trips are over: bulk follows
            break
        conn.sendall(view[:RAW_BYTES])
    for _ in range(bulk_n):
        take(BULK_BYTES)
    conn.sendall(b"k")
    conn.close()
    srv.close()


def raw_socket_peer(round_trips: int, bulk_n: int) -> dict:
    """Round trip p50 of RAW_BYTES and bulk GB/s of BULK_BYTES messages over a loopback
    TCP connection between two processes on cores 0 and 1 (as the workers are pinned)."""
    import multiprocessing
    import socket
    cores = sorted(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    far = ctx.Process(target=_raw_echo, args=(q, bulk_n, cores[1 % len(cores)]), daemon=True)
    far.start()
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cores[0]})
        c = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = bytearray(RAW_BYTES)
        payload[0] = 1
        back = memoryview(bytearray(RAW_BYTES))
        times = []
        for _ in range(round_trips):
            t0 = time.perf_counter()
            c.sendall(payload)
            got = 0
            while got < RAW_BYTES:
                got += c.recv_into(back[got:])
            times.append(time.perf_counter() - t0)
        payload[0] = 255
        c.sendall(payload)
        bulk = bytes(BULK_BYTES)
        t0 = time.perf_counter()
        for _ in range(bulk_n):
            c.sendall(bulk)
        c.recv(1)
        seconds = time.perf_counter() - t0
        c.close()
    finally:
        os.sched_setaffinity(0, before)
        far.join(30)
        if far.is_alive():
            far.kill()
    times = sorted(times[len(times) // 10:])     # as the workers' figure: the first 10 % left out
    return {"rtt_p50_ms": times[len(times) // 2] * 1e3, "bulk_247KB_gb_s": bulk_n * BULK_BYTES / seconds / 1e9}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--engine", choices=("processes", "local", "both"), default="processes")
    p.add_argument("--modes", default="plain,tls", help="stream modes of the processes: plain, tls or both")
    out_option(p, "transport.json")
    a = p.parse_args()
    modes = a.modes.split(",")
    if not modes or any(m not in ("plain", "tls") for m in modes):
        p.error(f"--modes: a comma-separated list of plain and tls; got {a.modes!r}")
    logging.basicConfig(level=logging.WARNING)
    out = {"machine": machine(), "targets": TARGETS, "load_avg_at_start": os.getloadavg()[0]}
    out["authenticator_gb_s"] = authenticator_gb_s()
    print(f"frame authenticator alone: {out['authenticator_gb_s']:.2f} GB/s")
    out["raw_sockets"] = raw_socket_peer(200 if a.quick else 2000, 2000 if a.quick else 20_000)
    print(f"raw sockets between two processes: round trip p50 {out['raw_sockets']['rtt_p50_ms']:.3f} ms, bulk 247 KB "
          f"{out['raw_sockets']['bulk_247KB_gb_s']:.2f} GB/s")
    kinds = []          # (column, engine, tls)
    for kind in ("processes", "local") if a.engine == "both" else (a.engine,):
        if kind == "local":
            kinds.append(("local", kind, False))
            continue
        kinds += [("processes" if m == "plain" else "processes_tls", kind, m == "tls") for m in modes]
    for column, kind, tls in kinds:
        print(f"{column}:")
        with engine(kind, tls) as c:
            out[column] = measure(c, a.quick)
        out[column]["load_avg_after"] = os.getloadavg()[0]
        print(f"  (load average {out[column]['load_avg_after']:.2f})")
    if "processes" in out and "processes_tls" in out:
        plain, tls = out["processes"], out["processes_tls"]
        out["tls_cost"] = {"rtt_p50": tls["rtt_62k_float32"]["p50_ms"] / plain["rtt_62k_float32"]["p50_ms"],
                           "bulk_247KB": tls["bulk"]["247KB"]["gb_s"] / plain["bulk"]["247KB"]["gb_s"],
                           "bulk_10MB": tls["bulk"]["10MB"]["gb_s"] / plain["bulk"]["10MB"]["gb_s"],
                           "small_tuples": tls["small_tuples_per_s"] / plain["small_tuples_per_s"]}
        print("TLS against plain (MAC only), same run: " + ", ".join(
            f"{k} {v:.2f}x" for k, v in out["tls_cost"].items()))
    raw = out["raw_sockets"]
    for column, _, _ in kinds:
        r = out[column]
        out[column]["against_raw_sockets"] = {
            "rtt_p50": r["rtt_62k_float32"]["p50_ms"] / raw["rtt_p50_ms"],
            "bulk_247KB": r["bulk"]["247KB"]["gb_s"] / raw["bulk_247KB_gb_s"]}
        print(f"{column} against raw sockets, same run: round trip p50 "
              f"{out[column]['against_raw_sockets']['rtt_p50']:.2f}x as long, bulk 247 KB "
              f"{out[column]['against_raw_sockets']['bulk_247KB']:.2f}x as fast")
    kinds = [column for column, _, _ in kinds]
    path = write_json(a.out, out)
    print(f"wrote {path}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG")
        return 0
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    width = 0.8 / len(kinds)
    parts = (("p50_ms", "emit to ack"), ("there_and_back_p50_ms", "there and back"), ("hop_out_p50_ms", "one hop"))
    for i, kind in enumerate(kinds):
        r = out[kind]
        axes[0].bar(np.arange(len(parts)) + i * width, [r["rtt_62k_float32"][k] for k, _ in parts], width,
                    label=kind)
        labels = list(r["bulk"])
        axes[1].bar(np.arange(len(labels)) + i * width, [r["bulk"][k]["gb_s"] for k in labels], width, label=kind)
        axes[1].set_xticks(np.arange(len(labels)) + width * (len(kinds) - 1) / 2, labels)
        axes[2].bar([i], [r["small_tuples_per_s"]], label=kind)
    axes[0].axhline(TARGETS["rtt_p50_ms"], ls="--", c="k"); axes[0].set_ylabel("ms")
    axes[0].set_title("62k float32 round trip, p50")
    axes[0].set_xticks(np.arange(len(parts)) + width * (len(kinds) - 1) / 2, [label for _, label in parts])
    axes[1].axhline(TARGETS["bulk_gb_s"], ls="--", c="k"); axes[1].set_ylabel("GB/s"); axes[1].set_title("bulk")
    axes[1].legend()
    axes[2].axhline(TARGETS["small_tuples_s"], ls="--", c="k"); axes[2].set_title("small tuples/s")
    axes[2].set_xticks(range(len(kinds)), kinds)
    png = png_beside(a.out)
    fig.tight_layout(); fig.savefig(png, dpi=100)
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
