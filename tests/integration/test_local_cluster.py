"""The stream engine on the embedded local cluster: exact results, replay,
backpressure, and bad input against a running worker."""
import asyncio
import random
import time

import aiohttp
import msgpack
import pytest

from streamnet.examples import bench, flood, tensor_pipe, wordcount
from streamnet.runtime import Bolt, LocalCluster, Spout, TopologyBuilder, wait_for
from streamnet.runtime.codec import ARRAY_EXT, MAGIC, PREFIX
from streamnet.runtime.dataplane.transport import PROTOCOL, TRAILER, Auth, FrameAuth
from streamnet.testing import placement

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_wordcount_is_exact():
    with LocalCluster(workers=3) as c:
        results = c.run(wordcount.topology(count=3000), timeout=60)
    assert wordcount.merge_counts(results) == wordcount.expected_counts(3000, 0)


def test_failed_tuples_are_replayed_until_every_root_is_acked():
    with LocalCluster(workers=2) as c:
        results = c.run(wordcount.topology(count=2000, fail_every=5, message_timeout_s=10), timeout=60)
        # after the run, no spout holds pending roots (wait_done requires it)
    assert wordcount.merge_counts(results) == wordcount.expected_counts(2000, 0)
    replayed = results["sentences.0.replayed"]
    duplicates = sum(v for k, v in results.items() if k.endswith(".duplicates"))
    assert replayed > 100 and duplicates > 0, (replayed, duplicates)


def test_tensor_pipe_moves_10mb_arrays_intact():
    n, size = 6, 10 * 2 ** 20 // 4
    with LocalCluster(workers=2) as c:
        results = c.run(tensor_pipe.topology(count=n, size=size, transformers=2, sinks=2), timeout=120)
    assert tensor_pipe.merge_checksums(results) == tensor_pipe.expected(n, size)


def test_the_ping_benchmark_times_each_hop_on_the_one_clock_of_the_machine():
    """perf/transport.py's parts of a round trip: the echo on the other worker records the
    hop out, the sink back on the spout's worker the hop back and the whole way."""
    n = 20
    with LocalCluster(workers=2) as c:
        results = c.run(bench.ping(1000, n), timeout=60)
    stats, echo, back = results["ping.0.stats"], results["echo.0.hops"], results["back.0.hops"]
    assert echo["worker"] != stats["worker"] == back["worker"]
    assert len(stats["rtt_s"]) == len(echo["hop_s"]) == len(back["hop_s"]) == len(back["back_s"]) == n
    assert echo["back_s"] == []                     # the spout's tensors carry no t0
    for out, hop_back, whole, rtt in zip(echo["hop_s"], back["hop_s"], back["back_s"], stats["rtt_s"]):
        assert 0 < out < whole and 0 < hop_back < whole < rtt     # one in flight: each tensor's own times


def _tasks(status, topology, component):
    return [m for s in status for m in s["topologies"].get(topology, {}).get("tasks", {}).values()
            if m["component"] == component]


def test_slow_bolt_pushes_back_on_the_spout_one_worker():
    with LocalCluster(workers=1) as c:
        c.submit(flood.topology(delay_s=0.002, queue_size=64))
        samples = []

        def sampled_enough():
            st = c.worker_status()
            if not (_tasks(st, "flood", "numbers") and _tasks(st, "flood", "slow")):
                return False  # not started yet
            spout, bolt = _tasks(st, "flood", "numbers")[0], _tasks(st, "flood", "slow")[0]
            samples.append((spout["emitted"], bolt["executed"], bolt["queue"], bolt["queue_max"]))
            return bolt["executed"] > 300
        wait_for(sampled_enough, 30, "the slow bolt to process 300 tuples", interval=0.05)
        c.kill("flood")
    for emitted, executed, queue, qmax in samples:
        assert queue <= qmax == 64
        # everything emitted is executed, queued, or the one tuple in hand
        assert emitted - executed <= qmax + 2, (emitted, executed)


def _tcp_buffer_max() -> int:
    total = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            total += int(f.read().split()[2])
    return total


def test_slow_bolt_across_workers_memory_stays_bounded():
    pad = 1000
    with LocalCluster(workers=2) as c:
        topo = flood.topology(delay_s=0.002, queue_size=64, pad=pad)
        c.submit(topo)
        # the spout and the bolt on different workers: tuples cross the socket
        tasks = wait_for(lambda: placement(c.state, "flood"), 30, "the assignment")
        assert tasks[topo.tasks("numbers")[0]] != tasks[topo.tasks("slow")[0]], tasks
        gaps = []

        def through(n):
            def check():
                st = c.worker_status()
                if not (_tasks(st, "flood", "numbers") and _tasks(st, "flood", "slow")):
                    return False
                spout, bolt = _tasks(st, "flood", "numbers")[0], _tasks(st, "flood", "slow")[0]
                assert bolt["queue"] <= bolt["queue_max"]
                gaps.append(spout["emitted"] - bolt["executed"])
                return bolt["executed"] > n
            return check
        wait_for(through(1500), 60, "1500 tuples through the slow bolt", interval=0.05)
        c.kill("flood")
    # What may be in flight is bounded by the buffers on the way, whatever the run time:
    # the sender's link queue, the kernel's TCP buffers, the receiver's staging buffer and
    # its frames waiting for dispatch (reading pauses past MAX_READY_BYTES: at most one
    # frame more), the frame being dispatched, and the bolt's queue.
    from streamnet.runtime.dataplane.frame_io import MAX_READY_BYTES, STAGE_BYTES
    from streamnet.runtime.dataplane.transport import MAX_BATCH_MSGS
    bound = 1024 + 64 + 2 + 2 * MAX_BATCH_MSGS + (STAGE_BYTES + MAX_READY_BYTES + _tcp_buffer_max()) // pad
    assert max(gaps) <= bound, (max(gaps), bound)
    # and the bolt was the bottleneck: tuples did pile up beyond its own queue
    assert max(gaps) > 64


def test_slow_relays_crossing_between_two_workers_both_ways_keep_moving():
    """A relay on each worker, between a spout and a sink on each (shuffled): each relay
    emits to the other worker while its own queue is full. When a full queue held up
    the whole stream that brought its next tuple, the two workers froze each other
    within seconds, until a stream was cut for taking no byte for 30 s; now the tuples
    that find a queue full wait in its overflow, the sender holds that task's tuples,
    and the streams go on."""
    with LocalCluster(workers=2) as c:
        topo = flood.crossing(delay_s=0.0005, pad=20000, queue_size=64)
        c.submit(topo)
        tasks = wait_for(lambda: placement(c.state, "crossing"), 30, "the assignment")
        for component in ("numbers", "relay", "sink"):
            assert {tasks[t] for t in topo.tasks(component)} == {"w0", "w1"}, tasks
        progress = {"sunk": 0, "at": time.monotonic(), "longest_s": 0.0}

        def through(n):
            sunk = sum(m["executed"] for m in _tasks(c.worker_status(), "crossing", "sink"))
            now = time.monotonic()
            if sunk > progress["sunk"]:
                progress.update(sunk=sunk, at=now)
            progress["longest_s"] = max(progress["longest_s"], now - progress["at"])
            # a freeze lasts until the 30 s write stall: far longer than any pause of a slow host
            assert progress["longest_s"] < 15, f"no tuple reached a sink for {progress['longest_s']:.0f} s"
            return sunk >= n
        wait_for(lambda: through(15000), 120, "15,000 tuples through the relays into the sinks", interval=0.2)
        status = c.worker_status()
        c.kill("crossing")
    assert sum(s["holds"]["told"] for s in status) > 0            # the relays' queues did fill


async def _attack(port: int, secret: bytes, body: bytes, signed: bool) -> tuple[int, str]:
    """Open a stream from "intruder" to worker w1 and write `body` on it once upgraded;
    `signed`: followed by the trailer (sequence number 0, frame tag under the stream
    key) that a real peer sends, so the frame gets past the tag check to the decoder.
    Returns the answer's status and text; after a 101, (101, "closed") once the worker
    has closed the connection."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/hello") as r:
            nonce = (await r.json())["nonce"]
    auth = Auth(secret, "intruder")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"POST /stream HTTP/1.1\r\nHost: x\r\nX-Streamnet-From: intruder\r\n"
                     f"X-Streamnet-Nonce: {nonce}\r\nX-Streamnet-Auth: {auth.sign(nonce, 'intruder', 'w1')}\r\n"
                     f"Connection: Upgrade\r\nUpgrade: {PROTOCOL}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        status = int(head.split(b" ")[1])
        if status != 101:
            return status, (await asyncio.wait_for(reader.read(), 10)).decode()
        if signed:
            body += TRAILER.pack(0, FrameAuth(auth.session_key(nonce, "intruder", "w1")).tag(0, [body]))
        try:
            writer.write(body)
            writer.write_eof()                 # a truncated frame ends here
            await writer.drain()
        except ConnectionError:               # the worker may close while we still write
            pass
        try:
            rest = await asyncio.wait_for(reader.read(), 10)
        except ConnectionError:
            rest = b""
        return 101, "closed" if rest == b"" else rest.decode("ascii", "replace")
    finally:
        writer.close()


def _frame(header: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(MAGIC, len(header), len(payload)) + header + payload


def _ext_frame(meta, payload=b"", code=ARRAY_EXT):
    return _frame(msgpack.packb([["t", "wordcount", 1, "default", 0,
                                  [msgpack.ExtType(code, msgpack.packb(meta))], []]]), payload)


@pytest.mark.slow     # about 24 s
def test_bad_input_closes_one_connection_with_a_logged_reason_and_the_worker_keeps_serving(caplog):
    # name: (secret, body, signed, the reason the worker logs)
    attacks = {
        "random bytes": (None, random.Random(0).randbytes(4096), False, "bad frame magic"),
        "oversized length prefix": (None, PREFIX.pack(MAGIC, 16, 2 ** 40) + b"x" * 64, False, "exceeds the limit"),
        "wrong secret": (b"not the secret", b"", False, "bad MAC (wrong cluster secret?)"),
        "forged frame": (None, _ext_frame(["<f4", [2], 0, 8], b"\0" * 8) + TRAILER.pack(0, bytes(16)), False,
                         "frame 0: bad MAC (altered or forged on the way)"),
        "unknown ext code": (None, _ext_frame(["<f4", [1], 0, 4], b"\0" * 8, code=9), True, "unknown ext code 9"),
        "disallowed dtype": (None, _ext_frame(["|O", [1], 0, 8], b"\0" * 8), True, "not allowed on the wire"),
        "shape/size mismatch": (None, _ext_frame(["<f4", [100], 0, 8], b"\0" * 8), True,
                                "needs 400 bytes, descriptor says 8"),
        "malformed message": (None, _frame(msgpack.packb([["t", "wordcount"]])), True, "bad message: "),
        "truncated frame": (None, _ext_frame(["<f4", [2], 0, 8], b"\0" * 8)[:20], False,
                            "stream ended inside a frame"),
    }
    caplog.set_level("WARNING", logger="streamnet.runtime.dataplane.transport")
    with LocalCluster(workers=2) as c:
        target = c.workers[1]
        # a healthy topology that keeps both workers busy while the attacks land
        c.submit(wordcount.topology(count=20000, split=2, counters=2))
        outcomes, logged = {}, {}
        for name, (secret, body, signed, _) in attacks.items():
            before = len(caplog.records)
            outcomes[name] = asyncio.run(_attack(target.port, secret or c.secret, body, signed))
            wait_for(lambda: any(r.getMessage().startswith("closing stream from") for r in caplog.records[before:]),
                     10, f"the worker to log why it closed the {name} stream", interval=0.01)
            logged[name] = [r.getMessage() for r in caplog.records[before:]
                            if r.getMessage().startswith("closing stream from")]
        c.wait_done("wordcount", 120)
        results = c.kill("wordcount")
        rejected = target.stream_server.rejected
    assert wordcount.merge_counts(results) == wordcount.expected_counts(20000, 0)
    assert outcomes["wrong secret"][0] == 403 and "bad MAC" in outcomes["wrong secret"][1]
    for name, (_, _, _, reason) in attacks.items():
        if name != "wrong secret":         # upgraded, then closed by the worker
            assert outcomes[name] == (101, "closed"), (name, outcomes[name])
        assert len(logged[name]) == 1 and reason in logged[name][0], (name, logged[name])
    assert rejected == len(attacks), (rejected, outcomes)


def test_a_fenced_bolt_restarted_in_place_replays_what_it_held_at_once(caplog):
    """Another instance of count.0 writes its state (as a stale twin would): this one is
    fenced at its next save; the assignment still places the task here, so it starts
    again. The words it held unacked are failed and replayed at once - no tree waits
    for the message timeout - and the counts stay exact."""
    caplog.set_level("INFO")
    n = 3000
    with LocalCluster(workers=2) as c:
        topo = wordcount.topology(count=n, delay_s=0.001, message_timeout_s=60)
        c.submit(topo)
        key = "count.0"
        path = c.state.path("topologies", topo.name, "state", key)
        wait_for(lambda: c.state.load_state(topo.name, key)[1] >= 2, 30, "count.0 to save its state twice",
                 interval=0.01)
        data, version = c.state.coord.get(path)
        c.state.coord.set(path, data, version)
        # long enough for a timed-out tree to be replayed too, so that the counter below decides
        c.wait_done(topo.name, 180)
        spout = _task(c.worker_status(), topo.name, "sentences")
        results = c.kill(topo.name)
    assert spout["failed"] > 0 and spout["timed_out"] == 0, spout    # failed back at once, none timed out
    assert "count.0 of wordcount was taken over by another instance" in caplog.text
    assert "was fenced but the assignment places it here; starting it again" in caplog.text
    assert wordcount.merge_counts(results) == wordcount.expected_counts(n, 0)


# -- reliability knobs: message_timeout_s and max_spout_pending ------------------------

class NumberSpout(Spout):
    """Emits 0..count-1 as tracked roots; replays what fails; records which fails it got
    and the most trees it ever had open at once."""
    outputs = ["n"]

    def open(self, ctx, collector):
        super().open(ctx, collector)
        self.todo = list(range(int(self.config["count"])))[::-1]
        self.open_trees: set[int] = set()
        self.most_open, self.failed, self.acked = 0, [], 0

    def next_tuple(self):
        if self.todo:
            n = self.todo.pop()
            self.open_trees.add(n)
            self.most_open = max(self.most_open, len(self.open_trees))
            self.collector.emit([n], msg_id=n)

    def ack(self, n):
        self.open_trees.discard(n)
        self.acked += 1

    def fail(self, n):
        self.open_trees.discard(n)
        self.failed.append(n)
        self.todo.append(n)

    def is_done(self):
        return not self.todo and not self.open_trees

    def close(self):
        self.ctx.publish("failed", sorted(self.failed))
        self.ctx.publish("most_open", self.most_open)
        self.ctx.publish("acked", self.acked)


class LosingBolt(Bolt):
    """Loses the first delivery of every `lose_every`-th number: neither ack nor fail, as
    a tuple lost on the way would be. Only the message timeout can fail its tree."""
    outputs = []

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.lost: list[int] = []

    def execute(self, tup):
        n = tup["n"]
        if n % int(self.config["lose_every"]) == 0 and n not in self.lost:
            self.lost.append(n)
            return
        self.collector.ack(tup)

    def close(self):
        self.ctx.publish("lost", sorted(self.lost))


class HoldingBolt(Bolt):
    """Acks nothing until it holds `hold` tuples, then all of them (and, after a pause
    in its input, whatever it holds): a spout that did not pause at max_spout_pending
    would have many more trees open than `hold`."""
    outputs = []
    tick_interval_s = 0.2

    def prepare(self, ctx, collector):
        super().prepare(ctx, collector)
        self.held = []

    def execute(self, tup):
        self.held.append(tup)
        if len(self.held) >= int(self.config["hold"]):
            self.tick()

    def tick(self):
        for tup in self.held:
            self.collector.ack(tup)
        self.held.clear()


def _allow_this_module(cluster):
    """What `streamnet-worker --allow-module` does: these test components may run."""
    for w in cluster.workers:
        w.allow_modules = (*w.allow_modules, __name__)


def _numbers(name: str, sink: str, count: int, sink_config: dict, **config):
    b = TopologyBuilder(name)
    b.add_spout("numbers", f"{__name__}:NumberSpout", count=count)
    b.add_bolt("sink", f"{__name__}:{sink}", **sink_config).shuffle("numbers")
    return b.build(**config)


def _task(status, topology, component):
    tasks = _tasks(status, topology, component)
    assert len(tasks) == 1, tasks
    return tasks[0]


def test_a_lost_tuple_is_failed_after_message_timeout_s_and_replayed():
    with LocalCluster(workers=2) as c:
        _allow_this_module(c)
        topo = _numbers("lossy", "LosingBolt", 50, {"lose_every": 10}, message_timeout_s=3.0)
        c.submit(topo)
        c.wait_done(topo.name, 60)
        spout = _task(c.worker_status(), topo.name, "numbers")
        results = c.kill(topo.name)
    assert results["sink.0.lost"] == [0, 10, 20, 30, 40]
    # the lost trees, and only they, timed out and were failed back to the spout, which replayed them
    assert spout["timed_out"] == 5 and results["numbers.0.failed"] == [0, 10, 20, 30, 40]
    assert results["numbers.0.acked"] == 50


def test_the_spout_pauses_at_max_spout_pending():
    with LocalCluster(workers=2) as c:
        _allow_this_module(c)
        topo = _numbers("held", "HoldingBolt", 200, {"hold": 5}, max_spout_pending=5)
        c.submit(topo)
        c.wait_done(topo.name, 60)
        spout = _task(c.worker_status(), topo.name, "numbers")
        results = c.kill(topo.name)
    assert spout["pending_max"] == 5 and spout["timed_out"] == 0
    assert results["numbers.0.most_open"] == 5 and results["numbers.0.acked"] == 200


# -- GET /metrics --------------------------------------------------------------------

def test_metrics_are_the_running_workers_status_in_prometheus_text():
    """GET /metrics on a live worker, read by prometheus_client's own parser: each
    family the README lists carries the value /status shows (the run is done, so the
    numbers stand still between the two requests)."""
    import json
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with LocalCluster(workers=2) as c:
        topo = wordcount.topology(count=500, fail_every=7)
        c.submit(topo)
        c.wait_done(topo.name, 60)
        w = c.workers[0]

        def get(path):
            with urllib.request.urlopen(f"http://127.0.0.1:{w.port}{path}", timeout=5) as r:
                return r.headers["Content-Type"], r.read().decode()

        def between_two_equal_statuses():
            """/metrics read between two /status reads whose transport figures agree (an idle
            link's heartbeat moves them now and then)"""
            before = json.loads(get("/status")[1])
            content_type, text = get("/metrics")
            status = json.loads(get("/status")[1])
            same = all(before[k] == status[k] for k in ("transport", "links"))
            return same and (content_type, text, status)
        content_type, text, status = wait_for(between_two_equal_statuses, 30, "a quiet moment on the links")
        c.kill(topo.name)
    assert content_type.startswith("text/plain")
    got = {(s.name, frozenset(s.labels.items())): s.value
           for f in text_string_to_metric_families(text) for s in f.samples}
    worker = ("worker", status["worker"])
    tr = status["transport"]
    expected = {"streamnet_compute_threads": status["threads"], "streamnet_leader": int(status["leader"]),
                "streamnet_rejected_connections_total": tr["rejected"],
                "streamnet_frames_received_total": tr["frames_in"],
                "streamnet_received_bytes_total": tr["bytes_in"], "streamnet_dropped_tuples_total": tr["dropped"],
                "streamnet_open_streams": tr["open_streams"]}
    expected = {(name, frozenset([worker])): v for name, v in expected.items()}
    for peer, link in status["links"].items():
        expected[("streamnet_link_sent_bytes_total", frozenset([worker, ("peer", peer)]))] = link["bytes_out"]
    tasks = status["topologies"][topo.name]["tasks"]
    assert tasks and any(m["executed"] for m in tasks.values()), status
    for task, m in tasks.items():
        labels = {worker, ("topology", topo.name), ("component", m["component"]), ("task", task)}
        for key in ("executed", "emitted", "acked", "failed", "timed_out", "errors"):
            expected[(f"streamnet_task_{key}_total", frozenset(labels))] = m[key]
        for key in ("queue", "pending"):
            if key in m:
                expected[(f"streamnet_task_{key}", frozenset(labels))] = m[key]
                expected[(f"streamnet_task_{key}_fill_ratio", frozenset(labels))] = m[key] / m[f"{key}_max"]
        expected[("streamnet_task_execute_seconds_count", frozenset(labels))] = m["executed"]
        expected[("streamnet_task_execute_seconds_sum", frozenset(labels))] = m["execute_s_total"]
        expected[("streamnet_task_execute_seconds", frozenset(labels | {("quantile", "0.99")}))] = \
            m["execute_ms_p99"] / 1e3
    assert {k: got.get(k) for k in expected} == {k: pytest.approx(v, rel=1e-12) for k, v in expected.items()}
    busy = got[("streamnet_compute_busy_ratio", frozenset([worker]))]    # moves between the two requests
    assert 0 <= busy <= 1
