"""The handshake's nonces: taken once, and only by the process that issued them."""
import os

from streamnet.runtime.dataplane.handshake import Auth


def test_a_worker_started_again_refuses_a_stream_recorded_before_its_restart():
    secret = os.urandom(32)
    receiver, sender = Auth(secret, "w1"), Auth(secret, "w0")
    nonce = receiver.challenge()
    mac = sender.sign(nonce, "w0", "w1")
    assert receiver.verify(nonce, "w0", mac) is None
    assert receiver.verify(nonce, "w0", mac) == "reused nonce"         # a replay to the same process
    restarted = Auth(secret, "w1")          # the same secret and id, a new process: no memory of used nonces
    assert restarted.verify(nonce, "w0", mac) == "unknown nonce"
    fresh = restarted.challenge()
    assert restarted.verify(fresh, "w0", sender.sign(fresh, "w0", "w1")) is None
