"""Streams with TLS (--tls-cert/--tls-key/--tls-ca): two workers' ends talk through it
and nothing of a tensor shows on the wire; a sender whose certificate the cluster's CA
did not sign, or that does not speak TLS, is refused and delivers nothing."""
import asyncio
import contextlib
import os

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from streamnet.runtime import codec
from streamnet.runtime.dataplane.tls import TlsConfig, TlsError, make_pki
from streamnet.runtime.dataplane.transport import Auth, StreamServer
from streamnet.runtime.messages import DataMsg
from streamnet.testing import link_through_relay, stream_server_on, until

pytestmark = pytest.mark.usefixtures("no_leaks")
MARK = b"\xab" * 64


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """w0 and w1 with certificates of the cluster's CA; rogue with one of another CA
    (it trusts the cluster's CA, so only its own certificate is wrong)."""
    configs = make_pki(str(tmp_path_factory.mktemp("pki")), ["w0", "w1"])
    rogue = make_pki(str(tmp_path_factory.mktemp("other")), ["rogue"])["rogue"]
    configs["rogue"] = TlsConfig(cert=rogue.cert, key=rogue.key, ca=configs["w0"].ca)
    return configs.__getitem__


def _send(receiver_tls: TlsConfig | None, sender_tls: TlsConfig | None, expect: str):
    """Send a tensor of MARK bytes from w0 to w1 through a relay; wait for it to arrive
    (expect="delivered") or for the receiver to refuse the stream ("refused").
    Returns (messages received, streams refused, bytes seen on the wire)."""
    secret = os.urandom(32)

    async def go():
        got = []

        async def dispatch(msg, sender):
            got.append(msg)
        server = StreamServer(Auth(secret, "w1"), dispatch, codec.DEFAULT_LIMITS, tls=receiver_tls)
        seen = bytearray()          # what the sender wrote, as the wire carried it
        async with contextlib.AsyncExitStack() as undo:      # what was made is closed, also when setting up fails
            link = await link_through_relay(undo, await stream_server_on(undo, server), secret,
                                            lambda state, data: seen.extend(data) or data, sender_tls, close_s=0.1)
            undo.callback(link.abort)
            await link.send(DataMsg("t", 1, "default", 0, [np.frombuffer(MARK * 100, np.uint8)], [], 1))
            if expect == "delivered":
                await until(lambda: got, "the tensor")
            else:
                await until(lambda: server.rejected, "the receiver to refuse the stream")
            return got, server.rejected, bytes(seen)
    return asyncio.run(go())


def test_two_ends_with_certificates_of_the_cluster_ca_talk_and_the_wire_shows_no_tensor(pki):
    got, rejected, wire = _send(pki("w1"), pki("w0"), "delivered")
    (msg,) = got
    assert rejected == 0 and bytes(msg.values[0]) == MARK * 100
    assert b"streamnet-frames/4+tls" in wire and MARK not in wire      # the upgrade in clear, frames not


def test_without_tls_the_tensor_is_on_the_wire(pki):
    """The peer of the test above: the tap does see a plain stream's tensor."""
    got, rejected, wire = _send(None, None, "delivered")
    assert len(got) == 1 and MARK in wire


def test_a_sender_with_a_certificate_of_another_ca_is_refused(pki):
    got, rejected, _ = _send(pki("w1"), pki("rogue"), "refused")
    assert got == [] and rejected >= 1


def test_a_sender_without_tls_is_refused_by_a_receiver_that_requires_it(pki):
    got, rejected, _ = _send(pki("w1"), None, "refused")
    assert got == [] and rejected >= 1


def test_missing_tls_files_are_one_clear_error(tmp_path, pki):
    with pytest.raises(TlsError, match="--tls-key .*nope.key: no such file"):
        TlsConfig(cert=pki("w0").cert, key=str(tmp_path / "nope.key"), ca=pki("w0").ca)


def test_a_key_others_may_read_is_refused_with_the_fix(tmp_path, pki):
    key = tmp_path / "open.key"
    key.write_bytes(open(pki("w0").key, "rb").read())
    key.chmod(0o644)
    with pytest.raises(TlsError, match=r"--tls-key .*open.key has mode 0644.*chmod 600"):
        TlsConfig(cert=pki("w0").cert, key=str(key), ca=pki("w0").ca)
    key.chmod(0o600)
    assert TlsConfig(cert=pki("w0").cert, key=str(key), ca=pki("w0").ca).server is not None


def test_tls_handshakes_that_time_out_give_their_connection_slots_back(pki, monkeypatch):
    """asyncio's TLS layer tells nobody of a connection it drops during its handshake (a
    sender that never sends its ClientHello): the connection guard kept each such
    connection's slot for good, and after 512 a worker refused every connection (its
    /status, /hello and every peer's stream)."""
    from streamnet.runtime.dataplane import transport
    from streamnet.runtime.dataplane.guard import ConnectionGuard, GuardedRunner
    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT_S", 0.3)

    async def go():
        guard = ConnectionGuard()
        secret = os.urandom(32)

        async def dispatch(msg, sender):
            pass
        server = StreamServer(Auth(secret, "w1"), dispatch, codec.DEFAULT_LIMITS, tls=pki("w1"))
        app = web.Application()
        app.add_routes(server.routes())
        async with contextlib.AsyncExitStack() as undo:
            port = await stream_server_on(undo, server, GuardedRunner(app, guard, access_log=None))
            session = await undo.enter_async_context(aiohttp.ClientSession())
            sender = Auth(secret, "w0")
            for n in range(1, 4):
                async with session.get(f"http://127.0.0.1:{port}/hello") as r:
                    nonce = (await r.json())["nonce"]
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                undo.callback(writer.close)
                writer.write((f"POST /stream HTTP/1.1\r\nHost: x\r\nUpgrade: {transport.PROTOCOL_TLS}\r\n"
                              f"Connection: Upgrade\r\nX-Streamnet-From: w0\r\nX-Streamnet-Nonce: {nonce}\r\n"
                              f"X-Streamnet-Auth: {sender.sign(nonce, 'w0', 'w1')}\r\nContent-Length: 0\r\n\r\n"
                              ).encode())
                assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 101")
                # and no ClientHello: the receiver's handshake times out
                await until(lambda: server.rejected == n, "the handshake to time out", timeout=10)
            await until(lambda: not guard.open, "the guard to hold no connection", timeout=10)
            return server.rejected, guard.status()
    rejected, status = asyncio.run(go())
    assert rejected == 3 and status["open"] == 0
