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


def test_the_macs_tell_apart_fields_that_join_to_the_same_text():
    """A separator inside a field (worker ids are only checked to be short ASCII) must not
    let one list of fields pass for another."""
    auth = Auth(os.urandom(32), "w1")
    nonce = auth.challenge()
    assert auth.sign(nonce, "a|b", "c") != auth.sign(nonce, "a", "b|c")
    assert auth.hello_proof(nonce, "x|y", "z") != auth.hello_proof(nonce, "x", "y|z")
    assert auth.session_key(nonce, "a|b", "c") != auth.session_key(nonce, "a", "b|c")
