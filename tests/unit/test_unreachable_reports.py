"""Reports of unreachable peers at scale: only the leader and the next in line act on
them, and a connection that fails for a reason of the sender's own (out of file
descriptors) is no report about the peer - neither from a link nor from the probe."""
import asyncio
import errno
import threading
import types
import urllib.error

import aiohttp
import pytest

from streamnet.runtime import wait_for
from streamnet.runtime.control import scheduler
from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.election import ProbeInconclusive, probe
from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.control.scheduler import SchedulerService
from streamnet.runtime.dataplane import transport
from streamnet.runtime.dataplane.transport import CONNECT_FAILURES, PeerLink

CANDIDATES = 5


class _CountingEvent(threading.Event):
    def __init__(self):
        super().__init__()
        self.sets = 0

    def set(self):
        self.sets += 1
        super().set()


@pytest.fixture
def schedulers():
    """CANDIDATES schedulers in an election on one in-process coordinator, each with its
    own session; their passes run on wakes only (a period of an hour)."""
    server = InProcessServer()
    out = []
    try:        # stopped also when the setup fails
        for i in range(CANDIDATES):
            s = SchedulerService(ClusterState(server.session(), "t"), f"w{i}", auth=None, period_s=3600)
            s._wake = _CountingEvent()
            s.reads = 0
            read = s.state.unreachable_reports

            def counted(read=read, s=s):
                s.reads += 1
                return read()
            s.state.unreachable_reports = counted
            s.start()
            out.append(s)
        wait_for(lambda: out[0].leading and all(s.election.leader == "w0" for s in out), 10, "w0 to lead")
        yield server, out
    finally:
        for s in out:
            s.stop()
            s.state.coord.close()
        server.shutdown()


def _settled(server, state: ClusterState, nodes: int):
    """Until every watch callback of the reports so far ran: a watch registered after the
    schedulers' sees the change last (callbacks run in order on one thread)."""
    seen = []
    cancel = state.watch_unreachable(seen.append)
    try:
        wait_for(lambda: seen and len(seen[-1]) == nodes, 10, f"{nodes} report(s) delivered")
    finally:
        cancel()


def test_a_report_of_a_follower_wakes_the_leader_only(schedulers):
    server, (leader, *followers) = schedulers
    before = [s._wake.sets for s in followers]
    reporter = ClusterState(server.session(), "t")
    reporter.report_unreachable("w3", "w9", "ConnectionRefusedError")
    _settled(server, reporter, 1)
    wait_for(lambda: leader.reads > 0, 10, "the leader to read the reports")
    assert [s._wake.sets for s in followers] == before
    assert [s.reads for s in followers] == [0] * len(followers)


def test_a_dead_leader_is_deposed_by_the_next_in_line_alone(schedulers, monkeypatch):
    server, (leader, nxt, *rest) = schedulers
    monkeypatch.setattr(scheduler, "probe", lambda info, worker, auth: "ConnectionRefusedError")
    reporter = ClusterState(server.session(), "t")
    reporter.report_unreachable("w0", "w9", "ConnectionRefusedError")
    wait_for(lambda: nxt.leading, 10, "w1 to take over from the reported leader")
    assert all(s.election.leader == "w1" for s in rest)
    assert nxt.reads >= 1                            # it confirmed the report before acting
    assert [s.reads for s in rest] == [0] * len(rest)


def test_a_report_of_the_leader_that_the_probe_cannot_judge_deposes_nobody(schedulers, monkeypatch, caplog):
    server, (leader, nxt, *rest) = schedulers

    def no_descriptors(info, worker, auth):
        raise ProbeInconclusive(f"could not probe {worker}: [Errno 24] Too many open files")
    monkeypatch.setattr(scheduler, "probe", no_descriptors)
    reporter = ClusterState(server.session(), "t")
    reporter.register_worker("w0", {"host": "127.0.0.1", "port": 1})
    reporter.report_unreachable("w0", "w9", "ConnectionRefusedError")
    wait_for(lambda: "not taking over" in caplog.text, 10, "the next in line to look at the report")
    assert leader.leading and nxt.election.leader == "w0"
    assert nxt._thread.is_alive()                   # the scheduler carries on


def test_a_probe_that_fails_for_lack_of_descriptors_is_inconclusive(monkeypatch):
    def urlopen(*a, **k):
        raise urllib.error.URLError(OSError(errno.EMFILE, "Too many open files"))
    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    with pytest.raises(ProbeInconclusive, match="Too many open files"):
        probe({"host": "127.0.0.1", "port": 1}, "w1", auth=None)

    def refused(*a, **k):
        raise urllib.error.URLError(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    monkeypatch.setattr("urllib.request.urlopen", refused)
    assert "Connection refused" in probe({"host": "127.0.0.1", "port": 1}, "w1", auth=None)


class _FailingSession:
    """Each connection attempt fails at once with `error`."""

    def __init__(self, error: Exception):
        self.error, self.attempts = error, 0

    def get(self, *a, **k):
        self.attempts += 1
        raise self.error


def _connector_error(code: int) -> aiohttp.ClientConnectorError:
    key = types.SimpleNamespace(host="127.0.0.1", port=1, ssl=False)
    return aiohttp.ClientConnectorError(key, OSError(code, errno.errorcode[code]))


@pytest.mark.parametrize("code, reported", [(errno.ECONNREFUSED, True), (errno.EMFILE, False),
                                            (errno.EADDRNOTAVAIL, False)])
def test_a_link_reports_its_peer_only_for_the_peers_failures(code, reported, caplog, monkeypatch):
    monkeypatch.setattr(transport, "_shortages", set())
    reports = []

    async def main():
        session = _FailingSession(_connector_error(code))
        link = PeerLink(sender="w0", peer="w1", url="http://127.0.0.1:1", auth=None, session=session,
                        limits=None)
        link.on_unreachable = lambda peer, why: reports.append((peer, why))
        link.start()
        try:
            for _ in range(1000):           # a deadline on attempts, not on time
                if session.attempts > CONNECT_FAILURES + 1:
                    break
                await asyncio.sleep(0.01)
        finally:
            link.abort()
        return session.attempts
    attempts = asyncio.run(main())
    assert attempts > CONNECT_FAILURES + 1
    assert [peer for peer, _ in reports] == (["w1"] if reported else [])     # once, at the third refusal
    shortage = [r.getMessage() for r in caplog.records if "short of its own resources" in r.getMessage()]
    assert len(shortage) == (0 if reported else 1), shortage                  # said once, not per attempt
