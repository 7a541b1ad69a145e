"""Optional TLS for tuple streams (`streamnet-worker --tls-cert --tls-key --tls-ca`):
confidentiality on networks others can read, with certificates checked both ways.

A stream still begins as HTTP on the worker's port (/hello, the upgrade with its MAC
over the secret); once the receiver has answered 101, both ends run a TLS handshake
on that connection and every frame - with its own MAC and sequence number, as without
TLS - goes inside it. So /status, /metrics and the leader's liveness probe stay plain
HTTP on the same port, where monitoring reads them, and TLS adds what the secret
cannot: nobody on the path can read the tensors.

Both ends present a certificate signed by the cluster's CA and check the other's: a
receiver refuses a sender without one (the handshake fails, the stream is closed and
counted), and a sender checks that the receiver's certificate names the host it
dialled (its advertised address: put it in the certificate's subjectAltName).
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field

from ...errors import StreamnetError


class TlsError(StreamnetError):
    """TLS files that cannot be used."""


@dataclass(frozen=True, kw_only=True)
class TlsConfig:
    """PEM files: this worker's certificate and key, and the CA that signs every worker's."""
    cert: str
    key: str
    ca: str
    server: ssl.SSLContext = field(init=False, repr=False, compare=False)
    client: ssl.SSLContext = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("cert", "key", "ca"):
            path = getattr(self, name)
            if not os.path.isfile(path):
                raise TlsError(f"--tls-{name} {path}: no such file")
        try:
            server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)   # checks the peer's name and chain
            for ctx in (server, client):
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                ctx.load_cert_chain(self.cert, self.key)
                ctx.load_verify_locations(cafile=self.ca)
        except (ssl.SSLError, OSError) as e:
            raise TlsError(f"TLS files --tls-cert {self.cert} --tls-key {self.key} --tls-ca {self.ca}: {e}") from None
        server.verify_mode = ssl.CERT_REQUIRED                  # mutual: a sender shows its certificate
        object.__setattr__(self, "server", server)
        object.__setattr__(self, "client", client)
