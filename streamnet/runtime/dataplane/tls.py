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
from ...private_file import read_private


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
        try:        # the key is held to the secret's rules: this user's, closed to everyone else
            read_private(self.key, "--tls-key")
        except StreamnetError as e:
            raise TlsError(str(e)) from None
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


def make_pki(directory: str, names: list[str], host: str = "127.0.0.1") -> dict[str, TlsConfig]:
    """A fresh CA in `directory` and, per name, a certificate it signs for `host`: the
    TlsConfig of each (tests, benchmarks, trying TLS out on one machine). Keys are
    written with mode 0600."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def issue(name: str, issuer=None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer[0].subject if issuer else subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=30))
             .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
        if issuer is not None:
            try:
                alt = x509.IPAddress(ipaddress.ip_address(host))
            except ValueError:
                alt = x509.DNSName(host)
            b = b.add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        cert = b.sign(issuer[1] if issuer else key, hashes.SHA256())
        path = os.path.join(directory, name)
        with open(path + ".pem", "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(os.open(path + ".key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        return cert, key

    os.makedirs(directory, exist_ok=True)
    ca = issue("ca")
    ca_file = os.path.join(directory, "ca.pem")
    out = {}
    for name in names:
        issue(name, ca)
        base = os.path.join(directory, name)
        out[name] = TlsConfig(cert=base + ".pem", key=base + ".key", ca=ca_file)
    return out
