import threading

import pytest

from streamnet.runtime.control.inprocess import InProcessServer
from streamnet.runtime.control.coordinator import (BadVersionError, NoNodeError, NodeExistsError,
                                                   NotEmptyError)
from streamnet.runtime import wait_for


@pytest.fixture
def server():
    s = InProcessServer()
    yield s
    s.shutdown()


def test_nodes_versions_and_cas(server):
    c = server.session()
    c.create("/a/b", b"1")
    assert c.get("/a/b") == (b"1", 0)
    assert c.set("/a/b", b"2", version=0) == 1
    with pytest.raises(BadVersionError):
        c.set("/a/b", b"3", version=0)
    with pytest.raises(NodeExistsError):
        c.create("/a/b")
    with pytest.raises(NotEmptyError):
        c.delete("/a")
    c.delete("/a", recursive=True)
    with pytest.raises(NoNodeError):
        c.get("/a/b")


def test_ephemeral_nodes_vanish_with_the_session(server):
    a, b = server.session(), server.session()
    a.create("/workers/w1", b"x", ephemeral=True)
    seen = []
    event = threading.Event()
    b.watch_children("/workers", lambda kids: (seen.append(kids), event.set()))
    wait_for(lambda: seen and seen[-1] == ["w1"], 5, "initial watch")
    a.close()
    wait_for(lambda: seen[-1] == [], 5, "the ephemeral node to vanish")
    assert b.children("/workers") == []


def test_sequence_nodes_and_data_watch(server):
    c = server.session()
    p1 = c.create("/leader/n-", ephemeral=True, sequence=True)
    p2 = c.create("/leader/n-", ephemeral=True, sequence=True)
    assert p1 < p2 and p1.endswith("0000000000")
    versions = []
    c.watch_data("/x", lambda data, v: versions.append((data, v)))
    c.create("/x", b"a")
    c.set("/x", b"b")
    c.delete("/x")
    wait_for(lambda: len(versions) == 4, 5, "data events")
    assert versions == [(None, -1), (b"a", 0), (b"b", 1), (None, -1)]
