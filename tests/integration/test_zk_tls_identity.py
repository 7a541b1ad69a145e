"""A client of a TLS ZooKeeper (--zk-tls) talks only to a server whose certificate
names the host it dials and serves as a server: not to a host showing the clients'
own certificate (every submitter and UI host holds one), nor to one showing a server
certificate of the same CA for another name. Either would read the digest credentials
the client sends once connected."""
import os
import socket
import ssl
import subprocess
import sys
import threading

import pytest

from streamnet.testing import ZooKeeper, zookeeper_installed

PROBE = """
import sys
from kazoo.client import KazooClient
from streamnet.runtime.control.zk import tls_options
z = KazooClient(hosts=sys.argv[1], connection_retry={"max_tries": 1}, **tls_options(sys.argv[2]))
try:
    z.start(4)
    print("connected")
except Exception as e:
    print(type(e).__name__)
z.stop()
"""


def _connects(hosts: str, tls_dir: str, env: dict | None = None) -> str:
    """kazoo with a --zk-tls directory's options, in a process of its own (a client that
    never connected keeps its socket pair): "connected" or the error's name."""
    r = subprocess.run([sys.executable, "-c", PROBE, hosts, tls_dir], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **(env or {})))
    return r.stdout.strip() or r.stderr[-500:]


class Impostor:
    """A TLS listener showing `cert`/`key`, recording whether each handshake completed."""

    def __init__(self, cert: str, key: str):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.handshakes: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(5)
            try:
                with self.ctx.wrap_socket(conn, server_side=True):
                    self.handshakes.append("completed")
            except (ssl.SSLError, OSError) as e:
                self.handshakes.append(f"failed: {e}")
                conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _other_ca(out: str) -> str:
    """A CA of its own in `out` (ca.pem, ca-key.pem), as a public or a company CA would be."""
    os.makedirs(out, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=another CA", "-days", "2",
                    "-keyout", os.path.join(out, "ca-key.pem"), "-out", os.path.join(out, "ca.pem")],
                   check=True, capture_output=True)
    return out


def _sign(tls: str, out: str, ext: str) -> tuple[str, str]:
    """A key and a certificate of the CA in `tls` (ca.pem, ca-key.pem) with extensions `ext`."""
    key, csr, cert = (os.path.join(out, n) for n in ("k.pem", "r.csr", "c.pem"))
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=impostor", "-keyout", key,
                    "-out", csr], check=True, capture_output=True)
    extfile = os.path.join(out, "ext")
    with open(extfile, "w") as f:
        f.write(ext + "\n")
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", os.path.join(tls, "ca.pem"), "-CAkey",
                    os.path.join(tls, "ca-key.pem"), "-CAcreateserial", "-days", "2", "-extfile", extfile,
                    "-out", cert], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(not zookeeper_installed(), reason="needs Debian's zookeeper package")
def test_clients_talk_to_the_ensemble_and_not_to_a_host_posing_as_it(tmp_path):
    server = ZooKeeper(tls=True).start()
    try:
        tls = server.tls_dir
        assert _connects(server.hosts, tls) == "connected"
        cases = {
            "the clients' own certificate": (os.path.join(tls, "client.pem"), os.path.join(tls, "client-key.pem")),
            "a server certificate for another name": _sign(
                tls, str(tmp_path), "subjectAltName=DNS:elsewhere.example\nextendedKeyUsage=serverAuth"),
        }
        # kazoo's own TLS connect also trusts the system's CA store: a certificate for the very
        # host dialled, from a CA the system trusts (here through SSL_CERT_FILE), passed
        other = _other_ca(str(tmp_path / "other-ca"))
        cases["a server certificate for this host from a CA the system trusts"] = _sign(
            other, str(tmp_path / "other-ca"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
        system_trusts = {"SSL_CERT_FILE": os.path.join(other, "ca.pem")}
        for case, (cert, key) in cases.items():
            impostor = Impostor(cert, key)
            try:
                outcome = _connects(f"127.0.0.1:{impostor.port}", tls, system_trusts)
            finally:
                impostor.close()
            assert outcome != "connected", case
            assert impostor.handshakes and "completed" not in impostor.handshakes, (case, impostor.handshakes)
    finally:
        server.stop()
