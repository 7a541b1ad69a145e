"""The stream engine on the embedded local cluster: exact results, replay,
backpressure, and bad input against a running worker."""
import asyncio
import os

import aiohttp
import msgpack
import pytest

from streamnet.examples import flood, tensor_pipe, wordcount
from streamnet.runtime import LocalCluster, wait_for
from streamnet.runtime.codec import ARRAY_EXT, MAGIC, PREFIX
from streamnet.runtime.dataplane.transport import Auth

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
        # the spout lands on w0 and the bolt on w1: tuples cross the socket
        c.submit(flood.topology(delay_s=0.002, queue_size=64, pad=pad))
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
    # the sender's link queue, the receiver's read buffer (aiohttp pauses the socket past
    # twice its size), the kernel's TCP buffers, and the bolt's queue.
    from streamnet.runtime.worker import READ_BUFSIZE
    bound = 1024 + 64 + 2 + (2 * READ_BUFSIZE + _tcp_buffer_max()) // pad
    assert max(gaps) <= bound, (max(gaps), bound)
    # and the bolt was the bottleneck: tuples did pile up beyond its own queue
    assert max(gaps) > 64


async def _attack(port: int, secret: bytes, body: bytes) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/hello") as r:
            nonce = (await r.json())["nonce"]
        headers = {"X-Streamnet-From": "intruder", "X-Streamnet-Nonce": nonce,
                   "X-Streamnet-Auth": Auth(secret, "intruder").sign(nonce, "intruder", "w1")}
        try:
            async with s.post(f"http://127.0.0.1:{port}/stream", data=body, headers=headers) as r:
                return r.status, await r.text()
        except aiohttp.ClientError as e:  # the server may close while we still write
            return 0, str(e)


def _frame(header: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(MAGIC, len(header), len(payload)) + header + payload


def _ext_frame(meta, payload=b"", code=ARRAY_EXT):
    return _frame(msgpack.packb([["t", "wordcount", 1, "default", 0,
                                  [msgpack.ExtType(code, msgpack.packb(meta))], []]]), payload)


def test_bad_input_closes_one_connection_and_the_worker_keeps_serving():
    attacks = {
        "random bytes": (None, os.urandom(4096)),
        "oversized length prefix": (None, PREFIX.pack(MAGIC, 16, 2 ** 40) + b"x" * 64),
        "wrong secret": (b"not the secret", b""),
        "unknown ext code": (None, _ext_frame(["<f4", [1], 0, 4], b"\0" * 8, code=9)),
        "disallowed dtype": (None, _ext_frame(["|O", [1], 0, 8], b"\0" * 8)),
        "shape/size mismatch": (None, _ext_frame(["<f4", [100], 0, 8], b"\0" * 8)),
        "malformed message": (None, _frame(msgpack.packb([["t", "wordcount"]]))),
        "truncated frame": (None, _ext_frame(["<f4", [2], 0, 8], b"\0" * 8)[:20]),
    }
    with LocalCluster(workers=2) as c:
        target = c.workers[1]
        # a healthy topology that keeps both workers busy while the attacks land
        c.submit(wordcount.topology(count=20000, split=2, counters=2))
        outcomes = {}
        for name, (secret, body) in attacks.items():
            outcomes[name] = asyncio.run(_attack(target.port, secret or c.secret, body))
        c.wait_done("wordcount", 120)
        results = c.kill("wordcount")
        rejected = target.stream_server.rejected
    assert wordcount.merge_counts(results) == wordcount.expected_counts(20000, 0)
    assert outcomes["wrong secret"][0] == 403 and "bad MAC" in outcomes["wrong secret"][1]
    for name in attacks:
        if name != "wrong secret":
            assert outcomes[name][0] in (400, 0), (name, outcomes[name])
    assert rejected == len(attacks), (rejected, outcomes)


def test_a_fenced_bolt_restarted_in_place_replays_what_it_held_at_once(caplog):
    """Another instance of count.0 writes its state (as a stale twin would): this one is
    fenced at its next save; the assignment still places the task here, so it starts
    again. The words it held unacked are failed and replayed at once - the run ends
    well inside the message timeout - and the counts stay exact."""
    caplog.set_level("INFO")
    n = 3000
    with LocalCluster(workers=2) as c:
        topo = wordcount.topology(count=n, delay_s=0.001, message_timeout_s=120)
        c.submit(topo)
        key = "count.0"
        path = c.state.path("topologies", topo.name, "state", key)
        wait_for(lambda: c.state.load_state(topo.name, key)[1] >= 2, 30, "count.0 to save its state twice",
                 interval=0.01)
        data, version = c.state.coord.get(path)
        c.state.coord.set(path, data, version)
        c.wait_done(topo.name, 60)   # half the message timeout: no tree may wait for it
        results = c.kill(topo.name)
    assert "count.0 of wordcount was taken over by another instance" in caplog.text
    assert "was fenced but the assignment places it here; starting it again" in caplog.text
    assert wordcount.merge_counts(results) == wordcount.expected_counts(n, 0)
