"""The handshake's cryptography (transport.py's docstring has the exchange): challenges,
proofs, the upgrade's MAC and the per-stream key, all from the cluster secret."""
from __future__ import annotations

import hashlib
import hmac
import os
import time

NONCE_TTL_S = 30.0
MAX_AUTH_FIELD = 256               # characters in a nonce, worker id or MAC header


class PeerAuthError(ConnectionError):
    """The peer did not prove that it holds the cluster secret."""


def clean(*values) -> bool:
    return all(isinstance(v, str) and v.isascii() and len(v) <= MAX_AUTH_FIELD for v in values)


def fields(*parts: str) -> bytes:
    """The bytes a MAC covers: each part after its length, so that no two lists of
    parts give the same bytes (joined with a separator, "a|b" + "c" and "a" + "b|c"
    did: worker ids and nonces are only checked to be short ASCII)."""
    return b"".join(b"%d:%s" % (len(b), b) for b in (p.encode() for p in parts))


class Auth:
    """What the cluster secret is used for on the data plane (transport.py's docstring)."""

    def __init__(self, secret: bytes, worker_id: str):
        if not secret:
            raise ValueError("a cluster secret is required")
        self._secret, self.worker_id = secret, worker_id
        # a key of this process's own: only the process that issued a nonce verifies it, and
        # the nonces it has taken live in its memory; one derived from the secret let a
        # stream recorded before a restart (within NONCE_TTL_S of the monotonic clock, which
        # goes on across a restart and starts again at a reboot) be played to its successor
        self._nonce_key = os.urandom(32)
        self._used: dict[str, float] = {}   # nonces streams authenticated with -> expiry

    def _mac(self, *parts: str) -> str:
        return hmac.new(self._secret, fields(*parts), hashlib.sha256).hexdigest()

    def challenge(self) -> str:
        body = f"{time.monotonic_ns() // 1_000_000:x}.{os.urandom(12).hex()}"
        return f"{body}.{hmac.new(self._nonce_key, body.encode(), hashlib.sha256).hexdigest()[:32]}"

    def hello_proof(self, nonce: str, client_nonce: str, receiver: str) -> str:
        return self._mac("hello", nonce, client_nonce, receiver)

    def check_proof(self, proof, nonce: str, client_nonce: str, receiver: str) -> bool:
        return clean(proof, nonce) and hmac.compare_digest(
            self.hello_proof(nonce, client_nonce, receiver).encode(), proof.encode())

    def sign(self, nonce: str, sender: str, receiver: str) -> str:
        return self._mac("stream", nonce, sender, receiver)

    def session_key(self, nonce: str, sender: str, receiver: str) -> bytes:
        return hmac.new(self._secret, fields("key", nonce, sender, receiver), hashlib.sha256).digest()

    def verify(self, nonce: str, sender: str, mac: str) -> str | None:
        """None if good, else the reason it is not."""
        if not clean(nonce, sender, mac):
            return "malformed authentication headers"
        body, _, tag = nonce.rpartition(".")
        good = hmac.new(self._nonce_key, body.encode(), hashlib.sha256).hexdigest()[:32]
        if not hmac.compare_digest(good.encode(), tag.encode()):
            return "unknown nonce"
        now = time.monotonic()
        expiry = int(body.partition(".")[0], 16) / 1000 + NONCE_TTL_S
        if expiry < now:
            return "expired nonce"
        for n, t in list(self._used.items()):      # in order of use: stop at the first still live
            if t >= now:
                break
            del self._used[n]
        if nonce in self._used:
            return "reused nonce"
        if not hmac.compare_digest(self.sign(nonce, sender, self.worker_id).encode(), mac.encode()):
            return "bad MAC (wrong cluster secret?)"
        self._used[nonce] = expiry     # only streams that proved the secret add here
        return None
