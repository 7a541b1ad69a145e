"""Attacks of issue 15 against running workers (loopback only, bounded loops)."""
import asyncio
import contextlib
import json
import os
import socket
import urllib.request

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from streamnet.examples import wordcount
from streamnet.runtime import LocalCluster, codec, wait_for
from streamnet.runtime.control.cluster_state import FAILED_STATUS
from streamnet.runtime.dataplane.transport import TRAILER, Auth, PeerLink, StreamServer
from streamnet.runtime.messages import AckMsg, DataMsg
from streamnet.testing import link_through_relay, stream_server_on, until

from tests.unit.test_security_allow import popen_spec

pytestmark = pytest.mark.usefixtures("no_leaks")


def _status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
        return json.load(r)


def test_a_spec_naming_popen_written_into_the_coordinator_is_refused_and_runs_nowhere(tmp_path):
    marker = tmp_path / "popen-ran"
    with LocalCluster(workers=3) as c:
        c.state.submit_topology("evil", popen_spec(str(marker)))     # straight in: no client-side check
        wait_for(lambda: c.state.assignment("evil")[0] is not None, 20, "the leader to place evil")
        # the first worker to read the spec refuses it and marks the run failed; a worker that
        # reads the status after that never builds the spec, so one refusal or more is right
        wait_for(lambda: c.state.status("evil") == FAILED_STATUS, 20, "evil to be marked failed")

        def refusals():
            return {k: v for k, v in c.state.results("evil").items() if k.startswith("refused.")}
        wait_for(lambda: refusals(), 20, "a worker's refusal of evil")
        for w in c.workers:
            assert "evil" not in w.runtimes
            if f"refused.{w.id}" in refusals():
                assert "'subprocess:Popen' is not allowed" in refusals()[f"refused.{w.id}"]
        assert not marker.exists()
        # the workers stay up and run what they may
        assert all(_status(w.port) for w in c.workers)
        results = c.run(wordcount.topology(count=500), timeout=60)
        assert wordcount.merge_counts(results) == wordcount.expected_counts(500, 0)
    assert not marker.exists()


# -- protected streams: a relay without the secret ---------------------------------------------
async def _through_relay(tamper, messages):
    """A receiver (the StreamServer a worker mounts) recording what it dispatches, a
    sender's PeerLink that reaches it through a relay; send `messages`, one at a time."""
    secret = os.urandom(32)
    got = []

    async def dispatch(msg, sender):
        got.append(msg)
    server = StreamServer(Auth(secret, "w1"), dispatch, codec.DEFAULT_LIMITS)
    async with contextlib.AsyncExitStack() as undo:      # what was made is closed, also when setting up fails
        link = await link_through_relay(undo, await stream_server_on(undo, server), secret, tamper)
        outcomes = []
        for msg in messages:
            before = (len(got), server.rejected)
            await link.send(msg)
            await until(lambda: (len(got), server.rejected) != before, "the message or its rejection")
            outcomes.append((got[before[0]:], server.rejected - before[1]))
        return outcomes


def _data(fill: int) -> DataMsg:
    return DataMsg("t", 3, "default", 1, [np.full(4096, fill, np.uint8)], [], 1)


def test_a_relay_that_flips_one_payload_byte_gets_the_stream_closed_and_nothing_delivered():
    def flip_once(state, data):
        i = data.find(b"\xab" * 64)
        if i >= 0 and not state.get("done"):
            state["done"] = True
            data = data[:i + 10] + bytes([data[i + 10] ^ 1]) + data[i + 11:]
        return data
    (first, rejected1), (second, rejected2) = asyncio.run(_through_relay(flip_once, [_data(0xAB), _data(0xCD)]))
    assert first == [] and rejected1 == 1                      # altered: refused before decoding
    # the sender reconnects; an untouched frame arrives intact
    assert rejected2 == 0 and len(second) == 1 and np.all(second[0].values[0] == 0xCD)


def test_a_relay_that_injects_a_forged_ack_gets_the_stream_closed_and_nothing_delivered():
    forged = codec.encode_bytes([AckMsg("t", 0, 12345, 6789).to_wire()])

    injected = []

    def inject_once(state, data):
        """On the first stream, once upgraded: a frame of its own before the sender's first."""
        if not state.get("passed"):
            state["head"] = state.get("head", b"") + data
            state["passed"] = b"\r\n\r\n" in state["head"]
            return data
        if state["head"].startswith(b"POST /stream") and not injected:
            injected.append(1)
            return forged + TRAILER.pack(0, os.urandom(16)) + data     # no key: a guessed tag
        return data
    (first, rejected1), (second, rejected2) = asyncio.run(_through_relay(inject_once, [_data(1), _data(2)]))
    assert not any(isinstance(m, AckMsg) for m in first + second)
    assert first == [] and rejected1 == 1
    assert rejected2 == 0 and [int(m.values[0][0]) for m in second] == [2]


def test_a_receiver_without_the_secret_gets_nothing(caplog):
    caplog.set_level("WARNING", logger="streamnet.runtime.dataplane.transport")

    async def go():
        posted = []

        async def hello(request):
            return web.json_response({"nonce": "n" * 20, "worker": "w1", "proof": "0" * 64})

        async def stream(request):
            posted.append(await request.read())
            return web.Response(text="bye")
        app = web.Application()
        app.add_routes([web.get("/hello", hello), web.post("/stream", stream)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        link = PeerLink(sender="w0", peer="w1", url=f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}",
                        auth=Auth(os.urandom(32), "w0"), session=session, limits=codec.DEFAULT_LIMITS)
        link.start()
        try:
            await link.send(_data(7))
            await until(lambda: link.reconnects >= 3, "the link to give up on that receiver three times")
            return posted, link.last_error
        finally:
            await link.close(0.2)
            await session.close()
            await runner.cleanup()
    posted, error = asyncio.run(go())
    assert posted == [] and "did not prove that it is worker w1" in error
    assert caplog.text.count("did not prove that it is worker w1") == 1     # warned once, not per retry


# -- clients without the secret -------------------------------------------------------------------
def _half_open(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nX-Slow: ")      # and never the rest
    return s


def test_half_open_connections_and_a_hello_flood_do_not_take_a_worker_offline(monkeypatch):
    from streamnet.runtime import worker as worker_module
    monkeypatch.setattr(worker_module, "HEADER_TIMEOUT_S", 2.0)
    n = 5000
    with LocalCluster(workers=2) as c:
        target = c.workers[1]
        c.submit(wordcount.topology(count=n, split=2, counters=2))
        socks = []
        try:
            for i in range(1100):                                      # the review's 1,100
                socks.append(_half_open(target.port))
                if i % 100 == 99:
                    assert _status(target.port)["worker"] == target.id
            conns = target.guard.status()
            assert conns["open"] <= target.guard.max_per_address and conns["evicted"] > 0
            # a half-sent request is closed when its header time is up
            s = _half_open(target.port)
            socks.append(s)
            s.settimeout(10)                                           # 5x the header time
            reply = s.recv(1024)
            assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply[:100]
        finally:
            for s in socks:
                s.close()

        async def flood(count):
            async with aiohttp.ClientSession() as session:
                for i in range(count):
                    async with session.get(f"http://127.0.0.1:{target.port}/hello") as r:
                        assert r.status == 200
                    if i % 500 == 499:
                        async with session.get(f"http://127.0.0.1:{target.port}/status") as r:
                            assert r.status == 200
        asyncio.run(flood(3000))
        assert len(target.auth._used) <= 4                      # /hello keeps no per-call state
        c.wait_done("wordcount", 120)
        results = c.kill("wordcount")
        assert _status(target.port)["worker"] == target.id
    assert wordcount.merge_counts(results) == wordcount.expected_counts(n, 0)


def test_a_non_ascii_auth_header_is_refused_not_a_500():
    with LocalCluster(workers=1) as c:
        port = c.workers[0].port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello", timeout=5) as r:
            nonce = json.load(r)["nonce"]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /stream HTTP/1.1\r\nHost: x\r\nX-Streamnet-From: w9\r\nX-Streamnet-Nonce: "
                      + nonce.encode() + b"\r\nX-Streamnet-Auth: \xc3\xa9\xc3\xa9\r\nContent-Length: 0\r\n\r\n")
            reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
        assert c.workers[0].stream_server.rejected == 1


# -- ZooKeeper roles: a submit credential, an observer credential, the cluster node's ACL -----
def _cli(module: str, *args, timeout=120):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", f"streamnet.cli.{module}", *args], capture_output=True, text=True,
                          timeout=timeout)


def _credential(c, tmp_path, role: str) -> str:
    path = str(tmp_path / f"{role}-credential")
    r = _cli("submit", "new-credential", role, path, "--secret-file", c.secret_file)
    assert r.returncode == 0, r.stderr
    return path


def _state_of(c, credential_file: str):
    from streamnet.runtime.control.cluster_state import ClusterState
    from streamnet.runtime.control.zk import ZkCoordinator
    with open(credential_file, "rb") as f:
        return ClusterState(ZkCoordinator(c.zk_hosts, f.read(), session_timeout=10), c.name, root=c.root)


def test_top_nodes_carry_the_roles_acls(zk):
    from streamnet.runtime.control import roles
    from streamnet.runtime.control.cluster_state import TOP_NODES
    from streamnet.testing import running_cluster
    with running_cluster(zk, workers=1) as (c, state):
        secret = open(c.secret_file, "rb").read().strip()
        for node in ("", *TOP_NODES):
            acl = state.coord.zk.get_acls(state.path(node) if node else state.base)[0]
            assert sorted(acl) == sorted(roles.top_acl(secret, node)), node
        # and what is made below inherits: a worker record grants submitters READ only
        acl = state.coord.zk.get_acls(state.path("workers", "w0"))[0]
        assert sorted(acl) == sorted(roles.top_acl(secret, "workers"))


def test_the_submit_credential_runs_and_kills_topologies_but_cannot_write_assignments_or_workers(zk, tmp_path):
    from streamnet.runtime.control.zk import UnauthorisedError
    from streamnet.testing import finish, running_cluster
    with running_cluster(zk, workers=2) as (c, state):
        submit = _credential(c, tmp_path, "submit")
        args = ["--zk", c.zk_hosts, "--cluster", c.name, "--secret-file", submit]
        r = _cli("submit", "submit", "wordcount", "--set", "count=300", "--wait", *args, timeout=180)
        assert r.returncode == 0, r.stderr
        assert "holds the cluster secret" not in r.stderr
        # a running topology, then the submit credential against its assignment
        topo = wordcount.topology(name="slow", count=3000, delay_s=0.001, max_spout_pending=20)
        state.submit_topology(topo.name, topo.to_dict())
        wait_for(lambda: state.assignment("slow")[0] is not None, 30, "slow's assignment")
        sub = _state_of(c, submit)
        try:
            before = state.assignment("slow")
            with pytest.raises(UnauthorisedError):
                sub.coord.set(sub.path("assignments", "slow"), b'{"forged": 1}')
            with pytest.raises(UnauthorisedError):
                sub.coord.create(sub.path("assignments", "forged"), b"{}")
            with pytest.raises(UnauthorisedError):
                sub.register_worker("impostor", {"host": "127.0.0.1", "port": 1})
            with pytest.raises(UnauthorisedError):
                sub.coord.delete(sub.path("leader", sub.coord.children(sub.path("leader"))[0]))
            from kazoo.exceptions import NoAuthError
            from kazoo.security import OPEN_ACL_UNSAFE
            with pytest.raises(NoAuthError):      # no ADMIN: it cannot open the topologies to everyone
                sub.coord.zk.set_acls(sub.path("topologies"), OPEN_ACL_UNSAFE)
            assert state.assignment("slow") == before and "impostor" not in state.workers()
            # what it may do: stop and kill (kill removes the assignment too)
            from streamnet.runtime.control import kill_topology
            kill_topology(sub, "slow", 60)
            assert "slow" not in state.topology_names() and state.assignment("slow")[0] is None
        finally:
            sub.coord.close()
        # the workers still run what they are given
        state.submit_topology("again", wordcount.topology(name="again", count=200).to_dict())
        assert wordcount.merge_counts(finish(state, "again")) == wordcount.expected_counts(200, 0)


def test_the_observer_credential_reads_and_writes_nothing(zk, tmp_path):
    from streamnet.runtime.control.zk import UnauthorisedError
    from streamnet.testing import running_cluster
    with running_cluster(zk, workers=1) as (c, state):
        obs = _state_of(c, _credential(c, tmp_path, "observer"))
        try:
            assert set(obs.workers()) == {"w0"}
            with pytest.raises(UnauthorisedError):
                obs.submit_topology("nope", wordcount.topology(name="nope", count=10).to_dict())
            with pytest.raises(UnauthorisedError):
                obs.coord.delete(obs.path("workers", "w0"))
        finally:
            obs.coord.close()
        assert "nope" not in state.topology_names()
        # a worker given a role credential refuses to start, naming the role
        r = _cli("worker", "--zk", c.zk_hosts, "--cluster", c.name, "--port", "0", "--name", "w9",
                 "--secret-file", str(tmp_path / "observer-credential"))
        assert r.returncode == 2 and "holds an observer credential; a worker needs the cluster secret" in r.stderr


def test_a_client_with_the_cluster_secret_is_warned_once(zk):
    from streamnet.testing import running_cluster
    with running_cluster(zk, workers=1) as (c, state):
        r = _cli("submit", "list", *c.args())
        assert r.returncode == 0, r.stderr
        assert r.stderr.count("holds the cluster secret, which lets this client do anything a worker does") == 1


def _anonymous(zk):
    from kazoo.client import KazooClient
    anon = KazooClient(hosts=zk)
    anon.start(10)
    return anon


def _worker_cli(zk, root: str, name: str, secret_file: str):
    return _cli("worker", "--zk", zk, "--zk-root", root, "--cluster", name, "--secret-file", secret_file,
                "--port", "0")


def test_a_root_made_by_a_worker_is_its_clusters_and_nobody_else_creates_below_it(zk, tmp_path):
    """ZooKeeper hygiene (finding 5): the root the workers make grants the world READ
    only; a client without the secret can neither squat a cluster name under it, nor
    fill it, nor remove a cluster; a cluster of another secret is told to take a root
    of its own, and does."""
    import uuid
    from kazoo.exceptions import NoAuthError
    from kazoo.security import ACL, Id, Permissions
    from streamnet.runtime.control import roles
    from streamnet.runtime.control.cluster_state import ClusterState
    from streamnet.runtime.control.zk import ZkCoordinator
    root = "/sn" + uuid.uuid4().hex[:8]
    other = _secret(tmp_path, "other")      # made before the try: the cleanup reads it
    anon = _anonymous(zk)
    coord = None
    try:
        with open(_secret(tmp_path, "owner"), "rb") as f:
            secret = f.read().strip()
        coord = ZkCoordinator(zk, secret, session_timeout=10)
        ClusterState(coord, "first", root=root)
        assert sorted(coord.zk.get_acls(root)[0]) == sorted(
            [ACL(Permissions.READ, Id("world", "anyone")), ACL(Permissions.ALL, roles.role_ids(secret)["worker"])])
        for attack in (lambda: anon.create(f"{root}/squatted", b""),
                       lambda: anon.create(f"{root}/bloat", b"x" * 1000),
                       lambda: anon.delete(f"{root}/first", recursive=True)):
            with pytest.raises(NoAuthError):
                attack()
        assert anon.get_children(root) == ["first"]
        # a cluster of another secret: refused with what to do, and it starts under its own root
        r = _worker_cli(zk, root, "second", other)
        assert r.returncode == 2, r.stderr
        assert f"cannot create {root}/second: the root {root} belongs to another cluster's workers" in r.stderr
        assert f"--zk-root {root}-second" in r.stderr
        r = _cli("submit", "list", "--zk", zk, "--zk-root", f"{root}-second", "--cluster", "second",
                 "--secret-file", other)
        assert r.returncode == 0 and "no topologies" in r.stdout, r.stderr
        assert anon.get_children(f"{root}-second") == ["second"]
    finally:
        try:
            try:
                if coord is not None:
                    try:
                        coord.delete(root, recursive=True)
                    finally:
                        coord.close()
            finally:
                seconds = ZkCoordinator(zk, (tmp_path / "other").read_bytes().strip(), session_timeout=10)
                try:
                    seconds.delete(f"{root}-second", recursive=True)    # absent if it failed before
                finally:
                    seconds.close()
        finally:
            anon.stop()
            anon.close()


def _secret(tmp_path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(os.urandom(24).hex().encode())
    path.chmod(0o600)
    return str(path)


def test_a_cluster_name_squatted_under_an_open_root_is_refused_at_start(zk, tmp_path):
    """A root made by an older streamnet (world CREATE|DELETE) can still be squatted:
    the worker refuses the squatted name, naming who owns it, and warns about the root."""
    import uuid
    from kazoo.exceptions import NoAuthError
    from kazoo.security import ACL, Id, Permissions
    from streamnet.testing import running_cluster
    root, name = "/open" + uuid.uuid4().hex[:8], "squat"
    anon = _anonymous(zk)
    try:
        shared = [ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE, Id("world", "anyone"))]
        anon.create(root, b"", acl=shared)                       # as streamnet made /streamnet before
        anon.create(f"{root}/{name}", b"")                       # world-open, by a client with no secret
        secret = _secret(tmp_path, "s")
        r = _worker_cli(zk, root, name, secret)
        assert r.returncode == 2, r.stderr
        assert f"{root}/{name} carries the ACL [world:anyone=ALL], not this cluster's" in r.stderr
        assert "someone else owns the cluster name" in r.stderr
        assert f"the ZooKeeper root {root} lets anyone create and delete nodes below it" in r.stderr
        # and inside a real cluster, a client without the secret can neither add nor remove nodes
        with running_cluster(zk, workers=1) as (c, state):
            with pytest.raises(NoAuthError):
                anon.create(state.path("topologies", "evil"), b"{}")
            with pytest.raises(NoAuthError):
                anon.delete(state.path("topologies"))
            with pytest.raises(NoAuthError):
                anon.create(state.path("bloat"), b"x" * 1000)
    finally:
        anon.delete(root, recursive=True)
        anon.stop()
        anon.close()


def test_a_cluster_made_before_roles_gets_them_from_its_first_worker(zk):
    import uuid
    from kazoo.security import ACL, Permissions
    from streamnet.runtime.control import roles
    from streamnet.runtime.control.cluster_state import TOP_NODES, ClusterState
    from streamnet.runtime.control.zk import ZkCoordinator
    secret = os.urandom(24).hex().encode()
    root, name = "/old" + uuid.uuid4().hex[:8], "old"
    coord = ZkCoordinator(zk, secret, session_timeout=10)
    try:
        worker = roles.parse(secret)[0]
        legacy = [ACL(Permissions.ALL, worker.id)]
        coord.ensure_root(root)
        for node in ("", *TOP_NODES):
            coord.zk.create(f"{root}/{name}" + (f"/{node}" if node else ""), b"", acl=legacy)
        state = ClusterState(coord, name, root=root)
        for node in ("", *TOP_NODES):
            assert sorted(coord.zk.get_acls(state.path(node) if node else state.base)[0]) == \
                sorted(roles.top_acl(secret, node))
    finally:
        coord.delete(root, recursive=True)
        coord.close()


# -- the monitor token, and a service stop that hands tasks over -------------------------------
def test_status_and_metrics_need_the_monitor_token_when_the_worker_has_one(zk, tmp_path):
    import urllib.error
    from streamnet.testing import Cluster
    token = tmp_path / "token"
    token.write_text("a-monitor-token-0123456789\n")
    token.chmod(0o600)
    c = Cluster(zk, workers=0)
    state = None
    try:
        c.start_worker("w0", ["--monitor-token-file", str(token)])
        state = c.state()
        c.wait_registered(1, state)
        info = state.workers()["w0"]
        for path in ("/status", "/metrics"):
            url = f"http://127.0.0.1:{info['port']}{path}"
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=5)
            assert refused.value.code == 401 and b"needs the monitor token" in refused.value.read()
            ask = urllib.request.Request(url, headers={"Authorization": "Bearer a-monitor-token-0123456789"})
            with urllib.request.urlopen(ask, timeout=5) as r:
                body = r.read()
                assert r.status == 200
                assert b"streamnet_" in body if path == "/metrics" else json.loads(body)["worker"] == "w0"
        # streamnet-submit status sends the token of $STREAMNET_MONITOR_TOKEN_FILE
        without = _cli("submit", "status", *c.args())
        assert without.returncode == 0, without.stdout + without.stderr
        assert "refused: it needs the monitor token (401); set $STREAMNET_MONITOR_TOKEN_FILE" in without.stdout
        import subprocess
        import sys
        env = dict(os.environ, STREAMNET_MONITOR_TOKEN_FILE=str(token))
        with_token = subprocess.run([sys.executable, "-m", "streamnet.cli.submit", "status", *c.args()],
                                    capture_output=True, text=True, timeout=120, env=env)
        assert with_token.returncode == 0 and "busy" in with_token.stdout, with_token.stdout + with_token.stderr
        short = token.parent / "short-token"
        short.write_text("too-short")
        short.chmod(0o600)
        bad = subprocess.run([sys.executable, "-m", "streamnet.cli.submit", "status", *c.args()], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, STREAMNET_MONITOR_TOKEN_FILE=str(short)))
        assert bad.returncode == 2 and bad.stdout == "", bad.stdout     # said before any line of the status
        assert "must hold one word of at least 16" in bad.stderr
    except BaseException:
        print(c.dump_logs())
        raise
    finally:
        if state is not None:
            state.coord.close()
        c.close()


def test_sigterm_to_one_worker_hands_its_tasks_over_and_the_topology_goes_on(zk):
    import signal
    from streamnet.testing import finish, placement, running_cluster
    with running_cluster(zk, workers=2) as (c, state):
        topo = wordcount.topology(name="goes-on", count=3000, split=2, counters=3, delay_s=0.001,
                                  max_spout_pending=50, message_timeout_s=5)
        state.submit_topology(topo.name, topo.to_dict())
        wait_for(lambda: len(set(placement(state, topo.name).values())) == 2, 30, "tasks on both workers")
        victim = "w1"
        c.procs[victim].send_signal(signal.SIGTERM)     # systemctl stop on one node
        assert c.procs[victim].wait(60) == 0
        assert state.status(topo.name) == "active"
        wait_for(lambda: set(placement(state, topo.name).values()) == {"w0"}, 30, "w1's tasks to move to w0")
        results = finish(state, topo.name)
        assert wordcount.merge_counts(results) == wordcount.expected_counts(3000, 0)
        assert "stopping (leave)" in open(c.logs[victim]).read()


def test_workers_sign_their_checkpoints_and_a_forged_one_is_refused_on_resume(zk, tmp_path):
    from streamnet.testing import running_cluster
    from streamnet.training.checkpoint import checkpoint_key, list_checkpoints, load_checkpoint
    from tests.unit.test_security_checkpoint import _forge
    ckdir = str(tmp_path / "ck")
    args = ["lenet5-mixbp", "--name", "signed", "--dataset", "synthetic", "--epochs", "2", "--workers", "1",
            "--checkpoint-dir", ckdir]
    with running_cluster(zk, workers=1) as (c, state):
        r = c.submit_cli("submit", *args, "--keep-checkpoints", "1", "--wait", "--timeout", "300", timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        kept = list_checkpoints(ckdir, "signed")
        assert len(kept) == 1                       # one per epoch written, the older one removed
        path = kept[0][1]
        key = checkpoint_key(open(c.secret_file, "rb").read().strip())
        assert open(path, "rb").read(6) == b"SNCK3\n" and load_checkpoint(path, key=key)["authenticated"]
        _forge(path, np.zeros(load_checkpoint(path, key=key)["params"].size))
        r = c.submit_cli("submit", *args, "--epochs", "3", "--resume", timeout=120)
        assert r.returncode == 2 and "was changed by someone without the cluster secret" in r.stderr, r.stderr
        # a submitter cannot check the MAC, but checks the SHA-256 the workers recorded in ZooKeeper
        submit = _credential(c, tmp_path, "submit")
        r = _cli("submit", "submit", *args, "--epochs", "3", "--resume", "--zk", c.zk_hosts, "--cluster", c.name,
                 "--secret-file", submit)
        assert r.returncode == 2 and f"{path} was changed after the workers wrote it" in r.stderr, r.stderr
        assert state.topology_names() == []         # refused before anything was submitted


# -- a checkpoint that fails verification: the run fails clearly, or goes on without it ------------
def _resumable(tmp_path, name: str):
    """A 1-epoch run's checkpoint and a 4-epoch config to resume it with (embedded cluster)."""
    from dataclasses import replace
    from streamnet.training import AlgorithmConfig, DataConfig, ModelConfig, RunConfig
    from streamnet.training.cluster_run import train_on_local_cluster
    alg = AlgorithmConfig(name="mixbp", batch=16, sync_period=1, lr=0.05, momentum=0.9, weight_decay=1e-3)
    cfg = RunConfig(model=ModelConfig(name="lenet5"), data=DataConfig(dataset="synthetic", synthetic_train=2048,
                    synthetic_test=64), algorithm=alg, units=2, threads=2, epochs=1, seed=5)
    ckdir = str(tmp_path / "ck")
    train_on_local_cluster(cfg, workers=2, checkpoint_dir=ckdir, name=name)
    return replace(cfg, epochs=4), ckdir


def test_a_resumed_sync_task_moved_after_its_checkpoint_was_changed_goes_on_from_the_replicas(tmp_path,
                                                                                               monkeypatch):
    """The checkpoint a run resumed from is read once, at the start: a sync task that
    starts again on another worker (its host died) recovers from the coordinator and the
    replicas. Before, it read the file again and failed the whole run when the file had
    been changed (or removed by --keep-checkpoints) since."""
    from streamnet.testing import cluster_in_mode, finish, placement
    from streamnet.training.nsmap import build_topology, resume_point
    from streamnet.training.summary_from_results import summarise
    from streamnet.training.sync_bolt import SyncBolt
    monkeypatch.setattr(SyncBolt, "PUBLISH_S", 0.05)   # the kill lands long before the run's last round
    cfg, ckdir = _resumable(tmp_path, "moved")
    point = resume_point(cfg, ckdir, "moved")
    topo = build_topology(cfg, name="moved", checkpoint_dir=ckdir, resume=point)
    with cluster_in_mode("local", None, workers=3) as (c, state):
        state.submit_topology(topo.name, topo.to_dict())
        where = wait_for(lambda: placement(state, topo.name), 30, "the assignment")
        wait_for(lambda: (state.results(topo.name).get("sync.0.progress") or {}).get("rounds", 0) > point["step"] + 5,
                 60, "the resumed run to train", interval=0.05)
        raw = bytearray(open(point["path"], "rb").read())
        raw[len(raw) // 2] ^= 0xFF
        open(point["path"], "wb").write(bytes(raw))
        c.kill9(where[topo.tasks("sync")[0]])
        results = finish(state, topo.name, timeout=180)
    s = summarise(cfg, results, workers=3)
    assert not any(k.startswith("failed.") for k in results), results.keys()
    assert results["sync.0.stats"]["recoveries"] == 1
    assert s.extra["resumed_from_step"] == point["step"] and s.extra["each_sample_counted_once"] is True
    assert results["sync.0.stats"]["epoch_samples"] == {str(e): 2048 for e in range(1, 5)}


def test_a_checkpoint_without_the_clusters_mac_fails_the_resumed_run_clearly_and_the_worker_serves_on(zk, tmp_path):
    """A submitter holding the submit credential cannot check a checkpoint's MAC; the
    workers do: the run fails at once with the file and the reason (the client exits 1
    on TopologyFailed), nothing trains from it, and the worker runs what comes next."""
    from streamnet.runtime.control import TopologyFailed, kill_topology, wait_done
    from streamnet.testing import finish, running_cluster
    from streamnet.training.nsmap import build_topology, resume_point
    cfg, ckdir = _resumable(tmp_path, "unsigned")       # written by an embedded cluster: no MAC
    point = resume_point(cfg, ckdir, "unsigned")
    topo = build_topology(cfg, name="unsigned", checkpoint_dir=ckdir, resume=point)
    with running_cluster(zk, workers=1) as (c, state):
        state.submit_topology(topo.name, topo.to_dict())
        with pytest.raises(TopologyFailed) as failed:
            wait_done(state, topo.name, 60)
        assert f"{point['path']} is not authenticated" in str(failed.value)
        assert "sync.0.progress" not in state.results(topo.name)
        kill_topology(state, topo.name, 60)
        assert c.procs["w0"].poll() is None
        state.submit_topology("after", wordcount.topology(name="after", count=200).to_dict())
        assert wordcount.merge_counts(finish(state, "after")) == wordcount.expected_counts(200, 0)


# -- ZooKeeper over TLS: the digest credentials no longer cross the network in clear ------------
@pytest.mark.slow      # its own ZooKeeper, certificates, a worker: ~35 s here
@pytest.mark.skipif(not __import__("shutil").which("openssl"), reason="needs openssl for the certificates")
def test_workers_and_clients_reach_a_tls_only_zookeeper_and_plain_clients_do_not():
    from streamnet.testing import ZooKeeper, finish, running_cluster, zookeeper_installed
    if not zookeeper_installed():
        pytest.skip("needs Debian's zookeeper package")
    server = ZooKeeper(tls=True).start()
    try:
        assert {"ca.pem", "client.pem", "client-key.pem", "server.pem"} <= set(os.listdir(server.tls_dir))
        with running_cluster(server.hosts, workers=1, zk_tls=server.tls_dir) as (c, state):
            state.submit_topology("tls", wordcount.topology(name="tls", count=200).to_dict())
            assert wordcount.merge_counts(finish(state, "tls")) == wordcount.expected_counts(200, 0)
            r = _cli("submit", "list", *c.args())            # a client with --zk-tls
            assert r.returncode == 0, r.stderr
            # without TLS, or over TLS without a certificate of the ensemble's CA: no session
            plain = [a for a in c.args() if a != server.tls_dir and a != "--zk-tls"]
            r = _cli("submit", "list", *plain, "--session-timeout", "3")
            assert r.returncode == 1 and "ZooKeeper did not answer (1 of 1 servers reachable)" in r.stderr, r.stderr
            # (in a process of its own: a kazoo client that never connected keeps its socket pair)
            probe = ("import sys\nfrom kazoo.client import KazooClient\n"
                     "for options in ({}, {'use_ssl': True, 'ca': sys.argv[2]}):\n"
                     "    z = KazooClient(hosts=sys.argv[1], connection_retry={'max_tries': 2}, **options)\n"
                     "    try:\n        z.start(3)\n        print('connected')\n"
                     "    except Exception as e:\n        print(type(e).__name__)\n"
                     "    z.stop()\n")
            import subprocess
            import sys
            r = subprocess.run([sys.executable, "-c", probe, server.hosts, os.path.join(server.tls_dir, "ca.pem")],
                               capture_output=True, text=True, timeout=60)
            assert r.stdout.split() == ["KazooTimeoutError", "KazooTimeoutError"], r.stdout + r.stderr
    finally:
        server.stop()


def test_malformed_requests_from_a_stranger_fill_no_log(caplog):
    """aiohttp's server logs each malformed request with its traceback (11 lines): a
    loop of them from anyone who reaches the port wrote 11,000 lines in half a second.
    Its logger now has the stream refusals' budget: 20 lines a minute, the next line
    saying how many were left out; the worker answers on."""
    import logging
    with LocalCluster(workers=1) as c:
        port = c.workers[0].port
        with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
            for _ in range(60):
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n")
                    s.settimeout(5)
                    with contextlib.suppress(OSError):
                        while s.recv(4096):     # the 400 answer, then the worker closes
                            pass
            logged = [r for r in caplog.records if r.name == "aiohttp.server"]
        assert len(logged) <= 20, len(logged)      # (the budget is the process's: earlier tests may have used some)
        assert _status(port)["worker"] == c.workers[0].id
